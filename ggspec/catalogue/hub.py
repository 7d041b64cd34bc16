"""Model files on the Hugging Face Hub: download into the shared HF cache, verify, find again offline.

`pull` fetches a file with `huggingface_hub` (its progress bar; a connection that drops mid-file is
resumed with a Range request) into the HF cache that other tools share (`$HF_HUB_CACHE`, else
`$HF_HOME/hub`, else `~/.cache/huggingface/hub`), honouring `HF_TOKEN` and `HF_ENDPOINT`. It asks the
Hub for the file's metadata first, so every failure is one line before anything is written: no
network, unknown repository, revision or file, a token the repository needs, not enough disk.
`huggingface_hub` does not check what it downloaded, so `pull` hashes the file and compares it with
the sha256 models.toml records, else with the Hub's own (the X-Linked-Etag of an LFS file); a file
that does not match is deleted from the cache.

`find_cached` is all that runs at generation time: a look-up in the cache, never the network.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ggspec.errors import InputError
from ggspec.files import cached_sha256, file_sha256, remember_sha256

DEFAULT_ENDPOINT = "https://huggingface.co"
COMMIT = re.compile(r"^[0-9a-f]{40}$")  # a pinned revision: a full commit hash
SHA256 = re.compile(r"^[0-9a-f]{64}$")
# OWNER/NAME: letters, digits, '-', '_', '.'; neither part starts with '-' or '.', no '--' or '..'
# (the Hub's own rule, huggingface_hub.utils.validate_repo_id)
REPO_ID = re.compile(r"^(?!.*(--|\.\.))[A-Za-z0-9_][A-Za-z0-9_.-]{0,95}/[A-Za-z0-9_][A-Za-z0-9_.-]{0,95}$")
INVALID_TOKEN = "Invalid credentials in Authorization header"  # the Hub's X-Error-Message for a bad token
NEEDS_TOKEN = "set HF_TOKEN (or `hf auth login`)"


class HubError(InputError):
    """A download or verification failed; the message is one line meant for the user."""


@dataclass(frozen=True)
class HubFile:
    """One file of a repository on the Hub, as models.toml names it."""

    repo: str
    filename: str
    revision: str | None = None  # a commit hash; None: the main branch, unpinned
    sha256: str | None = None  # the file's sha256 when models.toml records it

    @property
    def ref(self) -> str:
        return self.revision or "main"

    @property
    def pin(self) -> str:
        """How listings and messages show the revision: `@COMMIT8`, or ` (main, unpinned)`."""
        return f"@{self.revision[:8]}" if self.revision else " (main, unpinned)"

    def label(self) -> str:
        return f"{self.repo}/{self.filename}{self.pin}"


@dataclass(frozen=True)
class Remote:
    """What the Hub says about a file before it is downloaded."""

    commit: str
    sha256: str | None  # None when the file is not an LFS file (its ETag is then a git hash)
    size: int | None


@dataclass(frozen=True)
class Pulled:
    path: Path
    fetched: bool  # False: it was already in the cache, nothing was downloaded


# --- where things are ---------------------------------------------------------------------------


def cache_dir() -> Path:
    """The HF cache, read from the environment now (as huggingface_hub reads it at import)."""
    explicit = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    if explicit:
        return Path(os.path.expandvars(explicit)).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME", "~/.cache"), "huggingface")
    return Path(os.path.expandvars(home)).expanduser() / "hub"


def endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", DEFAULT_ENDPOINT).rstrip("/")


def find_cached(f: HubFile) -> Path | None:
    """The file's path in the HF cache when a pull (by ggspec or any HF tool) left it there; offline."""
    from huggingface_hub import try_to_load_from_cache  # noqa: PLC0415

    found = try_to_load_from_cache(f.repo, f.filename, cache_dir=str(cache_dir()), revision=f.ref)
    return Path(found) if isinstance(found, str) and os.path.isfile(found) else None


def expected_sha256(f: HubFile, path: Path) -> str | None:
    """What a cached file must hash to: models.toml's sha256, else the name of its blob (the cache
    names blobs by ETag, the sha256 for LFS files)."""
    if f.sha256:
        return f.sha256
    blob = path.resolve().name
    return blob if SHA256.match(blob) else None


