"""Provenance carried by every benchmark row: build, patches, model hashes, machine."""

from __future__ import annotations

import json
import os
import platform
from datetime import datetime, timezone
from pathlib import Path

from ggspec.fixtures.tiny import file_sha256 as sha256_of
from ggspec.native import paths
from ggspec.native.bindings import current_build


def file_sha256(path: Path) -> str:
    """sha256 of a model file, cached by (path, size, mtime): hashing 20 GB takes a minute."""
    st = path.stat()
    cache_file = paths.ggspec_home() / "hashes.json"
    try:
        cache = json.loads(cache_file.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        cache = {}
    key = f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}"
    if key not in cache:
        cache[key] = sha256_of(path)
        cache_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache_file.with_name(f"hashes.json.{os.getpid()}")
        tmp.write_text(json.dumps(cache, indent=1))
        os.replace(tmp, cache_file)
    return cache[key]


def machine() -> str:
    """One line: CPU model, cores, memory, OS (no GPU is used by these builds unless built for one)."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = ""
    try:
        kib = int(Path("/proc/meminfo").read_text().split("MemTotal:")[1].split()[0])
        mem = f", {kib / 2**20:.0f} GiB"
    except (OSError, IndexError, ValueError):
        pass
    return f"{cpu}, {os.cpu_count()} cores{mem}, {platform.system()} {platform.release()}"


def collect(target: Path, draft: Path, threads: int) -> dict:
    info = current_build()
    return {
        "build": info.key,
        "build_options": info.options,
        "patches": info.patches,
        "target": str(target),
        "target_sha256": file_sha256(target),
        "draft": str(draft),
        "draft_sha256": file_sha256(draft),
        "machine": machine(),
        "threads": threads,
        "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
