"""Stage 3: the trained draft as a dflash GGUF the pinned llama.cpp loads.

Keys and tensor names are those `src/models/dflash.cpp` reads. The draft has no token embeddings
of its own (it borrows the target's through ctx_other); a reduced-vocabulary draft ships its own
head (`output.weight`, N rows) and `d2t` (int64, draft row -> target id). The target's tokenizer is
copied so the draft's vocabulary is the target's.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ggspec.distill.model import DFlashDraft
from ggspec.distill.target_file import TargetParts
from ggspec.distill.vocab import DraftVocab

OUTTYPES = ("f16", "q8_0", "f32")


def block_tensors(prefix: str, blk) -> list[tuple[str, object]]:
    a = blk.attn
    return [
        (prefix + "attn_norm.weight", blk.attn_norm.weight),
        (prefix + "attn_q.weight", a.q.weight),
        (prefix + "attn_k.weight", a.k.weight),
        (prefix + "attn_v.weight", a.v.weight),
        (prefix + "attn_output.weight", a.o.weight),
        (prefix + "attn_q_norm.weight", a.q_norm.weight),
        (prefix + "attn_k_norm.weight", a.k_norm.weight),
        (prefix + "ffn_norm.weight", blk.ffn_norm.weight),
        (prefix + "ffn_gate.weight", blk.ffn.gate.weight),
        (prefix + "ffn_up.weight", blk.ffn.up.weight),
        (prefix + "ffn_down.weight", blk.ffn.down.weight),
    ]


def tensors_of(draft: DFlashDraft) -> list[tuple[str, object]]:
    """The GGUF tensors of a draft whose scales are folded (see `exportable`)."""
    assert bool((draft.feature_scale == 1).all()), "fold the scales first"
    tensors = [("fc.weight", draft.fc.weight), ("enc.output_norm.weight", draft.hidden_norm.weight),
               ("output_norm.weight", draft.norm.weight)]
    for il, blk in enumerate(draft.blocks):
        tensors += block_tensors(f"blk.{il}.", blk)
    if draft.head is not None:
        tensors.append(("output.weight", draft.head.weight))
    return tensors


def exportable(draft: DFlashDraft, outtype: str | None = None) -> DFlashDraft:
    """A copy with its training scale folded into fc and, given an outtype, every weight rounded as
    it will be written: what llama.cpp computes, in PyTorch."""
    import copy

    import torch

    out = copy.deepcopy(draft)
    out.fold_scales()
    if outtype is not None:
        with torch.no_grad():
            for name, p in tensors_of(out):
                p.copy_(torch.from_numpy(as_written(p, outtype, name)))
    return out


def _quantizable(a: np.ndarray, outtype: str) -> bool:
    return outtype == "q8_0" and a.ndim == 2 and a.shape[1] % 32 == 0  # Q8_0 blocks of 32 along a row


# fc reads the target's raw layer inputs, which reach ~1e5 in Gemma 3: llama.cpp would round them to
# float16 (max 65504: inf) for an f16 fc and to 8 bits per block of 32 for a q8_0 one (a Gemma draft's
# logits moved by 10 % of their range), so fc is always float32 (3200 x 640: 8 MB there)
F32_ALWAYS = ("fc.weight",)


def stored(t, outtype: str, name: str = "") -> np.ndarray:
    """A parameter as written: matrices in `outtype` (bytes for q8_0), vectors (norms) and
    F32_ALWAYS float32."""
    import gguf

    a = t.detach().cpu().numpy().astype(np.float32)
    if name in F32_ALWAYS:
        return np.ascontiguousarray(a)
    if _quantizable(a, outtype):
        return gguf.quants.quantize(a, gguf.GGMLQuantizationType.Q8_0)
    return np.ascontiguousarray(a.astype(np.float16) if outtype in ("f16", "q8_0") and a.ndim == 2 else a)


def as_written(t, outtype: str, name: str = "") -> np.ndarray:
    """The float32 values llama.cpp will read back for a parameter (rounded as written)."""
    import gguf

    a = stored(t, outtype, name)
    if a.dtype == np.uint8:
        return gguf.quants.dequantize(a, gguf.GGMLQuantizationType.Q8_0).astype(np.float32)
    return a.astype(np.float32)


def write_draft(path: Path, draft: DFlashDraft, vocab: DraftVocab | None, target: TargetParts, name: str,
                outtype: str = "f16") -> None:
    import gguf
    from gguf import GGUFValueType as T

    c = draft.cfg
    draft = exportable(draft)
    w = gguf.GGUFWriter(str(path), "dflash")
    w.add_key_value("general.name", name, T.STRING)
    w.add_key_value("general.file_type", {"f32": 0, "f16": 1, "q8_0": 7}[outtype], T.UINT32)
    u32 = {"context_length": target.n_ctx_train, "embedding_length": c.n_embd, "block_count": c.n_layer,
           "feed_forward_length": c.n_ff, "attention.head_count": c.n_head, "attention.head_count_kv": c.n_head_kv,
           "attention.key_length": c.head_dim, "attention.value_length": c.head_dim, "block_size": c.block_size}
    for key, value in u32.items():
        w.add_key_value(f"dflash.{key}", int(value), T.UINT32)
    w.add_key_value("dflash.attention.layer_norm_rms_epsilon", float(c.eps), T.FLOAT32)
    w.add_key_value("dflash.rope.freq_base", float(c.rope_base), T.FLOAT32)
    if c.embed_scale != 1.0:
        w.add_key_value("dflash.embedding_scale", float(c.embed_scale), T.FLOAT32)
    w.add_key_value("dflash.target_layers", [int(x) for x in c.target_layers], T.ARRAY, sub_type=T.INT32)
    w.add_key_value("dflash.attention.causal", False, T.BOOL)
    for key, (value, vtype, sub) in target.tokenizer.items():
        if key == "tokenizer.ggml.mask_token_id":
            continue
        w.add_key_value(key, value, vtype, sub_type=sub)
    w.add_key_value("tokenizer.ggml.mask_token_id", int(target.mask_id), T.UINT32)
    for tname, t in tensors_of(draft):
        data = stored(t, outtype, tname)
        if data.dtype == np.uint8:
            w.add_tensor(tname, data, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            w.add_tensor(tname, data)
    if vocab is not None and draft.head is not None:
        w.add_tensor("d2t", np.ascontiguousarray(vocab.d2t, dtype=np.int64))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
