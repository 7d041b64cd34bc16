"""Write held-out prompts (never distill training prompts) as a `bench --prompts` JSONL file.

    python scripts/heldout_prompts.py -n 12 > heldout.jsonl
    ggspec bench --pair gemma-3-270m --prompts heldout.jsonl ...

They come from the built-in corpus's held-out texts (every 16th text: standard-library sources for
code, reference topics and docstrings for prose), cut at a line start, about --chars long.
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from ggspec.distill import corpus


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=12, help="prompts (half code, half prose)")
    ap.add_argument("--chars", type=int, default=400)
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    _, held = corpus.split(corpus.builtin_texts())
    rng = np.random.default_rng(args.seed)
    for i in range(args.n):
        kind = ("code", "prose")[i % 2]
        pool = [t for t in held if t.kind == kind and len(t.text) > 2 * args.chars]
        text = pool[int(rng.integers(len(pool)))].text
        start = text.find("\n", int(rng.integers(len(text) - args.chars))) + 1
        prompt = text[start:start + args.chars]
        prompt = prompt[:prompt.rfind("\n") + 1] or prompt  # end at a line end
        print(json.dumps({"prompt": prompt, "category": f"held-{kind}"}))


if __name__ == "__main__":
    main()
