#!/usr/bin/env python3
"""The table of every speculative type beside llama.cpp (docs/measurements/types.md), read from what
scripts/types_table.sh saved under docs/types/ (every number is in one of those JSON files).

    python scripts/types_summary.py docs/types

Per type: at parallel 1, ggspec's decode t/s and speedup over its own plain runs (paired), llama.cpp's
loop (llama-speculative-simple) from the same bench run and its speedup over llama.cpp's plain runs,
the ratio of the two loops and τ of both; at parallel 4 (-np 4, 4 clients), the aggregate t/s of
`ggspec serve` and llama-server with the same type, the median of the paired ratios, each against
its own plain server, and both acceptance rates. The tiny-coder rows first, then the real Gemma 3
270M's (REAL=1 scripts/types_table.sh: the draft-free types).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ORDER = ("draft-simple", "draft-eagle3", "draft-dflash", "draft-dspark", "draft-mtp", "ngram-simple", "ngram-map-k",
         "ngram-map-k4v", "ngram-mod", "ngram-cache")


def _p1(path: Path) -> str:
    rows = {r["kind"]: r for r in json.loads(path.read_text())["rows"] if r["category"] == "all"}
    s, n = rows.get("spec"), rows.get("native")
    if s is None:
        return "| | | | | | |"
    if n is None:
        return f"| {s['decode_tps_mean']:.0f} | {s['speedup_mean']:.2f} | | | | {s['tau_pooled']:.2f} / |"
    return (f"| {s['decode_tps_mean']:.0f} | {s['speedup_mean']:.2f} | {n['decode_tps_mean']:.0f} | "
            f"{n['native_speedup_mean']:.2f} | **{s['decode_tps_mean'] / n['decode_tps_mean']:.2f}** | "
            f"{s['tau_pooled']:.2f} / {n['tau_pooled']:.2f} |")


def _p4(path: Path) -> str:
    if not path.is_file():
        return " | | | | |"
    rows = {r["server"]: r for r in json.loads(path.read_text())}
    g, ls = rows.get("ggspec spec"), rows.get("llama-server spec")
    if g is None or ls is None:
        return " | | | | |"
    gp, lp = rows.get("ggspec plain"), rows.get("llama-server plain")
    vs = f"{g['tps'] / gp['tps']:.2f} / " + (f"{ls['tps'] / lp['tps']:.2f}" if ls["tps"] else "")
    pct = lambda r: "" if r["accept"] is None else f"{100 * r['accept']:.0f}%"  # noqa: E731
    if ls["errors"] or not ls["tps"]:  # llama-server failed (its EAGLE3 loop aborts with several slots)
        return f" {g['tps']:.0f} | aborts ({ls['errors']} errors) | | {vs} | {pct(g)} / |"
    paired = g["paired"]["median"] if g.get("paired") else g["tps"] / ls["tps"]
    return f" {g['tps']:.0f} | {ls['tps']:.0f} | **{paired:.2f}** | {vs} | {pct(g)} / {pct(ls)} |"


def table(folder: Path) -> str:
    out = ["| type, model | ggspec t/s | vs plain | llama.cpp t/s | vs plain | ggspec ÷ llama.cpp | τ ggspec / llama.cpp "
           "| serve -np 4 t/s | llama-server t/s | ggspec ÷ llama-server | vs plain, ggspec / llama-server "
           "| accept ggspec / llama-server |",
           "|" + "---|" * 12]
    for suffix, model in (("", "tiny-coder"), ("-gemma", "Gemma 3 270M")):
        for kind in ORDER:
            p1 = folder / f"{kind}{suffix}-p1.json"
            if p1.is_file():
                out.append(f"| {kind}, {model} " + _p1(p1) + _p4(folder / f"{kind}{suffix}-p4.json"))
    return "\n".join(out)


if __name__ == "__main__":
    print(table(Path(sys.argv[1] if len(sys.argv) > 1 else "docs/types")))
