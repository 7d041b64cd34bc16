"""`ggspec models pull` for pairs on the Hugging Face Hub, end to end without the internet: a fake Hub
on loopback answers in the Hub's layout and headers, and the real huggingface_hub client talks to it
through HF_ENDPOINT. Then `ggspec run --pair` finds the files in the HF cache with the server gone."""

from __future__ import annotations

import hashlib
import os
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote

import pytest

from ggspec.catalogue.pairs import PairEntry, _entry, hub_source, load_catalog
from ggspec.errors import InputError
from ggspec.native.paths import REPO_ROOT

TINY = REPO_ROOT / "models" / "tiny"
TARGET, DRAFT = "tiny-coder.gguf", "tiny-coder-dflash-b8.gguf"
TARGET_REPO, DRAFT_REPO = "test-org/tiny-coder-GGUF", "other-org/tiny-coder-DFlash-GGUF"
GOOD_TOKEN = "hf_good_token"  # the one token the fake Hub accepts
INVALID_TOKEN = "Invalid credentials in Authorization header"


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def commit_of(name: str) -> str:
    return hashlib.sha1(name.encode()).hexdigest()  # 40 hex digits, like a git commit


# --- the fake Hub -------------------------------------------------------------------------------


@dataclass
class Repo:
    files: dict[str, bytes]
    commit: str
    private: bool = False  # anonymous callers are told "not found" (401), as the Hub does
    gated: bool = False  # a token is needed, and only `granted` tokens get the files
    granted: tuple[str, ...] = (GOOD_TOKEN,)
    etag: dict[str, str] = field(default_factory=dict)  # an advertised sha256 other than the content's
    size: dict[str, int] = field(default_factory=dict)  # an advertised size other than the content's


@dataclass
class Seen:
    method: str
    path: str
    range: str | None
    authorization: str | None


class FakeHub:
    """`/{repo_id}/resolve/{revision}/{filename}` for HEAD and GET, with the headers huggingface_hub
    reads (X-Repo-Commit, ETag / X-Linked-Etag, X-Linked-Size, Content-Length, Accept-Ranges; a Range
    answered 206 with Content-Range) and errors in the Hub's style (X-Error-Code, X-Error-Message).
    No Xet headers: the client takes the plain HTTP path. `cut_after[filename] = n`: the first GET of
    that file sends n bytes, then drops the connection."""

    def __init__(self, repos: dict[str, Repo]) -> None:
        self.repos = repos
        self.seen: list[Seen] = []
        self.cut_after: dict[str, int] = {}
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def do_HEAD(self) -> None:  # noqa: N802
                hub.answer(self, body=False)

            def do_GET(self) -> None:  # noqa: N802
                hub.answer(self, body=True)

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def start(self) -> FakeHub:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def files_seen(self) -> list[Seen]:
        """The requests for files (huggingface_hub also asks for /api/agent-harnesses on its first call)."""
        return [s for s in self.seen if "/resolve/" in s.path]

    def gets(self) -> list[Seen]:
        return [s for s in self.files_seen() if s.method == "GET"]

    def answer(self, h: BaseHTTPRequestHandler, body: bool) -> None:
        auth = h.headers.get("Authorization")
        self.seen.append(Seen(h.command, h.path, h.headers.get("Range"), auth))
        parts = unquote(h.path.split("?")[0]).strip("/").split("/")
        if len(parts) < 5 or parts[2] != "resolve":
            return self.error(h, 404, None, "Not found")
        repo_id, revision, filename = "/".join(parts[:2]), parts[3], "/".join(parts[4:])
        token = auth.removeprefix("Bearer ") if auth else None
        if token is not None and token != GOOD_TOKEN:
            return self.error(h, 401, None, INVALID_TOKEN)
        repo = self.repos.get(repo_id)
        if repo is None or (repo.private and token is None):
            return self.error(h, 401 if token is None else 404, "RepoNotFound", "Repository not found")
        if repo.gated and token not in repo.granted:
            return self.error(h, 401 if token is None else 403, "GatedRepo", "Access to this model is restricted")
        if revision not in ("main", repo.commit):
            return self.error(h, 404, "RevisionNotFound", "Invalid rev id")
        if filename not in repo.files:
            return self.error(h, 404, "EntryNotFound", "Entry not found", commit=repo.commit)
        self.send_file(h, repo, filename, body)

    def send_file(self, h: BaseHTTPRequestHandler, repo: Repo, filename: str, body: bool) -> None:
        data = repo.files[filename]
        etag = repo.etag.get(filename, sha256(data))
        start = 0
        rng = h.headers.get("Range")
        if body and rng and rng.startswith("bytes="):
            start = int(rng.removeprefix("bytes=").split("-")[0])
        h.send_response(206 if start else 200)
        h.send_header("X-Repo-Commit", repo.commit)
        h.send_header("ETag", f'"{etag}"')
        h.send_header("X-Linked-Etag", f'"{etag}"')
        h.send_header("X-Linked-Size", str(repo.size.get(filename, len(data))))
        h.send_header("Accept-Ranges", "bytes")
        h.send_header("Content-Type", "application/octet-stream")
        h.send_header("Content-Length", str(len(data) - start))
        if start:
            h.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        h.end_headers()
        if not body:
            return
        cut = self.cut_after.pop(filename, None)
        if cut is not None and not start:  # the first GET: part of the file, then a dropped connection
            h.wfile.write(data[:cut])
            h.wfile.flush()
            h.connection.shutdown(socket.SHUT_RDWR)
            h.close_connection = True
            return
        h.wfile.write(data[start:])

    @staticmethod
    def error(h: BaseHTTPRequestHandler, status: int, code: str | None, message: str, commit: str | None = None) -> None:
        h.send_response(status)
        if code:
            h.send_header("X-Error-Code", code)
        h.send_header("X-Error-Message", message)
        if commit:
            h.send_header("X-Repo-Commit", commit)
        h.send_header("Content-Length", "0")
        h.end_headers()


