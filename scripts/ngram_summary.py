#!/usr/bin/env python3
"""The n-gram table of docs/ngram.md, read from the bench documents scripts/ngram_tables.sh saved
under docs/ngram/ (every number is in one of those JSON files).

    python scripts/ngram_summary.py docs/ngram/*.json

One row per (type, model): ggspec's decode t/s and speedup against its own plain runs (paired),
llama.cpp's loop (llama-speculative-simple) from the same bench run and its speedup against
llama.cpp's own plain runs, the ratio of the two loops' t/s, τ of both, and whether every output
equalled plain greedy.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

MODELS = ("tiny-coder", "gemma-3-270m")


def _name(path: Path) -> tuple[str, str]:
    model = next(m for m in MODELS if path.stem.endswith("-" + m))
    return path.stem[:-len(model) - 1], model


def table(paths: list[Path]) -> str:
    out = ["| type | model | ggspec t/s | ggspec vs plain | llama.cpp t/s | llama.cpp vs plain | ggspec ÷ llama.cpp | "
           "τ ggspec | τ llama.cpp | identical |", "|" + "---|" * 10]
    for path in sorted(paths, key=lambda p: (MODELS.index(_name(p)[1]), _name(p)[0])):
        kind, model = _name(path)
        rows = {r["kind"]: r for r in json.loads(path.read_text())["rows"] if r["category"] == "all"}
        if "spec" not in rows:  # (a run still in progress)
            continue
        s, n = rows["spec"], rows.get("native")
        ratio = s["decode_tps_mean"] / n["decode_tps_mean"] if n else None
        out.append(f"| {kind} | {model} | {s['decode_tps_mean']:.0f} | {s['speedup_mean']:.2f} | "
                   f"{n['decode_tps_mean']:.0f} | {n['native_speedup_mean']:.2f} | {ratio:.2f} | "
                   f"{s['tau_pooled']:.2f} | {n['tau_pooled']:.2f} | {s['identical']} |" if n else
                   f"| {kind} | {model} | {s['decode_tps_mean']:.0f} | {s['speedup_mean']:.2f} | | | | "
                   f"{s['tau_pooled']:.2f} | | {s['identical']} |")
    return "\n".join(out)


if __name__ == "__main__":
    print(table([Path(p) for p in sys.argv[1:]]))
