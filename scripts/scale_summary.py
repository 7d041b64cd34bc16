#!/usr/bin/env python3
"""The condensed tables of docs/scale.md, read from the bench documents scripts/scale_tables.sh
saved under docs/scale/ (every number here is in one of those JSON files).

    python scripts/scale_summary.py [DIR]      (default docs/scale) > tables.md

Ratios between loops are ratios of paired ratios: each speculative row's runs are paired with
ggspec's plain runs of the same prompts, back to back, so speedup(ggspec) / speedup(llama.cpp)
compares the two loops with the machine's drift mostly cancelled.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def rows(path: Path) -> list[dict]:
    return [r for r in json.loads(path.read_text())["rows"] if r["category"] == "all"]


def _model(path: Path) -> str:
    """pays-qwen3-1.7b-dflash.json -> qwen3-1.7b"""
    return "-".join(path.stem.split("-")[1:3])


def _f(x, spec: str = ".2f") -> str:
    return "" if x is None else format(x, spec)


def _table(columns: list[str], body: list[list]) -> str:
    """A markdown table: the header, its rule, then one row of cells per entry."""
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    return "\n".join(lines + ["| " + " | ".join(map(str, cells)) + " |" for cells in body])


def pays(folder: Path) -> str:
    body = []
    for path in sorted(folder.glob("pays-*.json")):
        rs = rows(path)
        base = next(r for r in rs if r["kind"] == "baseline")
        nbase = next((r for r in rs if r["kind"] == "native-baseline"), None)
        for r in sorted((r for r in rs if r["kind"] == "spec"), key=lambda r: r["n_max"]):
            nat = {x["inject"]: x for x in rs if x["kind"] == "native" and x["n_max"] == r["n_max"]}
            best = max((x for x in nat.values()), key=lambda x: x["speedup_mean"] or 0, default=None)
            ratio = r["speedup_mean"] / best["speedup_mean"] if best and best["speedup_mean"] else None
            breakeven = r["tau_pooled"] / r["s_max"] if r["s_max"] else None
            plain = f"{base['decode_tps_mean']:.1f} / {_f(nbase and nbase['decode_tps_mean'], '.1f')}"
            theirs = " / ".join(_f(nat.get(m, {}).get("decode_tps_mean"), ".1f") for m in ("immediate", "deferred"))
            body.append([_model(path), r["acceptance_profile"], r["n_max"], plain, format(r["decode_tps_mean"], ".1f"),
                         theirs, _f(ratio), _f(r["speedup_mean"]), _f(r["tau_pooled"]), _f(breakeven), r["identical"]])
    return _table(["model", "profile", "n_max", "plain t/s (ggspec / llama.cpp)", "ggspec t/s",
                   "llama.cpp t/s (imm / def)", "ggspec ÷ llama.cpp", "speedup vs plain", "τ", "break-even τ",
                   "identical"], body)


def seed000(folder: Path) -> str:
    body = []
    for path in sorted(folder.glob("seed000-*.json"), key=lambda p: (p.stem.endswith("-long"), p.stem)):
        prompt = "4.3k tokens" if path.stem.endswith("-long") else "short"
        rs = sorted((r for r in rows(path) if r["kind"] == "spec"),
                    key=lambda r: (r["planes"] != "uncapped", -int(r["planes"]) if r["planes"].isdigit() else 0, r["lead"]))
        for r in rs:
            state = f"{r['plane_bytes'] / 2**20:.0f} MiB ({r['plane_layout']})" if r["plane_bytes"] else ""
            body.append([_model(path), prompt, r["planes"], r["lead"], format(r["decode_tps_mean"], ".1f"),
                         _f(r["speedup_mean"]), _f(r["replay_share"], ".0%"), state, _f(r["peak_rss_mib"], ".0f"),
                         _f(r["tau_pooled"]), r["identical"]])
    return _table(["model", "prompt", "planes", "lead", "decode t/s", "speedup vs plain", "replay", "recurrent state",
                   "peak RSS MiB", "τ", "identical"], body)


def cache(folder: Path) -> str:
    body = []
    for path in sorted(folder.glob("cache-*.json")):
        rs = rows(path)
        spec = sorted((r for r in rs if r["kind"] == "spec"), key=lambda r: r["parallel"])
        base = {r["parallel"]: r for r in rs if r["kind"] == "baseline"}
        one = next((r["decode_tps_mean"] for r in spec if r["parallel"] == 1), None)
        for r in spec:
            b = base.get(r["parallel"])
            body.append([_model(path), f"{r['ctk']}/{r['ctv']}", r["parallel"], format(r["decode_tps_mean"], ".1f"),
                         _f(b and b["decode_tps_mean"], ".1f"), _f(r["speedup_mean"]),
                         _f(r["decode_tps_mean"] / one if one else None), _f(r["tau_pooled"]), r["identical"]])
    return _table(["model", "cache", "parallel", "aggregate t/s (spec)", "plain aggregate t/s", "speedup vs plain",
                   "spec aggregate ÷ parallel 1", "τ", "identical"], body)


def main() -> None:
    folder = Path(sys.argv[1] if len(sys.argv) > 1 else "docs/scale")
    for title, table in (("When speculation pays", pays), ("Seed 000's table", seed000),
                         ("Cache types and parallel slots", cache)):
        print(f"### {title}\n\n{table(folder)}\n")


if __name__ == "__main__":
    main()
