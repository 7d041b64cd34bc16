"""What the draft needs from the target's GGUF file: its token embeddings and output head
(dequantized with `gguf`), hyperparameters, and its tokenizer to copy into the draft.

gguf-py's reader builds Python objects for every vocabulary entry (10-25 s for a 262k
vocabulary), so a file is read once per distill run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ggspec.errors import InputError

MASK_NAMES = ("<mask>", "<|mask|>", "[mask]", "<|MASK|>", "[MASK]", "<MASK>")


@dataclass
class TargetParts:
    path: Path
    arch: str
    n_embd: int
    n_vocab: int
    n_ctx_train: int
    rope_base: float
    eps: float
    mask_id: int
    embed: np.ndarray  # [n_vocab, n_embd] float32: the target's token embeddings (what the draft reads)
    head: np.ndarray  # [n_vocab, n_embd] float32: the output head (tied: the embeddings)
    tokenizer: dict[str, tuple[Any, Any, Any]] = field(repr=False)  # key -> (value, type, sub_type)

    @property
    def embed_scale(self) -> float:
        """A block-input scale that brings the embedding rows to unit RMS (Gemma keeps tiny rows and
        scales them by sqrt(n_embd) in its graph; other families are near 1 already)."""
        rms = float(np.sqrt(np.mean(self.embed[: min(len(self.embed), 50_000)].astype(np.float64) ** 2)))
        return 1.0 if rms == 0 else float(2 ** (round(math.log2(1.0 / rms) * 4) / 4))  # a tidy value


def _tensor(reader, name: str):
    for t in reader.tensors:
        if t.name == name:
            return t
    return None


def _dequant(t) -> np.ndarray:
    import gguf

    return np.array(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32)  # a writable copy


def _field_value(f) -> tuple[Any, Any, Any]:
    from gguf import GGUFValueType

    vtype = f.types[0]
    if vtype == GGUFValueType.ARRAY:
        sub = f.types[-1]
        if sub == GGUFValueType.STRING:
            value = [bytes(f.parts[i]).decode("utf-8", errors="surrogateescape") for i in f.data]
        else:
            value = [f.parts[i].tolist()[0] for i in f.data] if len(f.data) < 1024 else \
                np.concatenate([f.parts[i] for i in f.data]).tolist()
        return value, vtype, sub
    if vtype == GGUFValueType.STRING:
        return bytes(f.parts[f.data[0]]).decode("utf-8", errors="surrogateescape"), vtype, None
    return f.parts[f.data[0]].tolist()[0], vtype, None


def _mask_id(tokenizer: dict, n_vocab: int) -> int:
    """The target's own mask token, else a token spelled like one; DFlash needs one."""
    if "tokenizer.ggml.mask_token_id" in tokenizer:
        return int(tokenizer["tokenizer.ggml.mask_token_id"][0])
    tokens = tokenizer["tokenizer.ggml.tokens"][0]
    for name in MASK_NAMES:
        if name in tokens:
            return tokens.index(name)
    if "tokenizer.ggml.padding_token_id" in tokenizer:  # never a real continuation
        return int(tokenizer["tokenizer.ggml.padding_token_id"][0])
    raise InputError("the target's vocabulary has no mask token (nor <mask> / a padding token) for the "
                     "draft's block", field="target")


def read_target(path: Path) -> TargetParts:
    import gguf

    reader = gguf.GGUFReader(str(path))
    fields = reader.fields
    arch = _field_value(fields["general.architecture"])[0]

    def key(name: str, default=None):
        f = fields.get(f"{arch}.{name}")
        return default if f is None else _field_value(f)[0]

    embd_t = _tensor(reader, "token_embd.weight")
    if embd_t is None:
        raise InputError(f"{path}: the target has no token_embd.weight", field="target")
    embed = _dequant(embd_t)
    head_t = _tensor(reader, "output.weight")
    head = embed if head_t is None else _dequant(head_t)
    tokenizer = {name: _field_value(f) for name, f in fields.items() if name.startswith("tokenizer.")}
    n_vocab = len(tokenizer["tokenizer.ggml.tokens"][0])
    return TargetParts(
        path=Path(path), arch=arch, n_embd=int(embed.shape[1]), n_vocab=n_vocab,
        n_ctx_train=int(key("context_length", 4096)), rope_base=float(key("rope.freq_base", 10000.0)),
        eps=float(key("attention.layer_norm_rms_epsilon", 1e-6)), mask_id=_mask_id(tokenizer, n_vocab),
        embed=embed, head=head, tokenizer=tokenizer,
    )
