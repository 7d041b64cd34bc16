"""A GGUF with metadata keys replaced, added or deleted, tensors and data copied byte for byte
(tiny fixtures only: v3, little-endian, default alignment)."""

from __future__ import annotations

import struct
from pathlib import Path

_FMT = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STR, _ARR = 8, 9
_TYPES = {"u8": 0, "i8": 1, "u32": 4, "i32": 5, "f32": 6, "bool": 7, "str": 8, "u64": 10}


def _skip_value(buf: bytes, pos: int, vtype: int) -> int:
    if vtype in _FMT:
        return pos + struct.calcsize(_FMT[vtype])
    if vtype == _STR:
        return pos + 8 + struct.unpack_from("<Q", buf, pos)[0]
    elem, n = struct.unpack_from("<IQ", buf, pos)
    pos += 12
    if elem in _FMT:
        return pos + n * struct.calcsize(_FMT[elem])
    for _ in range(n):
        pos = _skip_value(buf, pos, elem)
    return pos


def _encode(vtype: int, value, elem: int | None = None) -> bytes:
    if vtype in _FMT:
        return struct.pack("<" + _FMT[vtype], value)
    if vtype == _STR:
        raw = value.encode()
        return struct.pack("<Q", len(raw)) + raw
    return struct.pack("<IQ", elem, len(value)) + b"".join(_encode(elem, v) for v in value)


def _kv_bytes(key: str, change) -> bytes:
    k = key.encode()
    head = struct.pack("<Q", len(k)) + k
    if change[0] == "arr":
        return head + struct.pack("<I", _ARR) + _encode(_ARR, change[2], _TYPES[change[1]])
    return head + struct.pack("<I", _TYPES[change[0]]) + _encode(_TYPES[change[0]], change[1])


def rewrite_gguf(src: Path, dst: Path, changes: dict) -> Path:
    """Copy a GGUF (v3, little-endian, default alignment) with metadata keys replaced, added or
    deleted: changes = {key: None | (type, value) | ("arr", elem_type, [values])}."""
    buf = src.read_bytes()
    _, _, n_tensors, n_kv = struct.unpack_from("<4sIQQ", buf, 0)
    pos, kvs = 24, []
    for _ in range(n_kv):
        start = pos
        klen = struct.unpack_from("<Q", buf, pos)[0]
        key = buf[pos + 8:pos + 8 + klen].decode()
        vtype = struct.unpack_from("<I", buf, pos + 8 + klen)[0]
        pos = _skip_value(buf, pos + 12 + klen, vtype)
        kvs.append((key, buf[start:pos]))
    infos_start = pos
    for _ in range(n_tensors):
        pos += 8 + struct.unpack_from("<Q", buf, pos)[0]
        pos += 4 + 8 * struct.unpack_from("<I", buf, pos)[0] + 4 + 8
    align = 32
    data = buf[-(-pos // align) * align:]
    out = [raw if key not in changes else _kv_bytes(key, changes[key])
           for key, raw in kvs if not (key in changes and changes[key] is None)]
    known = {key for key, _ in kvs}
    out += [_kv_bytes(key, ch) for key, ch in changes.items() if key not in known and ch is not None]
    header = struct.pack("<4sIQQ", b"GGUF", 3, n_tensors, len(out)) + b"".join(out) + buf[infos_start:pos]
    dst.write_bytes(header + b"\0" * (-len(header) % align) + data)
    return dst
