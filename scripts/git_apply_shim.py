#!/usr/bin/env python3
"""A stand-in for `git` on machines without it (scripts/device_check.sh puts it on PATH as `git`).

ggspec's build only runs `git apply [--check] -p1 FILE` in the patched tree. This applies such a
unified diff the same way for the patch series: every hunk's old lines must match exactly (found
at the stated line or the nearest offset), all files change or none, new files are created.
`--check` only reports. Any other git command fails (cmake's build-info lookup copes with that).
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


class PatchError(Exception):
    pass


@dataclass
class FilePatch:
    old: str | None = None  # None: a new file
    new: str | None = None
    hunks: list[tuple[int, list[str]]] = field(default_factory=list)  # (old start line, body lines)


def _strip(path: str, p: int) -> str | None:
    if path == "/dev/null":
        return None
    return path.split("/", p)[-1] if p else path


def parse(text: str, p: int) -> list[FilePatch]:
    files: list[FilePatch] = []
    lines = text.splitlines(keepends=True)
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("diff --git "):
            files.append(FilePatch())
        elif line.startswith("--- ") and files and not files[-1].hunks:
            files[-1].old = _strip(line[4:].rstrip("\n").split("\t")[0], p)
        elif line.startswith("+++ ") and files and not files[-1].hunks:
            files[-1].new = _strip(line[4:].rstrip("\n").split("\t")[0], p)
        elif line.startswith("@@"):
            m = HUNK.match(line)
            if not m or not files:
                raise PatchError(f"malformed hunk header: {line.strip()}")
            n_old = int(m.group(2)) if m.group(2) is not None else 1
            n_new = int(m.group(4)) if m.group(4) is not None else 1
            body, i = _hunk_body(lines, i + 1, n_old, n_new)
            files[-1].hunks.append((int(m.group(1)), body))
            continue
        i += 1
    return files


def _hunk_body(lines: list[str], i: int, n_old: int, n_new: int) -> tuple[list[str], int]:
    """The hunk's lines (' ', '-', '+'), counted by the header; a '\\ No newline' marker drops the
    newline of the line before it."""
    body: list[str] = []
    while (n_old > 0 or n_new > 0) and i < len(lines):
        line = lines[i]
        tag = line[:1]
        if tag == "\n" or tag == "":  # an empty context line whose space was stripped
            line, tag = " " + line, " "
        if tag not in " -+":
            raise PatchError(f"unexpected line in a hunk: {line.strip()}")
        body.append(line)
        n_old -= tag in " -"
        n_new -= tag in " +"
        i += 1
        if i < len(lines) and lines[i].startswith("\\"):
            body[-1] = body[-1].rstrip("\n")
            i += 1
    if n_old > 0 or n_new > 0:
        raise PatchError("truncated hunk")
    return body, i


def apply_hunks(path: str, text: list[str], hunks: list[tuple[int, list[str]]]) -> list[str]:
    out = list(text)
    offset = 0
    for start, body in hunks:
        old = [ln[1:] for ln in body if ln[0] in " -"]
        new = [ln[1:] for ln in body if ln[0] in " +"]
        want = max(0, start - 1 + offset) if old else max(0, start + offset)
        at = _find(out, old, want)
        if at is None:
            raise PatchError(f"patch failed: {path}:{start}")
        out[at:at + len(old)] = new
        offset += len(new) - len(old)
    return out


def _find(text: list[str], old: list[str], want: int) -> int | None:
    """The position nearest `want` where `old` matches exactly."""
    for delta in range(len(text) + 1):
        for at in (want - delta, want + delta) if delta else (want,):
            if 0 <= at <= len(text) - len(old) and text[at:at + len(old)] == old:
                return at
    return None


def apply(patch_file: Path, p: int, check: bool) -> None:
    results: dict[Path, list[str]] = {}
    for fp in parse(patch_file.read_text(), p):
        target = Path(fp.new or fp.old or "")
        if fp.new is None:
            raise PatchError(f"{fp.old}: deleting files is not supported by this shim")
        source = Path(fp.old) if fp.old else None
        if source is None and target.exists():
            raise PatchError(f"{target}: already exists in working directory")
        if source is not None and not source.is_file():
            raise PatchError(f"{source}: No such file or directory")
        text = results.get(source) if source in results else (source.read_text().splitlines(keepends=True) if source else [])
        results[target] = apply_hunks(str(target), text, fp.hunks)
    if not check:
        for target, lines in results.items():
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text("".join(lines))


def main(argv: list[str]) -> int:
    if argv[:1] == ["--version"]:
        print("git version 2.0.0 (ggspec apply-only shim)")
        return 0
    if argv[:1] != ["apply"]:
        print(f"git shim: only `git apply` is supported (got: git {' '.join(argv)})", file=sys.stderr)
        return 1
    check, p, files = False, 1, []
    for arg in argv[1:]:
        if arg == "--check":
            check = True
        elif re.fullmatch(r"-p\d+", arg):
            p = int(arg[2:])
        elif arg.startswith("-"):
            print(f"git shim: unsupported option {arg}", file=sys.stderr)
            return 1
        else:
            files.append(Path(arg))
    try:
        for f in files:
            apply(f, p, check)
    except (PatchError, OSError, UnicodeDecodeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
