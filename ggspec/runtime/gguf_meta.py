"""Read a GGUF file's metadata before llama.cpp ever sees it: one header walk, once per file.

llama.cpp aborts the process on many malformed or mismatched models, so everything ggspec can
check up front (is it GGUF at all, which architecture, hidden size, vocabulary, DFlash keys) is
read here first.

Why not gguf-py's `GGUFReader`: it builds Python objects for every entry of every array, and real
vocabularies have 150k-260k tokens (11 s for Gemma 3's 262k on this machine). This walk reads the
header with `struct` over an mmap, keeps scalars, strings and short arrays, and for long arrays
keeps only their element type and length: the vocabulary size is the length of
`tokenizer.ggml.tokens`. A string array still has to be stepped over entry by entry (each string
carries its own length), which costs ~0.1 s for a 262k vocabulary. Results are cached per file
(path, size, mtime), so loading a pair reads each file once.
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

from ggspec.errors import InputError
from ggspec.values import is_number

GGUF_MAGIC = b"GGUF"
SHORT_ARRAY = 1024  # arrays up to this length are decoded; longer ones keep type and length only

# GGUF value types (gguf.h `enum gguf_type`) -> struct format of one element
_SCALAR = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9


@dataclass(frozen=True)
class GGUFArray:
    """A long array whose elements were not decoded (a vocabulary, its scores, merges...)."""

    elem_type: int
    count: int

    def __len__(self) -> int:
        return self.count


@dataclass(frozen=True)
class TensorInfo:
    name: str
    ggml_type: int
    shape: tuple[int, ...]  # ggml order: innermost dimension first


@dataclass(frozen=True)
class GGUFMeta:
    path: Path
    arch: str
    n_embd: int
    n_layer: int  # block_count: counts an MTP block where the file has one (see n_layer_main)
    n_vocab: int
    kv: dict[str, Any] = field(repr=False)
    tensors: frozenset[str] = field(default=frozenset(), repr=False)
    tensor_info: tuple[TensorInfo, ...] = field(default=(), repr=False)

    def get(self, key: str, default: Any = None) -> Any:
        return self.kv.get(key, default)

    def arch_key(self, suffix: str, default: Any = None) -> Any:
        return self.kv.get(f"{self.arch}.{suffix}", default)

    @property
    def n_nextn(self) -> int:
        """Trailing multi-token-prediction (MTP / nextn) blocks counted in block_count."""
        value = self.arch_key("nextn_predict_layers", 0)
        return int(value) if isinstance(value, int) else 0

    @property
    def n_layer_main(self) -> int:
        """The layers a normal forward pass runs: block_count without the MTP blocks."""
        return self.n_layer - self.n_nextn


class _Truncated(Exception):
    pass


class _Walker:
    """Sequential little- or big-endian reads over a buffer, with bounds checks."""

    def __init__(self, buf, endian: str) -> None:
        self.buf, self.end, self.pos, self.e = buf, len(buf), 0, endian

    def take(self, fmt: str):
        size = struct.calcsize(fmt)
        if self.pos + size > self.end:
            raise _Truncated
        value = struct.unpack_from(self.e + fmt, self.buf, self.pos)[0]
        self.pos += size
        return value

    def string(self) -> str:
        n = self.take("Q")
        if self.pos + n > self.end:
            raise _Truncated
        s = self.buf[self.pos:self.pos + n].decode("utf-8", "replace")
        self.pos += n
        return s

    def skip_strings(self, count: int) -> None:
        """Step over `count` length-prefixed strings (the hot loop: 262k entries for Gemma 3)."""
        unpack, buf, pos = struct.Struct(self.e + "Q").unpack_from, self.buf, self.pos
        try:
            for _ in range(count):
                pos += 8 + unpack(buf, pos)[0]
        except struct.error:  # a length prefix past the end of the file
            raise _Truncated from None
        if pos > self.end:
            raise _Truncated
        self.pos = pos

    def value(self, vtype: int) -> Any:
        if vtype in _SCALAR:
            return self.take(_SCALAR[vtype])
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            return self.array()
        raise ValueError(f"unknown value type {vtype}")

    def array(self) -> Any:
        elem, count = self.take("I"), self.take("Q")
        if count <= SHORT_ARRAY:
            return [self.value(elem) for _ in range(count)]
        if elem == _STRING:
            self.skip_strings(count)
        elif elem in _SCALAR:
            size = struct.calcsize(_SCALAR[elem]) * count
            if self.pos + size > self.end:
                raise _Truncated
            self.pos += size
        else:  # arrays of arrays: never written by llama.cpp's converter
            raise ValueError(f"array of type {elem} with {count} entries")
        return GGUFArray(elem, count)


def _walk(buf) -> tuple[dict[str, Any], tuple[TensorInfo, ...]]:
    if bytes(buf[:4]) != GGUF_MAGIC:
        raise ValueError("not a GGUF file")
    # the version is a small number: whichever byte order reads it as one is the file's
    endian = "<" if struct.unpack_from("<I", buf, 4)[0] < 0x10000 else ">"
    w = _Walker(buf, endian)
    w.pos = 4
    version = w.take("I")
    if version < 2:
        raise ValueError(f"GGUF version {version} is too old (llama.cpp reads 2 and 3)")
    n_tensors, n_kv = w.take("Q"), w.take("Q")
    kv: dict[str, Any] = {}
    for _ in range(n_kv):
        key = w.string()
        kv[key] = w.value(w.take("I"))
    tensors = []
    for _ in range(n_tensors):
        name = w.string()
        n_dims = w.take("I")
        if n_dims > 8:
            raise ValueError(f"tensor {name} has {n_dims} dimensions")
        shape = tuple(w.take("Q") for _ in range(n_dims))
        ggml_type = w.take("I")
        w.take("Q")  # data offset
        tensors.append(TensorInfo(name, ggml_type, shape))
    return kv, tuple(tensors)


def _int(kv: dict[str, Any], key: str) -> int:
    value = kv.get(key, 0)
    return int(value) if is_number(value) else 0


class _BadFile(Exception):
    """Why a file is unusable, worded to follow "<what> file "."""


@lru_cache(maxsize=32)
def _read_cached(path: Path, size: int, mtime_ns: int) -> GGUFMeta:
    with open(path, "rb") as f:
        if size < 24 or f.read(4) != GGUF_MAGIC:
            raise _BadFile("is not a GGUF model")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            try:
                kv, tensors = _walk(mm)
            except _Truncated:
                raise _BadFile("is truncated (its GGUF header runs past the end)") from None
            except (ValueError, UnicodeDecodeError, struct.error) as exc:
                raise _BadFile(f"is not a readable GGUF model ({exc})") from None
    arch = kv.get("general.architecture")
    if not isinstance(arch, str) or not arch:
        raise _BadFile("has no general.architecture")
    tokens = kv.get("tokenizer.ggml.tokens")
    n_vocab = len(tokens) if isinstance(tokens, (list, GGUFArray)) else _int(kv, f"{arch}.vocab_size")
    return GGUFMeta(
        path=path,
        arch=arch,
        n_embd=_int(kv, f"{arch}.embedding_length"),
        n_layer=_int(kv, f"{arch}.block_count"),
        n_vocab=n_vocab,
        kv=kv,
        tensors=frozenset(t.name for t in tensors),
        tensor_info=tensors,
    )


def read_meta(path: str | Path, what: str = "model") -> GGUFMeta:
    """Validated metadata of a GGUF file; `what` names it in error messages ("target", "draft")."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{what} file not found: {path}")
    st = os.stat(path)
    try:
        meta = _read_cached(path.resolve(), st.st_size, st.st_mtime_ns)
    except _BadFile as exc:
        raise InputError(f"{what} file {exc}: {path}") from None
    return meta if meta.path == path else replace(meta, path=path)  # messages name it as given
