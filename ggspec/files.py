"""Small file helpers shared by the catalogue, the fixtures and the benchmarks: hashing (cached by size and
mtime), user text files, portable paths; the atomic writes underneath are ggspec.native.atomic's."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator
from pathlib import Path

from ggspec.errors import InputError
from ggspec.native import paths
from ggspec.native.atomic import atomic_write, temp_sibling


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
    """The digests recorded so far; a missing, unreadable or damaged cache is empty (it is only a
    cache: the next write replaces it whole)."""
    try:
        cache = json.loads(_hash_cache().read_bytes())
    except (OSError, ValueError):
        return {}
    if not isinstance(cache, dict):
        return {}
    return {k: v for k, v in cache.items() if isinstance(v, str) and len(v) == 64}


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


# --- user files: one line of error, never a traceback ------------------------------------------------


def describe_bad_text(text: str) -> str:
    """Where a str is not valid UTF-8: a lone surrogate, as Python keeps undecodable bytes of the
    command line (surrogateescape) or as JSON spells them ("\\ud800"). "" when the text is fine."""
    try:
        text.encode("utf-8")
        return ""
    except UnicodeEncodeError as exc:
        ch = ord(text[exc.start])
        if 0xDC80 <= ch <= 0xDCFF:  # an undecodable byte carried by surrogateescape
            return f"byte 0x{ch - 0xDC00:02x} at character {exc.start}"
        return f"lone surrogate U+{ch:04X} at character {exc.start}"


def check_text(text: str, what: str) -> str:
    """`text` if it is valid UTF-8 (encodable), else InputError naming `what`."""
    bad = describe_bad_text(text)
    if bad:
        raise InputError(f"{what}: not valid UTF-8 text ({bad})")
    return text


def parse_json(text: str, what: str, not_this: str = "not JSON") -> object:
    """`text` as JSON, or InputError with one line: `{what}: {not_this} ({why})` (a document nested
    deeper than Python's recursion allows: "nested too deeply")."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"{what}: {not_this} ({exc.msg})") from None
    except RecursionError:
        raise InputError(f"{what}: {not_this} (nested too deeply)") from None


def json_lines(path: Path, what: str) -> Iterator[tuple[int, object]]:
    """The values of a JSONL file's non-blank lines with their line numbers; `what` names the file in
    messages ("--prompts FILE"): a line that is not JSON is `{what}:{n}: not JSON ({why})`."""
    for n, line in enumerate(read_text(path, what).splitlines(), 1):
        if line.strip():
            yield n, parse_json(line, f"{what}:{n}")


def read_text(path: Path, what: str) -> str:
    """A user's text file (UTF-8, a BOM allowed), or InputError with one line: `what` names the
    option or variable it came from (e.g. "--prompts FILE")."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise InputError(f"{what}: no such file") from None
    except IsADirectoryError:
        raise InputError(f"{what}: is a directory, not a file") from None
    except OSError as exc:
        raise InputError(f"{what}: cannot read it ({exc.strerror or exc})") from None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InputError(f"{what}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})") from None


def check_writable(path: Path, what: str) -> None:
    """Fail before any work when `path` cannot be written: its folder is made (as a save would) and
    a unique probe file is created and removed there."""
    path = Path(path)
    if path.is_dir():
        raise InputError(f"{what}: is a directory")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        probe = temp_sibling(path)
        probe.touch(exist_ok=False)
        probe.unlink()
    except OSError as exc:
        raise InputError(f"{what}: cannot write there ({exc.strerror or exc})") from None


HOME_MARK = "$GGSPEC_HOME"  # how bench documents name ggspec's home, wherever it is


def portable_path(path: Path) -> str:
    """A model file's path as bench documents store it: relative to the repository for files in
    it (a clone elsewhere reads the same document), `$GGSPEC_HOME/...` for pulled and made models,
    absolute otherwise (the user's own files, on their machine)."""
    path = Path(path).resolve()
    for base, mark in ((paths.REPO_ROOT, None), (paths.ggspec_home().resolve(), HOME_MARK)):
        if path.is_relative_to(base):
            rel = path.relative_to(base).as_posix()
            return f"{mark}/{rel}" if mark else rel
    return str(path)


def local_path(text: str) -> Path:
    """The file a bench document's path names on this machine (portable_path's inverse)."""
    if text.startswith(HOME_MARK + "/"):
        return paths.ggspec_home() / text[len(HOME_MARK) + 1:]
    path = Path(text)
    return path if path.is_absolute() else paths.REPO_ROOT / path
