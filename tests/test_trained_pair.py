"""The shipped trained pair (tiny-coder) on held-out text: lossless up to genuine near-ties, and it
really speculates. Output is deterministic for a given build, so these are not timing tests."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from ggspec.catalogue.pairs import get_entry, resolve
from ggspec.runtime import ContextParams
from ggspec.speculative.engine import Engine
from ggspec.speculative.lossless import run_prompts
from ggspec.speculative.models import PairConfig
from ggspec.speculative.stats import merge

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from tinypair.corpus import heldout_prompts  # noqa: E402

N_PROMPTS, N_PREDICT = 20, 128


@pytest.fixture(scope="module")
def runs(build_info):
    files = resolve(get_entry("tiny-coder"))
    ctx = ContextParams(n_ctx=1024, type_k="f32", type_v="f32", flash_attn="off")
    with Engine.open(PairConfig(target=files.target, draft=files.draft, n_max=7, ctx=ctx)) as sp:
        return list(run_prompts(sp, heldout_prompts(N_PROMPTS), N_PREDICT))


def test_lossless_on_heldout_prompts(runs):
    exact = [r for r in runs if r.divergence is None]
    ties = [r.divergence for r in runs if r.divergence is not None and r.divergence.benign]
    real = [r.divergence for r in runs if r.divergence is not None and not r.divergence.benign]
    print(f"\n{len(exact)}/{len(runs)} prompts identical, {len(ties)} benign near-ties"
          + "".join(f"\n  {d.describe()}" for d in ties))
    assert not real, "\n".join(d.describe() for d in real)
    assert sum(len(r.plain) for r in runs) == N_PROMPTS * N_PREDICT


def test_the_pair_really_speculates(runs):
    stats = merge(r.spec_stats for r in runs)
    print(f"\ntau {stats.tau:.2f} (pooled), acceptance {stats.acceptance_rate:.1%}, histogram {stats.accept_hist}")
    assert stats.tau >= 3.0
    assert stats.accept_hist[-1] > 0  # whole blocks get accepted
