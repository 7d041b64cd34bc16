"""The engine's cost per step on the shipped tiny pair (n_threads 1), for paired before/after runs.

    python scripts/step_cost.py simple|dflash|ngram-mod|auto|np8|k0

prints the steps and microseconds per step of one decode of the built-in prompts: one sequence
at a time (draft-simple n_max 3, DFlash n_max 7, ngram-mod, DFlash with `auto`), eight at once
(`np8`: DFlash, 8 sequences per step) or plain steps of a speculative engine (`k0`: sequences added
with speculate=False). The tiny pair decodes in a fraction of a millisecond, so Python's share of
a step shows. To compare two trees, run it alternately with PYTHONPATH set to each checkout, and
compare medians of the paired ratios (timings move 20-50 % from minute to minute here).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from ggspec.bench.prompts import BUILTIN
from ggspec.runtime import ContextParams
from ggspec.speculative.engine import Engine
from ggspec.speculative.models import PairConfig
from ggspec.speculative.request import Request

TINY = Path(__file__).resolve().parent.parent / "models" / "tiny"
TARGET, DRAFT, DFLASH = TINY / "tiny-coder.gguf", TINY / "tiny-coder-draft.gguf", TINY / "tiny-coder-dflash-b8.gguf"
MODES = {
    "simple": dict(draft=DRAFT, spec_type="draft-simple", n_max=3),
    "dflash": dict(draft=DFLASH, n_max=7),
    "ngram-mod": dict(spec_type="ngram-mod", n_max=8),
    "auto": dict(draft=DFLASH, n_max=7, adaptive=True),
    "np8": dict(draft=DFLASH, n_max=7, parallel=8),
    "k0": dict(draft=DFLASH, n_max=7),
}


def decode(eng: Engine, prompts: list, n: int, together: bool, speculate: bool) -> int:
    """Decode every prompt (all at once, or one after another); the number of steps taken."""
    steps = 0
    for batch in ([prompts] if together else [[p] for p in prompts]):
        for p in batch:
            eng.add(Request(p, n, ignore_eos=True, speculate=speculate))
        while eng.active:
            eng.step()
            steps += 1
    return steps


def main(mode: str) -> None:
    options = MODES[mode]
    cfg = PairConfig(target=TARGET, ctx=ContextParams(n_ctx=4096, n_threads=1), **options)
    together, speculate = mode == "np8", mode != "k0"
    with Engine.open(cfg) as eng:
        prompts = [eng.target_model.tokenize(p.text) for p in BUILTIN][:8 if together else None]
        decode(eng, prompts[:2], 16, together, speculate)  # warm-up: graphs built, caches touched
        t0 = time.perf_counter()
        steps = decode(eng, prompts, 64, together, speculate)
        seconds = time.perf_counter() - t0
    print(f"{mode} steps={steps} s={seconds:.3f} us/step={1e6 * seconds / steps:.1f}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "simple")
