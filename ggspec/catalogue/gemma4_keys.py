"""The metadata keys llama.cpp's converter writes for Gemma 4 files (target and MTP assistant).

Shared by the real-shape dummy models (`ggspec models make dummy-gemma-4-e2b`, catalogue.dummy)
and the tiny converter-shaped test pair (helpers.fixtures.gemma4): both must carry exactly what
`Gemma4Model.set_gguf_parameters` writes, in its order, or llama.cpp reads another model.
"""

from __future__ import annotations

import gguf
from gguf import GGUFValueType

from ggspec.catalogue.gguf_write import add_f32, add_u32


def write_gemma4_keys(w: gguf.GGUFWriter, arch: str, *, n_layer: int, n_ctx_train: int, n_embd: int,
                      n_ff: int | list[int], n_head: int, n_head_kv: int, rms_eps: float, head_dim_full: int,
                      head_dim_swa: int, rope_freq_base: float, rope_freq_base_swa: float,
                      final_softcap: float | None, sliding_window: int, sliding: list[bool], shared_kv_layers: int,
                      n_embd_out: int = 0) -> None:
    """What Gemma3Model / Gemma4Model(.set_gguf_parameters) write, in their order, and the
    assistant's two more keys (`n_embd_out`: the target's hidden size)."""
    a = arch
    add_u32(w, f"{a}.block_count", n_layer)
    add_u32(w, f"{a}.context_length", n_ctx_train)
    add_u32(w, f"{a}.embedding_length", n_embd)
    if isinstance(n_ff, list):  # use_double_wide_mlp: one width per layer
        w.add_key_value(f"{a}.feed_forward_length", n_ff, GGUFValueType.ARRAY, sub_type=GGUFValueType.UINT32)
    else:
        add_u32(w, f"{a}.feed_forward_length", n_ff)
    add_u32(w, f"{a}.attention.head_count", n_head)
    add_f32(w, f"{a}.attention.layer_norm_rms_epsilon", rms_eps)
    add_u32(w, f"{a}.attention.key_length", head_dim_full)
    add_u32(w, f"{a}.attention.value_length", head_dim_full)
    add_f32(w, f"{a}.rope.freq_base", rope_freq_base)
    if final_softcap:
        add_f32(w, f"{a}.final_logit_softcapping", final_softcap)
    add_u32(w, f"{a}.attention.sliding_window", sliding_window)
    add_u32(w, f"{a}.attention.head_count_kv", n_head_kv)
    add_f32(w, f"{a}.rope.freq_base_swa", rope_freq_base_swa)
    add_u32(w, f"{a}.attention.shared_kv_layers", shared_kv_layers)
    add_u32(w, f"{a}.embedding_length_per_layer_input", 0)  # no per-layer embeddings
    w.add_key_value(f"{a}.attention.sliding_window_pattern", list(sliding), GGUFValueType.ARRAY,
                    sub_type=GGUFValueType.BOOL)
    add_u32(w, f"{a}.attention.key_length_swa", head_dim_swa)
    add_u32(w, f"{a}.attention.value_length_swa", head_dim_swa)
    add_u32(w, f"{a}.rope.dimension_count", head_dim_full)  # proportional RoPE: rope_freqs mask the rest
    add_u32(w, f"{a}.rope.dimension_count_swa", head_dim_swa)
    if n_embd_out:
        add_u32(w, f"{a}.embedding_length_out", n_embd_out)
        add_u32(w, f"{a}.nextn_predict_layers", n_layer)