def cached_status(f: HubFile) -> tuple[str, Path | None]:
    """('ok', path), ('not pulled', None) or ('mismatch', path) for a file in the cache."""
    path = find_cached(f)
    if path is None:
        return "not pulled", None
    want = expected_sha256(f, path)
    if want is not None and cached_sha256(path) != want:
        return "mismatch", path
    return "ok", path


# --- pulling ------------------------------------------------------------------------------------


def pull(files: list[HubFile], *, on_hash: Callable[[str, int], Callable[[int], None]] | None = None) -> list[Pulled]:
    """Make every file present and verified in the HF cache; one HubError line otherwise. All the
    metadata is read (and the disk space checked) before the first byte is downloaded.
    `on_hash(filename, size)` returns a callback told of every chunk hashed (for a progress bar)."""
    present: dict[HubFile, Path] = {}
    for f in files:
        try:
            status, path = cached_status(f)
        except OSError as exc:
            raise HubError(f"{f.label()}: cannot read its copy in {cache_dir()} ({exc.strerror or exc})") from None
        if status == "ok":
            present[f] = path
        elif status == "mismatch":
            discard(path)  # a damaged copy in the cache: download it again
    missing = [f for f in files if f not in present]
    if missing:
        _refuse_offline()
    todo = [(f, metadata(f)) for f in missing]
    check_space([r for _, r in todo], cache_dir())
    fetched = {f: download(f, remote, on_hash) for f, remote in todo}
    return [Pulled(present[f], False) if f in present else Pulled(fetched[f], True) for f in files]


def _refuse_offline() -> None:
    from huggingface_hub import constants  # noqa: PLC0415

    if constants.HF_HUB_OFFLINE:
        raise HubError("HF_HUB_OFFLINE is set: unset it to download from the Hub")


def metadata(f: HubFile) -> Remote:
    """The Hub's answer to a HEAD request for the file: its commit, sha256 and size."""
    from huggingface_hub import get_hf_file_metadata, hf_hub_url  # noqa: PLC0415
    from huggingface_hub.errors import HfHubHTTPError, HFValidationError  # noqa: PLC0415

    try:
        meta = get_hf_file_metadata(hf_hub_url(f.repo, f.filename, revision=f.ref, endpoint=endpoint()))
    except HFValidationError as exc:  # a name models.toml's own check let through
        raise HubError(f"{f.label()}: {_first_line(exc)}") from None
    except HfHubHTTPError as exc:
        raise HubError(explain_http(f, exc.response.status_code, exc.response.headers)) from None
    except _transport_errors() as exc:
        raise HubError(f"cannot reach {endpoint()} for {f.label()} (no network?): {_first_line(exc)}") from None
    if meta.commit_hash is None or meta.etag is None:
        raise HubError(f"{endpoint()} does not answer like the Hugging Face Hub (no X-Repo-Commit or ETag "
                       f"for {f.label()}): check HF_ENDPOINT")
    sha = meta.etag.lower()
    return Remote(commit=meta.commit_hash, sha256=sha if SHA256.match(sha) else None, size=meta.size)


def explain_http(f: HubFile, status: int, headers) -> str:
    """One line for an error answer of the Hub (its X-Error-Code and X-Error-Message say which)."""
    from huggingface_hub import get_token  # noqa: PLC0415

    code, message = headers.get("X-Error-Code"), headers.get("X-Error-Message")
    has_token = get_token() is not None
    page = f"{endpoint()}/{f.repo}"
    if message == INVALID_TOKEN:
        return f"{f.repo}: the Hub refused the token (invalid credentials): check HF_TOKEN (or `hf auth login`)"
    if code == "GatedRepo":
        if status == 403 or has_token:
            return f"{f.repo} is gated and your token has no access yet: request it on {page}"
        return f"{f.repo} is gated: it needs a token: {NEEDS_TOKEN}, after accepting its terms on {page}"
    if code == "RevisionNotFound":
        return f"{f.repo} has no revision {f.ref}"
    if code == "EntryNotFound":
        return f"{f.repo} has no file {f.filename} at {f.ref}"
    if code == "RepoNotFound" or status == 404:
        if status == 401 and not has_token:  # the Hub hides private repositories from anonymous callers
            return f"repository {f.repo} was not found on {endpoint()}, or it is private and needs a token: {NEEDS_TOKEN}"
        return f"repository {f.repo} was not found on {endpoint()}"
    if status in (401, 403):
        if has_token:
            return f"{f.repo}: the Hub refused access with your token ({status}): check HF_TOKEN (or `hf auth login`)"
        return f"{f.repo} needs a token ({status}): {NEEDS_TOKEN}"
    return f"{f.label()}: the Hub answered {status}{f' ({message})' if message else ''}"


