"""Provenance carried by every benchmark row: build, patches, model hashes, machine."""

from __future__ import annotations

import os
import platform
from datetime import datetime, timezone
from pathlib import Path

from ggspec.files import cached_sha256 as file_sha256
from ggspec.files import portable_path
from ggspec.native.bindings import current_build
from ggspec.runtime.devices import cpu_name


def machine() -> str:
    """One line: CPU model, cores, memory, OS (no GPU is used by these builds unless built for one)."""
    cpu = cpu_name()
    mem = ""
    try:
        kib = int(Path("/proc/meminfo").read_text().split("MemTotal:")[1].split()[0])
        mem = f", {kib / 2**20:.0f} GiB"
    except (OSError, IndexError, ValueError):
        pass
    return f"{cpu}, {os.cpu_count()} cores{mem}, {platform.system()} {platform.release()}"


def collect(target: Path, draft: Path | None, threads: int) -> dict:
    """`draft` None: a target-only benchmark ("draft" is "" and "draft_sha256" null)."""
    info = current_build()
    return {
        "build": info.key,
        "build_options": info.options,
        "patches": info.patches,
        "target": portable_path(target),  # (repository- or $GGSPEC_HOME-relative where it can be)
        "target_sha256": file_sha256(target),
        "draft": portable_path(draft) if draft else "",
        "draft_sha256": file_sha256(draft) if draft else None,
        "machine": machine(),
        "threads": threads,
        "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