# --- helpers ------------------------------------------------------------------------------------


def tiny_repos() -> dict[str, Repo]:
    """The tiny trained pair split over two repositories (target pinned, draft on main)."""
    return {TARGET_REPO: Repo({TARGET: (TINY / TARGET).read_bytes()}, commit_of("target")),
            DRAFT_REPO: Repo({DRAFT: (TINY / DRAFT).read_bytes()}, commit_of("draft"))}


@pytest.fixture
def hub():
    server = FakeHub(tiny_repos()).start()
    yield server
    server.stop()


def write_catalog(tmp_path: Path, **keys: str) -> Path:
    """A models.toml with one hub pair, `hubpair`; `keys` replace or add keys (None-valued: dropped)."""
    pair = {"description": "tiny pair on a fake Hub", "target_repo": TARGET_REPO, "target": TARGET,
            "target_revision": commit_of("target"), "target_sha256": sha256((TINY / TARGET).read_bytes()),
            "draft_repo": DRAFT_REPO, "draft": DRAFT}
    pair.update(keys)
    lines = [f'{k} = "{v}"' for k, v in pair.items() if v is not None]
    path = tmp_path / "models.toml"
    path.write_text("[pairs.hubpair]\n" + "\n".join(lines) + "\nn_max = 7\nctk = \"f16\"\nctv = \"f16\"\nctx = 4096\n")
    return path


def ggspec(tmp_path: Path, endpoint: str, *args: str, token: str | None = None, timeout: float = 120):
    """`python -m ggspec ARGS` with its own HF cache and catalog, pointed at `endpoint`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_"))}
    env.update(PYTHONUNBUFFERED="1", COLUMNS="200", HF_ENDPOINT=endpoint, HF_HOME=str(tmp_path / "hf"),
               HF_HUB_DISABLE_XET="1", GGSPEC_MODELS_TOML=str(tmp_path / "models.toml"))
    if token is not None:
        env["HF_TOKEN"] = token
    return subprocess.run([sys.executable, "-m", "ggspec", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


def assert_one_error(proc: subprocess.CompletedProcess, needle: str) -> str:
    assert proc.returncode == 1, f"rc={proc.returncode}\n{proc.stderr[-3000:]}"
    assert "Traceback" not in proc.stderr, proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1, proc.stderr
    assert needle in errors[0], errors[0]
    return errors[0]


def cached_files(tmp_path: Path) -> list[Path]:
    """Every blob and snapshot file in the test's HF cache (refs are only commit names)."""
    hub_cache = tmp_path / "hf" / "hub"
    return [p for p in hub_cache.rglob("*") if p.is_file() and "refs" not in p.parts and p.name != "CACHEDIR.TAG"
            and ".locks" not in p.parts] if hub_cache.exists() else []


