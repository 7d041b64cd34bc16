#!/usr/bin/env python3
"""What a reduced draft vocabulary (--spec-draft-vocab N) costs in acceptance, on a real model.

A draft position whose target token lies outside the N tokens the chained head scores is rejected
whatever the head predicts, so the share of a model's own greedy tokens outside them is the most
acceptance the cut can cost (a trained head also loses less, since it rarely predicts those
tokens well). This decodes the built-in bench prompts plainly and reports that share for each N,
with ggspec's choice of the N tokens (ggspec.speculative.types.draft_vocab: the N most common in the
standard library's source, plus the end-of-generation tokens) and, for comparison, the N lowest ids.

    python scripts/vocab_coverage.py --pair gemma-3-270m [-n 128] [--sizes 8192,16384,32768,65536]
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from ggspec.bench.prompts import load_prompts
from ggspec.catalogue.pairs import get_entry, resolve
from ggspec.runtime import ContextParams
from ggspec.speculative.engine import Engine
from ggspec.speculative.driver import generate_greedy
from ggspec.speculative.models import PairConfig
from ggspec.speculative.types.draft_vocab import draft_vocab_ids


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pair", required=True)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("--sizes", default="8192,16384,32768,65536")
    ap.add_argument("-t", "--threads", type=int, default=2)
    args = ap.parse_args()
    files = resolve(get_entry(args.pair))
    cfg = PairConfig(target=files.target, ctx=ContextParams(n_ctx=2048, n_threads=args.threads))
    tokens: list[int] = []
    with Engine.open(cfg, plain=True) as eng:
        model = eng.target_model
        for p in load_prompts(None):
            prompt = model.tokenize(p.text)
            tokens += [t for st in generate_greedy(eng, prompt, args.n, ignore_eos=True) for t in st.tokens]
        out = {"pair": args.pair, "n_vocab": model.n_vocab, "tokens": len(tokens), "outside": {},
               "outside_lowest_ids": {}}
        toks = np.asarray(tokens)
        for n in (int(x) for x in args.sizes.split(",")):
            kept = np.zeros(model.n_vocab, dtype=bool)
            kept[draft_vocab_ids(model, n)] = True
            out["outside"][n] = round(float(np.mean(~kept[toks])), 4)
            out["outside_lowest_ids"][n] = round(float(np.mean(toks >= n)), 4)
    print(json.dumps(out, indent=1))
    print("| draft vocabulary | greedy tokens outside it: most common (ggspec) | ... lowest ids |\n|---|---|---|")
    for n, share in out["outside"].items():
        print(f"| {n} of {out['n_vocab']} | {100 * share:.1f} % | {100 * out['outside_lowest_ids'][n]:.1f} % |")


if __name__ == "__main__":
    main()
