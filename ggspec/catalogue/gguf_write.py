"""Writing GGUF files as llama.cpp's converter writes them: typed keys, the hyperparameter and
tokenizer keys that several generators share, and the final write.

One home for what the tiny and dummy model writers (ggspec.catalogue.tiny, .dummy), the test
fixtures (helpers.fixtures) and the training scripts' exporters (scripts/) all write the same way.
The order of the calls is the order of the keys in the file: every function here writes its keys
in one fixed order, so the same arguments give the same bytes.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import gguf
import numpy as np
from gguf import GGUFValueType

__all__ = ["add_array", "add_bool", "add_bool_arr", "add_f32", "add_i32_arr", "add_str", "add_u32", "attention_keys",
           "end_keys", "general_keys", "qwen35_keys", "tokenizer_keys", "write_file"]


def add_u32(w: gguf.GGUFWriter, key: str, v: int) -> None:
    w.add_key_value(key, int(v), GGUFValueType.UINT32)


def add_f32(w: gguf.GGUFWriter, key: str, v: float) -> None:
    w.add_key_value(key, float(v), GGUFValueType.FLOAT32)


def add_str(w: gguf.GGUFWriter, key: str, v: str) -> None:
    w.add_key_value(key, v, GGUFValueType.STRING)


def add_bool(w: gguf.GGUFWriter, key: str, v: bool) -> None:
    w.add_key_value(key, bool(v), GGUFValueType.BOOL)


def add_array(w: gguf.GGUFWriter, key: str, v: Iterable, sub: GGUFValueType) -> None:
    w.add_key_value(key, list(v), GGUFValueType.ARRAY, sub_type=sub)


def add_i32_arr(w: gguf.GGUFWriter, key: str, v: Iterable[int]) -> None:
    add_array(w, key, [int(x) for x in v], GGUFValueType.INT32)


def add_bool_arr(w: gguf.GGUFWriter, key: str, v: Iterable[bool]) -> None:
    add_array(w, key, [bool(x) for x in v], GGUFValueType.BOOL)


def general_keys(w: gguf.GGUFWriter, name: str) -> None:
    """`general.type` and `general.name`, first in a converted file."""
    add_str(w, "general.type", "model")
    add_str(w, "general.name", name)


def end_keys(w: gguf.GGUFWriter, file_type: int) -> None:
    """The two keys the converter writes last (`file_type`: 0 = all F32, 1 = mostly F16)."""
    add_u32(w, "general.quantization_version", 2)
    add_u32(w, "general.file_type", file_type)


def attention_keys(w: gguf.GGUFWriter, arch: str, *, n_ctx_train: int, n_embd: int, n_layer: int, n_ff: int,
                   n_head: int, n_head_kv: int, head_dim: int, rms_eps: float, rope_freq_base: float) -> None:
    """The hyperparameters of an attention model (qwen3, qwen35, dflash, eagle3), in the
    converter's order. `n_layer` is the block count (MTP blocks included)."""
    add_u32(w, f"{arch}.context_length", n_ctx_train)
    add_u32(w, f"{arch}.embedding_length", n_embd)
    add_u32(w, f"{arch}.block_count", n_layer)
    add_u32(w, f"{arch}.feed_forward_length", n_ff)
    add_u32(w, f"{arch}.attention.head_count", n_head)
    add_u32(w, f"{arch}.attention.head_count_kv", n_head_kv)
    add_u32(w, f"{arch}.attention.key_length", head_dim)
    add_u32(w, f"{arch}.attention.value_length", head_dim)
    add_f32(w, f"{arch}.attention.layer_norm_rms_epsilon", rms_eps)
    add_f32(w, f"{arch}.rope.freq_base", rope_freq_base)


def qwen35_keys(w: gguf.GGUFWriter, arch: str, *, rope_sections: Sequence[int], recurrent: Sequence[bool],
                full_attention_interval: int, n_nextn: int, ssm_conv_kernel: int, ssm_state_size: int,
                ssm_group_count: int, ssm_time_step_rank: int, ssm_inner_size: int, n_expert: int = 0,
                n_expert_used: int = 0, n_ff_exp: int = 0, n_ff_shexp: int = 0) -> None:
    """qwen35 / qwen35moe's own keys after `rope.dimension_count`: M-RoPE sections, which blocks
    are recurrent, the MTP block count (when there are any), the experts (qwen35moe only) and the
    gated delta-net sizes."""
    add_i32_arr(w, f"{arch}.rope.dimension_sections", rope_sections)
    add_bool_arr(w, f"{arch}.attention.recurrent_layers", recurrent)
    add_u32(w, f"{arch}.full_attention_interval", full_attention_interval)
    if n_nextn:
        add_u32(w, f"{arch}.nextn_predict_layers", n_nextn)
    experts = {"expert_count": n_expert, "expert_used_count": n_expert_used,
               "expert_feed_forward_length": n_ff_exp, "expert_shared_feed_forward_length": n_ff_shexp}
    ssm = {"ssm.conv_kernel": ssm_conv_kernel, "ssm.state_size": ssm_state_size, "ssm.group_count": ssm_group_count,
           "ssm.time_step_rank": ssm_time_step_rank, "ssm.inner_size": ssm_inner_size}  # = state size x rank
    for key, value in ((experts if n_expert else {}) | ssm).items():
        add_u32(w, f"{arch}.{key}", value)


def tokenizer_keys(w: gguf.GGUFWriter, *, tokens: Sequence[str], token_types: Sequence[int], merges: Sequence[str],
                   eos_id: int, mask_id: int | None = None) -> None:
    """A byte-level BPE vocabulary (`gpt2` model, `qwen2` pre-tokenizer) whose end-of-text token
    is also BOS and padding; `mask_id` only where the file carries one (DFlash drafts)."""
    add_str(w, "tokenizer.ggml.model", "gpt2")
    add_str(w, "tokenizer.ggml.pre", "qwen2")
    add_array(w, "tokenizer.ggml.tokens", tokens, GGUFValueType.STRING)
    add_i32_arr(w, "tokenizer.ggml.token_type", token_types)
    # never empty: the writer drops empty arrays and llama.cpp then refuses the vocab
    add_array(w, "tokenizer.ggml.merges", merges, GGUFValueType.STRING)
    for key in ("eos", "bos", "padding"):
        add_u32(w, f"tokenizer.ggml.{key}_token_id", eos_id)
    if mask_id is not None:
        add_u32(w, "tokenizer.ggml.mask_token_id", mask_id)
    add_bool(w, "tokenizer.ggml.add_bos_token", False)
    add_bool(w, "tokenizer.ggml.add_eos_token", False)


def write_file(w: gguf.GGUFWriter, tensors: Iterable[tuple[str, np.ndarray]]) -> None:
    """Add `tensors` (in order), write the header, the keys and the tensors, and close."""
    for name, a in tensors:
        w.add_tensor(name, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
