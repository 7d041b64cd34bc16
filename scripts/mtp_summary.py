#!/usr/bin/env python3
"""The condensed draft-mtp table of docs/mtp.md, read from the bench documents
scripts/mtp_tables.sh saved under docs/mtp/ (every number here is in one of those JSON files).

    python scripts/mtp_summary.py docs/mtp/mtp-*.json > summary.md

One row per (model, ggspec mode, depth): ggspec's decode t/s and speedup against its own plain
runs (paired), llama.cpp's draft-mtp loop from the same bench run and its speedup against
llama.cpp's own plain runs, the ratio of the two loops (both against ggspec's plain runs), llama.cpp calls per step, the draft's share of the step, and whether
every output equalled plain greedy. The last lines pick each loop's best depth per model.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def _rows(path: Path) -> list[dict]:
    return [r for r in json.loads(path.read_text())["rows"] if r["category"] == "all"]


MODES = ("unchained", "chained", "chained-vocab")


def _name(path: Path) -> tuple[str, str]:
    """mtp-qwen3.5-0.8b-chained-vocab.json -> ("qwen3.5-0.8b", "chained-vocab");
    mtp-gemma-4-e2b-unchained.json -> ("gemma-4-e2b", "unchained")"""
    stem = path.stem.removeprefix("mtp-")
    mode = next((m for m in sorted(MODES, key=len, reverse=True) if stem.endswith("-" + m)), "")
    return (stem[:-len(mode) - 1], mode) if mode else (stem, "")


def _f(x, spec: str = ".2f") -> str:
    return "" if x is None else format(x, spec)


def table(paths: list[Path]) -> str:
    out = ["| model | ggspec mode | depth | ggspec t/s | ggspec vs plain | llama.cpp t/s | llama.cpp vs plain | "
           "ggspec ÷ llama.cpp | calls/step | draft share | τ | identical |", "|" + "---|" * 12]
    best: dict[str, dict[str, tuple[float, int]]] = {}
    for path in sorted(paths, key=lambda p: (_name(p)[0], MODES.index(_name(p)[1]) if _name(p)[1] in MODES else 9)):
        model, mode = _name(path)
        rs = _rows(path)
        for r in sorted((r for r in rs if r["kind"] == "spec"), key=lambda r: r["n_max"]):
            nat = next((x for x in rs if x["kind"] == "native" and x["n_max"] == r["n_max"]), None)
            theirs = nat["native_speedup_mean"] if nat else None  # against llama.cpp's own plain runs
            # both rows' speedups against ggspec's plain runs of the same bench (as docs/scale.md): their
            # ratio compares the loops with the machine's drift mostly cancelled
            ratio = r["speedup_mean"] / nat["speedup_mean"] if nat and nat["speedup_mean"] else None
            out.append(f"| {model} | {mode} | {r['n_max']} | {r['decode_tps_mean']:.1f} | {_f(r['speedup_mean'])} | "
                       f"{_f(nat and nat['decode_tps_mean'], '.1f')} | {_f(theirs)} | {_f(ratio)} | "
                       f"{_f(r['calls_per_step'])} | {_f(r['share_draft'])} | {_f(r['tau_pooled'])} | "
                       f"{r['identical']} |")
            b = best.setdefault(model, {})
            if r["speedup_mean"] and r["speedup_mean"] > b.get(mode, (0, 0))[0]:
                b[mode] = (r["speedup_mean"], r["n_max"])
            if theirs and theirs > b.get(f"llama.cpp ({mode} run)", (0, 0))[0]:
                b[f"llama.cpp ({mode} run)"] = (theirs, r["n_max"])
    out.append("")
    for model, b in best.items():
        picks = ", ".join(f"{mode} {s:.2f}× at depth {n}" for mode, (s, n) in b.items())
        out.append(f"- {model}: best speedup vs plain: {picks}")
    return "\n".join(out)


if __name__ == "__main__":
    print(table([Path(p) for p in sys.argv[1:]]))