def snapshot(tmp_path: Path, repo: str, commit: str, filename: str) -> Path:
    return tmp_path / "hf" / "hub" / f"models--{repo.replace('/', '--')}" / "snapshots" / commit / filename


# --- pulling and running ------------------------------------------------------------------------


def test_pull_then_run_with_the_hub_gone(hub, tmp_path, build_info):
    write_catalog(tmp_path)
    listed = ggspec(tmp_path, hub.url, "models")
    assert listed.returncode == 0, listed.stderr
    row = next(ln for ln in listed.stdout.splitlines() if "hubpair" in ln)
    assert "not pulled" in row and "hub" in row, listed.stdout

    proc = ggspec(tmp_path, hub.url, "models", "pull", "hubpair")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("pulled hubpair") == 2 and "sha256 verified" in proc.stderr, proc.stderr
    target = snapshot(tmp_path, TARGET_REPO, commit_of("target"), TARGET)
    draft = snapshot(tmp_path, DRAFT_REPO, commit_of("draft"), DRAFT)  # main resolved to its commit
    assert target.read_bytes() == (TINY / TARGET).read_bytes() and draft.read_bytes() == (TINY / DRAFT).read_bytes()
    assert {s.path.split("/")[-1] for s in hub.gets()} == {TARGET, DRAFT}

    listed = ggspec(tmp_path, hub.url, "models")
    row = "\n".join(ln for ln in listed.stdout.splitlines() if "hubpair" in ln or "unpinned" in ln)
    assert " ok " in row and f"@{commit_of('target')[:8]}" in row and "(main, unpinned)" in listed.stdout, listed.stdout

    requests = len(hub.seen)
    again = ggspec(tmp_path, hub.url, "models", "pull", "hubpair")
    assert again.returncode == 0 and again.stderr.count("already present") == 2, again.stderr
    assert len(hub.seen) == requests  # nothing downloaded, not even asked

    run_args = ("run", "--pair", "hubpair", "-p", "def add(a, b):", "-n", "8", "-t", "1", "--ignore-eos")
    run = ggspec(tmp_path, hub.url, *run_args)  # run time never touches the network ...
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() and "Traceback" not in run.stderr
    assert len(hub.seen) == requests
    hub.stop()  # ... and needs none: the same with the Hub gone
    offline = ggspec(tmp_path, hub.url, *run_args)
    assert offline.returncode == 0 and offline.stdout == run.stdout, offline.stderr


def test_run_before_pull_says_what_to_run(hub, tmp_path):
    write_catalog(tmp_path)
    proc = ggspec(tmp_path, hub.url, "run", "--pair", "hubpair", "-n", "4", "-t", "1")
    assert_one_error(proc, "run `ggspec models pull hubpair`")
    assert not hub.seen  # not even huggingface_hub's own first call


def test_an_interrupted_transfer_is_resumed(tmp_path):
    # huggingface_hub writes what it received in 10 MiB chunks, and resumes from the last one written:
    # the file must be larger than that (the tiny GGUFs are 2-4 MB), so this pair's target is a
    # 25 MB file and the connection drops 15 MiB into it
    big = (TINY / TARGET).read_bytes() * 6
    repos = {"test-org/big-GGUF": Repo({"big.gguf": big}, commit_of("big"))}
    server = FakeHub(repos).start()
    server.cut_after["big.gguf"] = cut = 15 * 2**20
    try:
        write_catalog(tmp_path, target_repo="test-org/big-GGUF", target="big.gguf", target_revision=commit_of("big"),
                      target_sha256=sha256(big), draft_repo=None, draft=None)
        proc = ggspec(tmp_path, server.url, "models", "pull", "hubpair")
    finally:
        server.stop()
    assert proc.returncode == 0, proc.stderr
    ranges = [s.range for s in server.gets()]
    assert len(ranges) == 2 and ranges[0] is None, ranges
    start = int(ranges[1].removeprefix("bytes=").rstrip("-"))  # the second GET asked only for the rest
    assert 0 < start <= cut, ranges
    assert sha256(snapshot(tmp_path, "test-org/big-GGUF", commit_of("big"), "big.gguf").read_bytes()) == sha256(big)