def check_space(remotes: list[Remote], folder: Path) -> None:
    """Refuse up front when the files will not fit (huggingface_hub only warns, then fails midway)."""
    need = sum(r.size or 0 for r in remotes)
    free = shutil.disk_usage(_existing_parent(folder)).free
    if need > free:
        raise HubError(f"the download needs {_size(need)}, {folder} has {_size(free)} free")


def download(f: HubFile, remote: Remote, on_hash: Callable[[str, int], Callable[[int], None]] | None = None) -> Path:
    """Download into the cache, then verify against the sha256 expected (a mismatch is deleted)."""
    want = f.sha256 or remote.sha256
    if want is None:
        raise HubError(f"{f.label()}: no sha256 to check it against (not an LFS file, and models.toml records "
                       "none): add target_sha256 / draft_sha256")
    if f.sha256 and remote.sha256 and f.sha256 != remote.sha256:
        raise HubError(f"{f.label()}: the Hub's file has sha256 {remote.sha256[:16]}…, models.toml expects "
                       f"{f.sha256[:16]}…: not downloaded")
    path = _fetch(f)
    got = file_sha256(path, on_hash(f.filename, path.stat().st_size) if on_hash else None)
    if got != want:
        discard(path)
        source = "models.toml" if f.sha256 else "the Hub's metadata"
        raise HubError(f"{f.label()}: the downloaded file has sha256 {got[:16]}…, {source} says {want[:16]}…: not kept")
    remember_sha256(path, got)  # later runs check the file without hashing it again
    return path


def _fetch(f: HubFile) -> Path:
    """hf_hub_download, errors in one line. It is given the revision models.toml names (not the
    commit metadata() saw) so that an unpinned file's refs/main is written: run time finds it by it."""
    from huggingface_hub import hf_hub_download  # noqa: PLC0415
    from huggingface_hub.errors import HfHubHTTPError  # noqa: PLC0415

    try:
        return Path(hf_hub_download(f.repo, f.filename, revision=f.ref, cache_dir=str(cache_dir()),
                                    endpoint=endpoint()))
    except HfHubHTTPError as exc:
        raise HubError(explain_http(f, exc.response.status_code, exc.response.headers)) from None
    except _transport_errors() as exc:
        raise HubError(f"the download of {f.label()} broke off: {_first_line(exc)}; run the pull again") from None
    except OSError as exc:
        raise HubError(explain_os_error(f, exc)) from None


def explain_os_error(f: HubFile, exc: OSError) -> str:
    if exc.errno == errno.ENOSPC:
        return f"{f.label()}: no space left in {cache_dir()} (disk full): free some, or point HF_HOME elsewhere"
    if exc.errno is not None:
        return f"{f.label()}: cannot write into {cache_dir()} ({exc.strerror or exc})"
    return f"the download of {f.label()} failed: {_first_line(exc)}"  # e.g. the size check after a short read


def discard(path: Path) -> None:
    """Delete a cached file: its snapshot link and the blob it points to (nothing bad is kept)."""
    blob = path.resolve()
    path.unlink(missing_ok=True)
    if blob != path:
        blob.unlink(missing_ok=True)


# --- small helpers ------------------------------------------------------------------------------


def _transport_errors() -> tuple[type[BaseException], ...]:
    """The network errors of the HTTP client this huggingface_hub uses (httpx in 1.x, httpx2 later)."""
    import importlib  # noqa: PLC0415

    for name in ("httpx2", "httpx"):
        try:
            return (importlib.import_module(name).TransportError,)
        except (ImportError, AttributeError):
            continue
    return (ConnectionError,)


def _existing_parent(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _first_line(exc: BaseException) -> str:
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return lines[0] if lines else type(exc).__name__


def _size(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"
