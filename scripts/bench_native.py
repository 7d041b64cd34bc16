"""ggspec's Python loop against llama.cpp's own C++ DFlash loop, same build, same models, one run.

    ggspec build --tools && python scripts/bench_native.py [--pair tiny-coder] [-r 3] [-n 256]

Five configurations, in a random order per prompt and repetition so drift hits all alike:
  (1) cpp-immediate  llama-speculative-simple --spec-type draft-dflash (upstream injection)
  (2) cpp-deferred   the same with patch 0003's deferral on (LLAMA_ARG_SPEC_DFLASH_DEFER=1)
  (3) ggspec-immediate, (4) ggspec-pruned (the default), (5) plain greedy (ggspec --no-spec)
Reports median decode t/s as ratios to (1), and checks that all five produce the same text.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tinypair.corpus import heldout_prompts  # noqa: E402

from ggspec.native import build as nb  # noqa: E402
from ggspec.pairs import get_entry, resolve  # noqa: E402
from ggspec.runtime import ContextParams  # noqa: E402
from ggspec.spec.loop import generate_greedy, generate_spec  # noqa: E402
from ggspec.spec.pair import PairConfig, SpecPair  # noqa: E402
from ggspec.spec.stats import RunStats  # noqa: E402

SPEED_RE = re.compile(r"ggspec-bench: decoded (\d+) tokens in (\d+) us")  # patch 0005: full resolution
CONFIGS = ("cpp-immediate", "cpp-deferred", "ggspec-immediate", "ggspec-pruned", "plain")


@dataclass
class CppResult:
    """Decoded text and speed of llama-speculative-simple runs (added up over several runs)."""
    text: str = ""
    n_decoded: int = 0
    seconds: float = 0.0

    def add(self, other: "CppResult") -> None:
        self.n_decoded += other.n_decoded
        self.seconds += other.seconds

    @property
    def tps(self) -> float:
        return self.n_decoded / self.seconds if self.seconds else 0.0


def run_cpp(tool: Path, files, prompt: str, n: int, n_max: int, defer: bool, forced: Path | None = None) -> CppResult:
    """One run of llama.cpp's own DFlash loop; `forced`: a GGSPEC_BENCH_FORCED file (patch 0005)."""
    env = {k: v for k, v in os.environ.items() if k not in ("LLAMA_ARG_SPEC_DFLASH_DEFER", "GGSPEC_BENCH_FORCED")}
    if defer:
        env["LLAMA_ARG_SPEC_DFLASH_DEFER"] = "1"
    if forced is not None:
        env["GGSPEC_BENCH_FORCED"] = str(forced)
    cmd = [str(tool), "-m", str(files.target), "-md", str(files.draft), "--spec-type", "draft-dflash",
           "--spec-draft-n-max", str(n_max), "-p", prompt, "-n", str(n), "--temp", "0", "-t", "1", "-td", "1",
           "-c", "2048", "--ignore-eos", "-fa", "off"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    if proc.returncode != 0:
        raise SystemExit(f"{tool.name} failed: {proc.stderr.strip().splitlines()[-1:]}")
    m = SPEED_RE.search(proc.stderr)
    if not m:
        raise SystemExit(f"could not read the decode speed from {tool.name}'s output")
    # the tool prints "\n\n" before the prompt, and twice after the generated text
    text = proc.stdout[proc.stdout.find(prompt[:32]):]
    text = text[:-4] if text.endswith("\n\n\n\n") else text
    return CppResult(text, int(m.group(1)), int(m.group(2)) / 1e6)


def astuple_text(res: CppResult) -> tuple[str, float]:
    return res.text, res.tps


def run_ggspec(sp: SpecPair, prompt: str, n: int, speculative: bool) -> tuple[str, float]:
    tokens = sp.target_model.tokenize(prompt)
    sp.reset()
    stats, out = RunStats(), []
    steps = (generate_spec(sp.target, sp.proposer, tokens, n + 1, sp.n_max, ignore_eos=True) if speculative
             else generate_greedy(sp.target, tokens, n + 1, ignore_eos=True))
    for step in steps:
        stats.add(step)
        out += step.tokens
    return prompt + sp.target_model.detokenize(out), stats.decode_tps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pair", default="tiny-coder")
    ap.add_argument("-r", type=int, default=3)
    ap.add_argument("-n", type=int, default=256)
    ap.add_argument("--prompts", type=int, default=4)
    args = ap.parse_args()
    info = nb.build(nb.BuildOptions(tools=True))  # cached after `ggspec build --tools`
    tool = Path(info.lib_dir) / "llama-speculative-simple"
    files = resolve(get_entry(args.pair))
    n_max = 7
    ctx = ContextParams(n_ctx=2048, flash_attn="off")
    pairs = {}
    for mode in ("immediate", "pruned"):
        cfg = PairConfig(target=files.target, draft=files.draft, n_max=n_max, ctx=ctx, inject=mode)
        pairs[mode] = SpecPair(cfg, share_models=pairs.get("immediate"))
    prompts = heldout_prompts(args.prompts)
    speeds = {c: [] for c in CONFIGS}
    texts: dict[tuple[int, str], str] = {}
    rng = np.random.default_rng(0)
    for _ in range(args.r):
        for i, prompt in enumerate(prompts):
            runs = {
                "cpp-immediate": lambda: astuple_text(run_cpp(tool, files, prompt, args.n, n_max, defer=False)),
                "cpp-deferred": lambda: astuple_text(run_cpp(tool, files, prompt, args.n, n_max, defer=True)),
                "ggspec-immediate": lambda: run_ggspec(pairs["immediate"], prompt, args.n, True),
                "ggspec-pruned": lambda: run_ggspec(pairs["pruned"], prompt, args.n, True),
                "plain": lambda: run_ggspec(pairs["pruned"], prompt, args.n, False),
            }
            for name in [CONFIGS[j] for j in rng.permutation(len(CONFIGS))]:  # none always follows a C++ process
                text, tps = runs[name]()
                speeds[name].append(tps)
                texts[(i, name)] = text
    # llama-speculative-simple stops after the step that crosses -n, so it may print up to n_max
    # tokens more: compare every output on the length of the shortest one
    def agree(i: int) -> bool:
        outs = [texts[(i, c)] for c in CONFIGS]
        n = min(len(o) for o in outs)
        return len({o[:n] for o in outs}) == 1

    same = all(agree(i) for i in range(len(prompts)))
    for i in range(len(prompts)):
        if not agree(i):
            outs = {c: texts[(i, c)] for c in CONFIGS}
            n = min(len(o) for o in outs.values())
            first = min(k for k in range(n) if len({o[k] for o in outs.values()}) > 1)
            print(f"prompt {i}: outputs differ from character {first}: "
                  + "; ".join(f"{c}: {o[first:first + 20]!r}" for c, o in outs.items()))
    base = statistics.median(speeds["cpp-immediate"])
    print(f"pair {args.pair}, {len(prompts)} held-out prompts x {args.n} tokens, n_max {n_max}, {args.r} repetitions, "
          f"one thread, flash attention off; median decode t/s\n")
    print("| configuration | decode t/s | ratio to (1) |")
    print("|---|---|---|")
    for k, name in enumerate(CONFIGS, 1):
        med = statistics.median(speeds[name])
        print(f"| ({k}) {name} | {med:.0f} | {med / base:.2f} |")
    print(f"\nsame text in all five (on the common length): {'yes' if same else 'NO'}")
    for sp in reversed(pairs.values()):
        sp.close()


if __name__ == "__main__":
    main()