def test_a_hash_models_toml_does_not_know_is_refused_before_downloading(hub, tmp_path):
    write_catalog(tmp_path, target_sha256="ab" * 32)
    proc = ggspec(tmp_path, hub.url, "models", "pull", "hubpair")
    assert_one_error(proc, "models.toml expects abababab")
    assert "not downloaded" in proc.stderr
    assert not hub.gets() and not cached_files(tmp_path)


def test_a_download_that_does_not_match_the_hubs_hash_is_not_kept(tmp_path):
    repos = tiny_repos()
    repos[DRAFT_REPO].etag[DRAFT] = "cd" * 32  # a damaged mirror: the bytes are not the advertised file
    server = FakeHub(repos).start()
    try:
        write_catalog(tmp_path)
        proc = ggspec(tmp_path, server.url, "models", "pull", "hubpair")
    finally:
        server.stop()
    line = assert_one_error(proc, "the Hub's metadata says cdcdcdcd")
    assert "not kept" in line
    kept = cached_files(tmp_path)
    assert all(DRAFT not in p.name and p.name != "cd" * 32 for p in kept), kept  # the target may stay


def test_a_private_repository_needs_a_token(tmp_path):
    repos = tiny_repos()
    repos[TARGET_REPO].private = True
    server = FakeHub(repos).start()
    try:
        write_catalog(tmp_path)
        anonymous = ggspec(tmp_path, server.url, "models", "pull", "hubpair")
        wrong = ggspec(tmp_path, server.url, "models", "pull", "hubpair", token="hf_wrong")
        right = ggspec(tmp_path, server.url, "models", "pull", "hubpair", token=GOOD_TOKEN)
    finally:
        server.stop()
    assert_one_error(anonymous, "needs a token: set HF_TOKEN (or `hf auth login`)")
    assert_one_error(wrong, "refused the token (invalid credentials)")
    assert right.returncode == 0, right.stderr
    assert any(s.authorization == f"Bearer {GOOD_TOKEN}" and s.method == "GET" for s in server.seen)


def test_a_gated_repository_tells_apart_no_token_and_no_access(tmp_path):
    repos = tiny_repos()
    repos[TARGET_REPO].gated = True
    repos[TARGET_REPO].granted = ()
    server = FakeHub(repos).start()
    try:
        write_catalog(tmp_path)
        anonymous = ggspec(tmp_path, server.url, "models", "pull", "hubpair")
        refused = ggspec(tmp_path, server.url, "models", "pull", "hubpair", token=GOOD_TOKEN)
    finally:
        server.stop()
    assert_one_error(anonymous, "is gated: it needs a token: set HF_TOKEN")
    assert_one_error(refused, "is gated and your token has no access yet: request it on")


@pytest.mark.parametrize(("keys", "needle"), [
    ({"target": "missing.gguf"}, f"{TARGET_REPO} has no file missing.gguf at {commit_of('target')}"),
    ({"target_repo": "test-org/no-such-repo"}, "repository test-org/no-such-repo was not found"),
    ({"target_revision": commit_of("elsewhere")}, f"has no revision {commit_of('elsewhere')}"),
])
def test_a_missing_file_repository_or_revision_is_one_line(hub, tmp_path, keys, needle):
    write_catalog(tmp_path, **keys)
    assert_one_error(ggspec(tmp_path, hub.url, "models", "pull", "hubpair"), needle)
    assert not hub.gets() and not cached_files(tmp_path)


def test_no_network_is_one_line(tmp_path):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    write_catalog(tmp_path)
    assert_one_error(ggspec(tmp_path, closed, "models", "pull", "hubpair"), "(no network?)")


def test_a_file_larger_than_the_free_disk_is_refused_up_front(tmp_path):
    repos = tiny_repos()
    repos[TARGET_REPO].size[TARGET] = 2**60  # an exabyte: more than any disk here
    server = FakeHub(repos).start()
    try:
        write_catalog(tmp_path)
        proc = ggspec(tmp_path, server.url, "models", "pull", "hubpair")
        assert not server.gets()
    finally:
        server.stop()
    assert_one_error(proc, "the download needs 1073741824.0 GiB")


