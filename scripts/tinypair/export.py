"""Write the trained PyTorch pair as GGUF files in exactly the layout the pinned llama.cpp loads."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
from gguf import GGUFValueType

from ggspec.distill.export import block_tensors as _block_tensors
from tinypair.model import DFlashDraft, Target
from tinypair.tokenizer import Vocab


def _u32(w: gguf.GGUFWriter, key: str, v: int) -> None:
    w.add_key_value(key, int(v), GGUFValueType.UINT32)


def _f32(w: gguf.GGUFWriter, key: str, v: float) -> None:
    w.add_key_value(key, float(v), GGUFValueType.FLOAT32)


def _tokenizer(w: gguf.GGUFWriter, vocab: Vocab) -> None:
    w.add_key_value("tokenizer.ggml.model", "gpt2", GGUFValueType.STRING)
    w.add_key_value("tokenizer.ggml.pre", "qwen2", GGUFValueType.STRING)
    w.add_key_value("tokenizer.ggml.tokens", vocab.tokens, GGUFValueType.ARRAY, sub_type=GGUFValueType.STRING)
    w.add_key_value("tokenizer.ggml.token_type", vocab.token_types(), GGUFValueType.ARRAY,
                    sub_type=GGUFValueType.INT32)
    w.add_key_value("tokenizer.ggml.merges", vocab.merges, GGUFValueType.ARRAY, sub_type=GGUFValueType.STRING)
    for key in ("eos", "bos", "padding"):
        _u32(w, f"tokenizer.ggml.{key}_token_id", vocab.eos)
    _u32(w, "tokenizer.ggml.mask_token_id", vocab.mask)
    w.add_key_value("tokenizer.ggml.add_bos_token", False, GGUFValueType.BOOL)
    w.add_key_value("tokenizer.ggml.add_eos_token", False, GGUFValueType.BOOL)


def _attention_keys(w, arch: str, n_ctx: int, n_embd: int, n_layer: int, n_ff: int, n_head: int,
                    n_head_kv: int, head_dim: int, eps: float, rope_base: float) -> None:
    _u32(w, f"{arch}.context_length", n_ctx)
    _u32(w, f"{arch}.embedding_length", n_embd)
    _u32(w, f"{arch}.block_count", n_layer)
    _u32(w, f"{arch}.feed_forward_length", n_ff)
    _u32(w, f"{arch}.attention.head_count", n_head)
    _u32(w, f"{arch}.attention.head_count_kv", n_head_kv)
    _u32(w, f"{arch}.attention.key_length", head_dim)
    _u32(w, f"{arch}.attention.value_length", head_dim)
    _f32(w, f"{arch}.attention.layer_norm_rms_epsilon", eps)
    _f32(w, f"{arch}.rope.freq_base", rope_base)  # dflash defaults to 10000 otherwise


def _write(w: gguf.GGUFWriter, tensors: list[tuple[str, object]]) -> None:
    # torch [n_out, n_in] is ggml ne=[n_in, n_out]: written as is (the writer reverses shapes)
    for name, t in tensors:
        w.add_tensor(name, np.ascontiguousarray(t.detach().cpu().numpy(), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_target(path: Path, model: Target, vocab: Vocab, name: str) -> None:
    c = model.cfg
    w = gguf.GGUFWriter(str(path), "qwen3")
    w.add_key_value("general.name", name, GGUFValueType.STRING)
    _u32(w, "general.file_type", 0)
    _attention_keys(w, "qwen3", c.n_ctx, c.n_embd, c.n_layer, c.n_ff, c.n_head, c.n_head_kv,
                    c.head_dim, c.eps, c.rope_base)
    _tokenizer(w, vocab)
    tensors = [("token_embd.weight", model.embed.weight)]
    for il, blk in enumerate(model.blocks):
        tensors += _block_tensors(f"blk.{il}.", blk)
    tensors += [("output_norm.weight", model.norm.weight), ("output.weight", model.head.weight)]
    _write(w, tensors)


def write_draft(path: Path, draft: DFlashDraft, vocab: Vocab, name: str) -> None:
    c, t = draft.cfg, draft.tcfg
    w = gguf.GGUFWriter(str(path), "dflash")
    w.add_key_value("general.name", name, GGUFValueType.STRING)
    _u32(w, "general.file_type", 0)
    _attention_keys(w, "dflash", t.n_ctx, t.n_embd, c.n_layer, c.n_ff, c.n_head, c.n_head_kv,
                    c.head_dim, t.eps, t.rope_base)
    _u32(w, "dflash.block_size", c.block_size)
    w.add_key_value("dflash.target_layers", list(c.target_layers), GGUFValueType.ARRAY,
                    sub_type=GGUFValueType.INT32)
    w.add_key_value("dflash.attention.causal", False, GGUFValueType.BOOL)
    _tokenizer(w, vocab)
    # no token_embd / output: the draft borrows the target's through ctx_other
    tensors = [("fc.weight", draft.fc.weight), ("enc.output_norm.weight", draft.hidden_norm.weight),
               ("output_norm.weight", draft.norm.weight)]
    for il, blk in enumerate(draft.blocks):
        tensors += _block_tensors(f"blk.{il}.", blk)
    _write(w, tensors)
