"""Atomic file writes: a temporary sibling, then a rename, so readers never see half a file.

They live in the native layer, the lowest one, because its build records (current.json,
build.json) are written this way too; ggspec.files builds its hash cache and users' outputs on them.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from pathlib import Path


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
