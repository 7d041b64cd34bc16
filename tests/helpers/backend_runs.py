"""Greedy speculative runs on the hybrid fixtures, as JSON: one process per backend.

A process loads one llama.cpp build, so tests/test_vulkan.py runs this script twice, once on the
current (CPU) build with `-ngl 0` and once on the Vulkan build (`$GGSPEC_BUILD`) with every layer of
target and draft on the device, and compares what the two print:

    python tests/helpers/backend_runs.py FIXTURE_DIR N_GPU_LAYERS [CASE ...]   (default: NGRAM_CASES)

Each case is a draft type on the hybrid target (qwen35) with capped planes in some layout, driven
by forced acceptance (every accepted count happens, the missed ones replay from the planes). For each case and prompt it prints the plain greedy tokens, the speculative tokens,
whether and how they diverged (benign: below the target's 0.2-nat top-2 margin gate), and the
replay and acceptance counts.
"""

from __future__ import annotations

import itertools
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ggspec.bench.forced import ForcedAcceptance, cycle_lengths
from ggspec.runtime import ContextParams
from ggspec.speculative.engine import Engine
from ggspec.speculative.lossless import run_prompts
from ggspec.speculative.models import PairConfig
from ggspec.speculative.planes import PlaneOptions
from ggspec.speculative.stats import merge
from ggspec.speculative.types.mtp import MTPOptions
from ggspec.speculative.types.ngram_mod import NgramModOptions

PROMPTS = ["def fibonacci(n):", "The quick brown fox", "x = [1, 2, 3]\ny = "]
N_PREDICT = 40
N_MAX = 4
# F32 caches, no flash attention: a one-token decode and a verify batch round alike
EXACT = ContextParams(n_ctx=512, n_batch=128, n_ubatch=128, n_threads=2, type_k="f32", type_v="f32",
                      flash_attn="off")


@dataclass(frozen=True)
class Case:
    spec_type: str
    planes: int | None  # None: uncapped
    lead: int | str = "default"
    draft: str = "hybrid-dflash"  # which fixture drafts: see _draft
    forced: bool = True  # forced acceptance: the target's continuation replaces the type's drafts
    options: dict = field(default_factory=dict, compare=False)

    @property
    def name(self) -> str:
        planes = "uncapped" if self.planes is None else f"{self.planes}p"
        return f"{self.spec_type}/{planes}/lead-{self.lead}"


LAYOUTS = [(None, "default"), (2, 0), (3, 0), (3, 1), (3, "default"), (4, 0), (4, 2), (4, "default"),
           (5, 1), (5, 3)]
# the types that draft without a draft context, forced: ngram-simple on every plane layout, the
# others with 3 capped planes. Run by default (tests/test_vulkan.py runs them on lavapipe).
NGRAM_CASES = [Case("ngram-simple", p, lead, draft="") for p, lead in LAYOUTS] + [
    Case("ngram-map-k", 3, "default", draft=""),
    Case("ngram-map-k4v", 3, "default", draft=""),
    Case("ngram-mod", 3, "default", draft="", options={"ngram-mod": NgramModOptions(n_match=2, n_max=4, n_min=1)}),
    Case("ngram-cache", 3, "default", draft=""),
]
# the types with a draft model or head: run when named. On lavapipe (Mesa 22.3.6) a decode of a
# context with device sampling or layer-input extraction crashes inside the driver's queue thread,
# so they run on real Vulkan GPUs only (see tests/test_vulkan.py)
DRAFT_CASES = [Case("draft-dflash", p, lead) for p, lead in LAYOUTS] + [
    Case("draft-simple", 3, "default", draft="dense-target"),
    Case("draft-eagle3", 3, "default", draft="hybrid-eagle3"),
    Case("draft-mtp", 3, "default", draft="mtp-head", options={"draft-mtp": MTPOptions(chain=True)}),
]
CASES = NGRAM_CASES + DRAFT_CASES


def _files(fixture_dir: Path, case: Case) -> tuple[Path, Path | None]:
    """(target, draft) of a case, written once into fixture_dir."""
    from ggspec.catalogue.tiny import ensure_tiny_pair

    hybrid = ensure_tiny_pair(fixture_dir, "hybrid")
    if case.draft == "hybrid-dflash":
        return hybrid.target, hybrid.draft
    if case.draft == "dense-target":
        return hybrid.target, ensure_tiny_pair(fixture_dir, "dense").target
    if case.draft == "hybrid-eagle3":
        from helpers.fixtures.eagle3 import write_eagle3_head

        head = fixture_dir / "eagle3-hybrid" / "head.gguf"
        if not head.is_file():
            head.parent.mkdir(parents=True, exist_ok=True)
            write_eagle3_head(head, target_kind="hybrid", layers=(1, 2, 4))
        return hybrid.target, head
    if case.draft == "mtp-head":
        from helpers.fixtures.mtp_head import ensure_fitted

        return ensure_fitted(fixture_dir, ensure_tiny_pair(fixture_dir, "hybrid-mtp").target), None
    return hybrid.target, None


def run_case(fixture_dir: Path, case: Case, n_gpu_layers: int) -> dict:
    target, draft = _files(fixture_dir, case)
    cfg = PairConfig(target=target, draft=draft, spec_type=case.spec_type, n_max=N_MAX, ctx=EXACT,
                     n_gpu_layers=n_gpu_layers, n_gpu_layers_draft=n_gpu_layers,
                     planes=PlaneOptions(case.planes, case.lead), spec_options=dict(case.options))
    with Engine.open(cfg) as sp:
        offsets = itertools.count()

        def forced(prompt, plain):
            lengths = itertools.islice(cycle_lengths(N_MAX), next(offsets), None)
            return ForcedAcceptance(sp.proposer, np.concatenate([prompt, plain]), lengths, sp.target_model.n_vocab)

        runs = list(run_prompts(sp, PROMPTS, N_PREDICT, forced if case.forced else None))
    stats = merge(r.spec_stats for r in runs)
    return {
        "plain": [[int(t) for t in r.plain] for r in runs],
        "spec": [[int(t) for t in r.spec] for r in runs],
        "divergences": [r.divergence.describe() if r.divergence else None for r in runs],
        "benign": all(r.divergence.benign for r in runs if r.divergence),
        "replays": stats.replays,
        "capped": case.planes is not None and case.planes < N_MAX + 1,  # fewer planes than a verify has rows
        "accepted": stats.accepted,
    }


def main(argv: list[str]) -> None:
    fixture_dir, n_gpu_layers, names = Path(argv[0]), int(argv[1]), set(argv[2:])
    chosen = [c for c in CASES if c.name in names] if names else NGRAM_CASES
    results = {c.name: run_case(fixture_dir, c, n_gpu_layers) for c in chosen}
    json.dump(results, sys.stdout)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # (run as a script: tests/ for helpers.fixtures)
    main(sys.argv[1:])
