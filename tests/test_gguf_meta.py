"""The GGUF header walk: agrees with gguf-py on every file it reads, never decodes long arrays,
and turns every malformed file into one InputError (never a traceback, never llama.cpp's abort)."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from ggspec.catalogue.tiny import KINDS, ensure_tiny_pair
from ggspec.errors import InputError
from ggspec.runtime.gguf_meta import SHORT_ARRAY, GGUFArray, read_meta


def _gguf_py_view(path):
    """gguf-py's reading of the same file (slow on real vocabularies; fine on fixtures)."""
    from gguf import GGUFReader, GGUFValueType

    reader = GGUFReader(path, "r")
    kv = {}
    for name, fld in reader.fields.items():
        if name.startswith("GGUF."):
            continue
        if fld.types[0] == GGUFValueType.ARRAY:
            if len(fld.data) > SHORT_ARRAY:
                kv[name] = ("long", len(fld.data))
            elif fld.types[1] == GGUFValueType.STRING:
                kv[name] = [bytes(fld.parts[i]).decode() for i in fld.data]
            else:
                kv[name] = [fld.parts[i].tolist()[0] for i in fld.data]
        elif fld.types[0] == GGUFValueType.STRING:
            kv[name] = bytes(fld.parts[fld.data[0]]).decode()
        else:
            kv[name] = fld.parts[fld.data[0]].tolist()[0]
    tensors = {t.name: (int(t.tensor_type), tuple(int(x) for x in t.shape)) for t in reader.tensors}
    return kv, tensors


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("role", ["target", "draft"])
def test_header_walk_agrees_with_gguf_py(kind, role, fixture_dir):
    path = getattr(ensure_tiny_pair(fixture_dir, kind), role)
    meta = read_meta(path)
    kv, tensors = _gguf_py_view(path)
    ours = {k: (("long", len(v)) if isinstance(v, GGUFArray) else v) for k, v in meta.kv.items()}
    assert ours.keys() == kv.keys()
    for key, value in kv.items():
        if isinstance(value, float):
            assert ours[key] == pytest.approx(value, rel=1e-7), key
        else:
            assert ours[key] == value, key
    assert {t.name: (t.ggml_type, t.shape) for t in meta.tensor_info} == tensors
    assert meta.n_vocab == len(meta.kv["tokenizer.ggml.tokens"]) > 0


def test_long_arrays_are_not_decoded(fixture_dir):
    meta = read_meta(ensure_tiny_pair(fixture_dir, "dense").target)
    assert len(meta.kv["tokenizer.ggml.tokens"]) == 512 <= SHORT_ARRAY  # fixtures: decoded
    # a file with a long numeric and a long string array: both kept as (type, length)
    import gguf

    path = fixture_dir / "long-arrays.gguf"
    w = gguf.GGUFWriter(str(path), "qwen3")
    w.add_key_value("tokenizer.ggml.tokens", [f"t{i}" for i in range(5000)], gguf.GGUFValueType.ARRAY,
                    sub_type=gguf.GGUFValueType.STRING)
    w.add_key_value("tokenizer.ggml.scores", [0.5] * 5000, gguf.GGUFValueType.ARRAY, sub_type=gguf.GGUFValueType.FLOAT32)
    w.add_key_value("after", 7, gguf.GGUFValueType.UINT32)
    w.add_tensor("x", np.zeros(4, dtype=np.float32))
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    meta = read_meta(path)
    assert meta.kv["tokenizer.ggml.tokens"] == GGUFArray(8, 5000) and meta.n_vocab == 5000
    assert meta.kv["tokenizer.ggml.scores"] == GGUFArray(6, 5000)
    assert meta.get("after") == 7 and meta.tensors == {"x"}


def test_every_truncation_is_one_input_error(fixture_dir, tmp_path):
    data = ensure_tiny_pair(fixture_dir, "dense").draft.read_bytes()
    header_end = 0
    for cut in sorted({0, 3, 4, 8, 23, 24, 40, 100, 1000, 5000, 20000}):
        path = tmp_path / f"cut{cut}.gguf"
        path.write_bytes(data[:cut])
        try:
            read_meta(path, "draft")
        except InputError as exc:
            assert str(exc).startswith("draft file ") and str(path) in str(exc)
        else:
            header_end = max(header_end, cut)  # the header fits: llama.cpp refuses the missing data
    assert header_end <= 20000


def test_corrupt_counts_and_types_are_input_errors(fixture_dir, tmp_path):
    data = bytearray(ensure_tiny_pair(fixture_dir, "dense").target.read_bytes())
    cases = {
        "kv-count": (16, struct.pack("<Q", 2**40)),  # n_kv far beyond the file
        "version": (4, struct.pack("<I", 1)),        # GGUF v1: not read by llama.cpp either
        "value-type": (None, None),
    }
    # the first key's value type: after magic, version, counts (24 bytes) and the key string
    key_len = struct.unpack_from("<Q", data, 24)[0]
    cases["value-type"] = (24 + 8 + key_len, struct.pack("<I", 99))
    for name, (offset, patch) in cases.items():
        bad = bytearray(data)
        bad[offset:offset + len(patch)] = patch
        path = tmp_path / f"{name}.gguf"
        path.write_bytes(bytes(bad))
        with pytest.raises(InputError, match="target file"):
            read_meta(path, "target")


def test_metadata_is_read_once_per_file(fixture_dir, monkeypatch):
    import ggspec.runtime.gguf_meta as gm

    path = ensure_tiny_pair(fixture_dir, "dense").target
    read_meta(path)
    calls = []
    monkeypatch.setattr(gm, "_walk", lambda buf: calls.append(1) or (_ for _ in ()).throw(AssertionError))
    assert read_meta(path, "target").path == path and not calls  # cached by path, size and mtime
