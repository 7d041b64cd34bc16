"""The internals map (docs/development/internals.md, its source layout) kept true: every module of
every package is named in its package's entry, and every module an entry names exists."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "ggspec"
MAP = REPO / "docs" / "development" / "internals.md"


def _entries() -> dict[str, str]:
    """The layout block's entries: the key at two spaces' indent (`runtime/`, `speculative/types/`,
    `__main__.py`) -> the entry's whole text (its continuation lines indented deeper)."""
    block = MAP.read_text(encoding="utf-8").split("## Source layout", 1)[1].split("```", 2)[1]
    entries: dict[str, str] = {}
    key = None
    for line in block.splitlines():
        m = re.match(r"^  (\S+)(.*)$", line)
        if m:
            key = m.group(1)
            entries[key] = m.group(2)
        elif key is not None and line.startswith("   "):
            entries[key] += " " + line.strip()
        else:
            key = None  # (a top-level line: ggspec/, tests/, docs/ ...)
    return entries


def _modules(folder: Path) -> set[str]:
    return {p.name for p in folder.glob("*.py") if p.name != "__init__.py"}


def _named(text: str) -> set[str]:
    return set(re.findall(r"\b(\w+\.py)\b", text))


def test_every_package_entry_names_exactly_its_modules():
    entries = _entries()
    packages = sorted(p.parent for p in PACKAGE.rglob("__init__.py") if p.parent != PACKAGE)
    problems = []
    for pkg in packages:
        key = pkg.relative_to(PACKAGE).as_posix() + "/"
        if key not in entries:
            problems.append(f"{key}: no entry")
            continue
        have, named = _modules(pkg), _named(entries[key])
        problems += [f"{key}{m}: not in the map" for m in sorted(have - named)]
        problems += [f"{key}{m}: in the map, not in the package" for m in sorted(named - have)]
    assert problems == []


def test_the_top_level_modules_are_named():
    entries = _entries()
    loose = " ".join(text if key.endswith(".py") else "" for key, text in entries.items())
    loose += " " + " ".join(key for key in entries if key.endswith(".py"))
    assert sorted(_modules(PACKAGE) - _named(loose)) == []
