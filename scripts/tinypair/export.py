"""Write the trained PyTorch pair as GGUF files in exactly the layout the pinned llama.cpp loads."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

from ggspec.catalogue.gguf_write import add_bool, add_i32_arr, add_str, add_u32, attention_keys, tokenizer_keys, \
    write_file
from ggspec.distill.export import block_tensors as _block_tensors
from tinypair.model import DFlashDraft, Target
from tinypair.tokenizer import Vocab


def start(path: Path, arch: str, name: str, **attention) -> gguf.GGUFWriter:
    """A writer with the keys every file of the scripts begins with: its name, all F32 (file type
    0) and the attention hyperparameters (`attention`: gguf_write.attention_keys' arguments)."""
    w = gguf.GGUFWriter(str(path), arch)
    add_str(w, "general.name", name)
    add_u32(w, "general.file_type", 0)
    attention_keys(w, arch, **attention)
    return w


def copy_keys(w: gguf.GGUFWriter, keys: dict) -> None:
    """Keys read from another file (name -> (value, type, array item type)), as they were."""
    for key, (value, vtype, sub) in keys.items():
        w.add_key_value(key, value, vtype, sub_type=sub)


def _numpy(t) -> np.ndarray:
    if isinstance(t, np.ndarray):  # already as the file holds it (eagle3's d2t)
        return t
    # torch [n_out, n_in] is ggml ne=[n_in, n_out]: written as is (the writer reverses shapes)
    return np.ascontiguousarray(t.detach().cpu().numpy(), dtype=np.float32)


def finish(w: gguf.GGUFWriter, tensors: list[tuple[str, object]]) -> None:
    """Write the tensors (torch ones as float32) and close."""
    write_file(w, [(name, _numpy(t)) for name, t in tensors])


def _tokenizer(w: gguf.GGUFWriter, vocab: Vocab) -> None:
    tokenizer_keys(w, tokens=vocab.tokens, token_types=vocab.token_types(), merges=vocab.merges, eos_id=vocab.eos,
                   mask_id=vocab.mask)


def write_target(path: Path, model: Target, vocab: Vocab, name: str) -> None:
    c = model.cfg
    w = start(path, "qwen3", name, n_ctx_train=c.n_ctx, n_embd=c.n_embd, n_layer=c.n_layer, n_ff=c.n_ff,
              n_head=c.n_head, n_head_kv=c.n_head_kv, head_dim=c.head_dim, rms_eps=c.eps, rope_freq_base=c.rope_base)
    _tokenizer(w, vocab)
    tensors = [("token_embd.weight", model.embed.weight)]
    for il, blk in enumerate(model.blocks):
        tensors += _block_tensors(f"blk.{il}.", blk)
    tensors += [("output_norm.weight", model.norm.weight), ("output.weight", model.head.weight)]
    finish(w, tensors)


def write_draft(path: Path, draft: DFlashDraft, vocab: Vocab, name: str) -> None:
    c, t = draft.cfg, draft.tcfg
    # dflash defaults to rope base 10000 without its key
    w = start(path, "dflash", name, n_ctx_train=t.n_ctx, n_embd=t.n_embd, n_layer=c.n_layer, n_ff=c.n_ff,
              n_head=c.n_head, n_head_kv=c.n_head_kv, head_dim=c.head_dim, rms_eps=t.eps, rope_freq_base=t.rope_base)
    add_u32(w, "dflash.block_size", c.block_size)
    add_i32_arr(w, "dflash.target_layers", c.target_layers)
    add_bool(w, "dflash.attention.causal", False)
    _tokenizer(w, vocab)
    # no token_embd / output: the draft borrows the target's through ctx_other
    tensors = [("fc.weight", draft.fc.weight), ("enc.output_norm.weight", draft.hidden_norm.weight),
               ("output_norm.weight", draft.norm.weight)]
    for il, blk in enumerate(draft.blocks):
        tensors += _block_tensors(f"blk.{il}.", blk)
    finish(w, tensors)