# --- the catalog keys ---------------------------------------------------------------------------


def entry(**raw) -> PairEntry:
    return _entry("models.toml", "p", {"description": "x", "target": "t.gguf", **raw})


@pytest.mark.parametrize(("raw", "needle"), [
    ({"target_repo": "no-slash"}, "target_repo must be a Hub repository id OWNER/NAME"),
    ({"target_repo": "a/b/c"}, "target_repo must be a Hub repository id"),
    ({"target_repo": "owner/-name"}, "target_repo must be a Hub repository id"),
    ({"target_repo": "owner/na--me"}, "target_repo must be a Hub repository id"),
    ({"target_repo": "o/n", "draft": "d.gguf", "draft_repo": "x y/z"}, "draft_repo must be a Hub repository id"),
    ({"target_repo": "o/n", "target_revision": "main"}, "target_revision must be a full 40-hex commit hash"),
    ({"target_repo": "o/n", "target_revision": "ABC" + "0" * 37}, "target_revision must be a full 40-hex"),
    ({"target_repo": "o/n", "draft_repo": "o/m"}, "draft_repo / draft_revision need a draft file"),
    ({"draft_repo": "o/m", "draft": "d.gguf"}, "needs target_repo"),
    ({"target_repo": "o/n", "packages": ["x==1"]}, "has no packages or generated key"),
    ({"target_repo": "o/n", "target": "../t.gguf"}, "target must be a file path inside the repository"),
    ({"target_repo": "o/n", "target": "/abs/t.gguf"}, "target must be a file path inside the repository"),
])
def test_bad_hub_keys_are_one_line(raw, needle):
    with pytest.raises(InputError, match="pair 'p'") as err:
        entry(**raw)
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_the_draft_defaults_to_the_targets_repository_and_commit():
    commit = "a" * 40
    same = entry(target_repo="o/n", target_revision=commit, draft="d.gguf")
    assert same.kind == "hub" and [(f.repo, f.revision) for f in same.hub_files()] == [("o/n", commit)] * 2
    assert hub_source(same) == f"o/n @{commit[:8]}"
    other = entry(target_repo="o/n", target_revision=commit, draft="MTP/d.gguf", draft_repo="p/q")
    assert [(f.repo, f.filename, f.revision) for f in other.hub_files()] == [
        ("o/n", "t.gguf", commit), ("p/q", "MTP/d.gguf", None)]
    assert hub_source(other) == f"o/n @{commit[:8]}\np/q (main, unpinned)"


def test_the_shipped_catalogs_hub_pairs_are_well_formed():
    hub_pairs = [e for e in load_catalog().values() if e.kind == "hub"]
    assert hub_pairs
    for e in hub_pairs:
        assert e.source and e.description, e.name
        for f in e.hub_files():
            assert f.filename.endswith(".gguf"), e.name
            if f.sha256:  # a recorded hash belongs to a pinned revision: main may have moved since
                assert f.revision, (e.name, f.filename)


def test_the_cache_folder_follows_huggingface_hub(tmp_path):
    """ggspec.catalogue.hub.cache_dir() reads the same variables, in the same order, as huggingface_hub does."""
    code = "from huggingface_hub import constants; from ggspec.catalogue.hub import cache_dir; print(constants.HF_HUB_CACHE); " \
           "print(cache_dir())"
    for env in ({"HF_HOME": str(tmp_path / "home")}, {"HF_HUB_CACHE": str(tmp_path / "c"), "HF_HOME": "/x"},
                {"XDG_CACHE_HOME": str(tmp_path / "xdg")}):
        clean = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_", "XDG_"))}
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**clean, **env},
                             check=True).stdout.split()
        assert out[0] == out[1], (env, out)


def test_a_full_disk_during_the_download_is_one_line():
    import errno

    from ggspec.catalogue.hub import HubFile, explain_os_error

    line = explain_os_error(HubFile("o/n", "t.gguf"), OSError(errno.ENOSPC, "No space left on device"))
    assert "disk full" in line and "o/n/t.gguf (main, unpinned)" in line
