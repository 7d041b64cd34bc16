"""Named target/draft pairs from `models.toml`, with their recommended settings.

Three kinds of entries:
- shipped: trained files committed in this repository (path relative to models.toml + sha256);
- generated: random-weight fixtures made on demand (`generated = "dense" | "hybrid"`);
- public: pairs the design write-ups were measured on; the user points `--models-dir` at local
  copies. Nothing is ever downloaded.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ggspec.errors import InputError
from ggspec.fixtures.tiny import file_sha256
from ggspec.native.paths import REPO_ROOT, fixtures_dir

SETTING_KEYS = ("n_max", "ctk", "ctv", "ctx", "planes", "lead")


@dataclass(frozen=True)
class PairEntry:
    name: str
    description: str = ""
    target: str | None = None
    draft: str | None = None
    target_sha256: str | None = None
    draft_sha256: str | None = None
    generated: str | None = None
    hybrid: bool = False
    source: str = ""
    settings: dict[str, Any] = field(default_factory=dict)

    @property
    def kind(self) -> str:
        if self.generated:
            return "generated"
        return "shipped" if self.target_sha256 else "public"


@dataclass(frozen=True)
class ResolvedPair:
    target: Path
    draft: Path


def catalog_path() -> Path:
    env = os.environ.get("GGSPEC_MODELS_TOML")
    return Path(env) if env else REPO_ROOT / "models.toml"


def load_catalog(path: Path | None = None) -> dict[str, PairEntry]:
    path = path or catalog_path()
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise InputError(f"model catalog not found: {path}") from None
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"model catalog {path} is not valid TOML: {exc}") from None
    entries = {}
    for name, raw in data.get("pairs", {}).items():
        settings = {k: raw[k] for k in SETTING_KEYS if k in raw}
        known = {k: raw[k] for k in ("description", "target", "draft", "target_sha256", "draft_sha256",
                                     "generated", "hybrid", "source") if k in raw}
        entries[name] = PairEntry(name=name, settings=settings, **known)
    return entries


def get_entry(name: str, path: Path | None = None) -> PairEntry:
    catalog = load_catalog(path)
    if name not in catalog:
        raise InputError(f"unknown pair '{name}' (known: {', '.join(catalog)}); see `ggspec models`")
    return catalog[name]


def _locate(entry: PairEntry, models_dir: Path | None) -> tuple[Path, Path]:
    assert entry.target and entry.draft
    if entry.kind == "shipped":
        base = catalog_path().parent
    elif models_dir is not None:
        base = models_dir
    else:
        raise InputError(f"pair '{entry.name}' uses your local copies of {entry.target} and "
                         f"{entry.draft}: give --models-dir DIR")
    return base / entry.target, base / entry.draft


def check_files(entry: PairEntry, models_dir: Path | None) -> str:
    """'ok', 'generated', 'missing: …' or 'mismatch: …' (checksums of shipped files)."""
    if entry.kind == "generated":
        return "generated"
    try:
        target, draft = _locate(entry, models_dir)
    except InputError:
        return "needs --models-dir"
    for path, want in ((target, entry.target_sha256), (draft, entry.draft_sha256)):
        if not path.is_file():
            return f"missing: {path}"
        if want and file_sha256(path) != want:
            return f"mismatch: {path.name}"
    return "ok"


def resolve(entry: PairEntry, models_dir: Path | None = None) -> ResolvedPair:
    """The pair's files, generated or verified as needed; raises InputError when unusable."""
    if entry.kind == "generated":
        from ggspec.fixtures.tiny import KINDS, ensure_tiny_pair  # noqa: PLC0415

        if entry.generated not in KINDS:
            raise InputError(f"pair '{entry.name}': generated must be one of {', '.join(KINDS)}")
        tiny = ensure_tiny_pair(fixtures_dir(), entry.generated)
        return ResolvedPair(tiny.target, tiny.draft)
    status = check_files(entry, models_dir)
    if status != "ok":
        raise InputError(f"pair '{entry.name}': {status}")
    target, draft = _locate(entry, models_dir)
    return ResolvedPair(target, draft)
