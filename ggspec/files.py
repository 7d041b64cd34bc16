"""Small file helpers shared by the catalog, the registry pulls, the fixtures and the benchmarks."""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from collections.abc import Callable
from pathlib import Path

from ggspec.native import paths


def file_sha256(path: Path, on_bytes: Callable[[int], None] | None = None) -> str:
    """The file's sha256; `on_bytes(n)` is told of every chunk read (for progress bars)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
            if on_bytes is not None:
                on_bytes(len(chunk))
    return h.hexdigest()


def _hash_cache() -> Path:
    return paths.ggspec_home() / "hashes.json"


def _cache_key(path: Path) -> str:
    st = path.stat()
    return f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}"


def _load_cache() -> dict[str, str]:
    try:
        return json.loads(_hash_cache().read_text())
    except (OSError, ValueError):
        return {}


def remember_sha256(path: Path, digest: str) -> None:
    """Record a digest computed while writing the file (so nobody hashes it again)."""
    cache = _load_cache()
    cache[_cache_key(path)] = digest
    try:
        atomic_write(_hash_cache(), lambda tmp: tmp.write_text(json.dumps(cache, indent=1)))
    except OSError:
        pass  # an unwritable cache only costs a hash next time


def cached_sha256(path: Path, on_bytes: Callable[[int], None] | None = None) -> str:
    """The file's sha256, cached by (path, size, mtime) in `$GGSPEC_HOME/hashes.json`: hashing a
    real model takes about a second per 300 MB, too slow to repeat on every `run --pair`."""
    known = _load_cache().get(_cache_key(path))
    if known is not None:
        return known
    digest = file_sha256(path, on_bytes)
    remember_sha256(path, digest)
    return digest


def temp_sibling(path: Path) -> Path:
    """A unique temporary name in the same directory (same file system: os.replace is atomic)."""
    return path.parent / f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"


def atomic_write(path: Path, build: Callable[[Path], None]) -> Path:
    """Write via a temp file in the same directory, then rename: readers never see half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_sibling(path)  # not mkstemp: its 0600 mode would stick to the final file
    try:
        build(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path
