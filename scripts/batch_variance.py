#!/usr/bin/env python3
"""Localise batch variance: a token's logits decoded alone vs as row i of a k-row batch.

For each model, attention setting and repack setting, with the CPU backend's batch invariance
(patches 0021, 0022) on and off in the same process: every row of k-row decodes (k = 2 ... 256,
each row compared) after several cache fills against the same tokens decoded one at a time, the
same rows beside three other sequences' rows, a 600-token prompt prefilled one token at a time vs
in chunks of 7, 64, 128, 512 rows and whole, and where a row differs the first graph node that
differs and its op (the kernel behind it). Prints a markdown table; -o saves the JSON.

    python scripts/batch_variance.py --pair gemma-3-270m --pair qwen2.5-coder-1.5b -t 2
    python scripts/batch_variance.py -m model.gguf --fa on --fa off --repack on --repack off
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path

from ggspec.bench.invariance import kernel_behind, model_arguments, model_paths, probe
from ggspec.native.bindings import batch_invariant, set_batch_invariant


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    model_arguments(ap, "probed", "both")
    ap.add_argument("--invariant", action="append", choices=("on", "off"),
                    help="the CPU backend's batch invariance (default both, off first)")
    ap.add_argument("--rows", default="2,4,8,16,64,160,256", help="batch sizes k (every row of each is compared)")
    ap.add_argument("--fills", default="3,40,600", help="cache cells before the batch (>= 512: the KV split)")
    ap.add_argument("-t", "--threads", type=int, default=1)
    ap.add_argument("-ngl", "--n-gpu-layers", type=int, default=0,
                    help="layers on the GPU (-1: all): the probe of a device backend (the first differing node "
                         "is read on the CPU side only)")
    ap.add_argument("-o", "--output", type=Path, help="save the JSON here")
    args = ap.parse_args()
    paths = model_paths(ap, args)
    ks = tuple(int(k) for k in args.rows.split(","))
    fills = tuple(int(f) for f in args.fills.split(","))
    initial = batch_invariant()
    reports = []
    print("| model | invariant | fa | repack | rows identical | chunks identical | worst diff | first differing node: kernel |")
    print("|---|---|---|---|---|---|---|---|")
    try:
        for path in paths:
            for inv in args.invariant or ("off", "on"):
                set_batch_invariant(inv == "on")
                for fa in args.fa or ("on", "off"):
                    for repack in args.repack or ("on", "off"):
                        r = probe(path, fa, repack == "on", fills=fills, ks=ks, n_threads=args.threads,
                                  n_gpu_layers=args.n_gpu_layers, locate=args.n_gpu_layers == 0, prompt=600,
                                  chunk_sizes=(7, 64, 128, 512, "whole"), neighbours=4)
                        reports.append(r)
                        same = sum(x.identical for x in r.rows)
                        chunks = sum(d == 0.0 for _c, d in r.chunks)
                        worst = next((x for x in r.rows if not x.identical), None)
                        node = (f"{r.node.name} ({r.node.op}, {r.node.src0_type}): "
                                f"{kernel_behind(r.node, worst.k, r.repack)}") if r.node and worst else "-"
                        print(f"| {path.name} | {inv} | {fa} | {repack} | {same}/{len(r.rows)} | "
                              f"{chunks}/{len(r.chunks)} | {r.worst():.3g} | {node} |", flush=True)
    finally:
        set_batch_invariant(initial > 0, initial or None)
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps({"threads": args.threads, "rows": ks, "fills": fills,
                                           "reports": [asdict(r) for r in reports]}, indent=1) + "\n")


if __name__ == "__main__":
    main()
