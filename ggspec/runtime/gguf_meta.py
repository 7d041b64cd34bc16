"""Read a GGUF file's metadata with the `gguf` package, before llama.cpp ever sees it.

llama.cpp aborts the process on many malformed or mismatched models, so everything ggspec can
check up front (is it GGUF at all, which architecture, hidden size, vocabulary, DFlash keys) is
read here first.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ggspec.errors import InputError

GGUF_MAGIC = b"GGUF"


@dataclass(frozen=True)
class GGUFMeta:
    path: Path
    arch: str
    n_embd: int
    n_layer: int
    n_vocab: int
    kv: dict[str, Any] = field(repr=False)
    tensors: frozenset[str] = field(default=frozenset(), repr=False)

    def get(self, key: str, default: Any = None) -> Any:
        return self.kv.get(key, default)

    def arch_key(self, suffix: str, default: Any = None) -> Any:
        return self.kv.get(f"{self.arch}.{suffix}", default)


def _field_value(reader_field) -> Any:
    """Decode one GGUFReader field into a Python scalar, string or list."""
    from gguf import GGUFValueType  # noqa: PLC0415

    types = reader_field.types
    if not types:
        return None
    if types[0] == GGUFValueType.ARRAY:
        if len(types) > 1 and types[1] == GGUFValueType.STRING:
            return [bytes(reader_field.parts[i]).decode("utf-8", "replace") for i in reader_field.data]
        return [reader_field.parts[i].tolist()[0] for i in reader_field.data]
    if types[0] == GGUFValueType.STRING:
        return bytes(reader_field.parts[reader_field.data[0]]).decode("utf-8", "replace")
    value = reader_field.parts[reader_field.data[0]]
    return value.tolist()[0] if isinstance(value, np.ndarray) else value


def read_meta(path: str | Path, what: str = "model") -> GGUFMeta:
    """Validated metadata of a GGUF file; `what` names it in error messages ("target", "draft")."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{what} file not found: {path}")
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != GGUF_MAGIC:
        raise InputError(f"{what} file is not a GGUF model: {path}")
    from gguf import GGUFReader  # noqa: PLC0415  (import is slow; only when needed)

    try:
        reader = GGUFReader(path, "r")
    except Exception as exc:  # the reader raises assorted errors on truncated files
        raise InputError(f"{what} file is not a readable GGUF model ({exc}): {path}") from None
    kv: dict[str, Any] = {}
    for name, fld in reader.fields.items():
        if name.startswith("GGUF.") or name == "tokenizer.ggml.merges":
            continue  # skip the bulky/internal fields; tokens are kept for the vocab size
        try:
            kv[name] = _field_value(fld)
        except Exception:  # an exotic field type must not stop validation
            continue
    arch = kv.get("general.architecture")
    if not isinstance(arch, str):
        raise InputError(f"{what} file has no general.architecture: {path}")
    tokens = kv.pop("tokenizer.ggml.tokens", None)
    n_vocab = len(tokens) if tokens is not None else int(kv.get(f"{arch}.vocab_size", 0))
    return GGUFMeta(
        path=path,
        arch=arch,
        n_embd=int(kv.get(f"{arch}.embedding_length", 0)),
        n_layer=int(kv.get(f"{arch}.block_count", 0)),
        n_vocab=n_vocab,
        kv=kv,
        tensors=frozenset(t.name for t in reader.tensors),
    )
