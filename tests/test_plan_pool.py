"""The prepared-plan pool (patch 0012, `--plan-pool`, `LLAMA_SCHED_POOL`).

Alternating shapes run parked plans instead of re-planning, with bit-identical logits; a reset
point (a setting that makes llama.cpp reserve its scheduler again) drops the parked plans and the
outputs stay right; prompts keep to the reserved scheduler; speculative output with the pool
equals plain greedy output; llama.cpp's own loop takes the pool from LLAMA_SCHED_POOL and logs it.
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import replace

import numpy as np
import pytest
from conftest import PROMPTS
from helpers.pairs import DFLASH, DRAFT, TARGET

from ggspec.bench.native import TOOL, find_tool, sampler_args
from ggspec.errors import InputError
from ggspec.runtime import Batch, Context, ContextParams
from ggspec.speculative.driver import generate_greedy, generate_spec
from ggspec.speculative.engine import Engine
from ggspec.speculative.models import Models, PairConfig

CTX = ContextParams(n_ctx=1024, n_threads=1, flash_attn="off")
SHAPES = [1, 8, 1, 3, 8, 2, 1, 8, 3]  # rows of the decodes, again and again


@pytest.fixture(scope="module")
def models():
    with Models(PairConfig(target=TARGET, ctx=CTX)) as m:
        yield m


def _logits(ctx: Context, shapes, rounds: int = 6, reset=None) -> list[np.ndarray]:
    """Decode rows at position 40 (then cut back) for every shape, `rounds` times; all logits."""
    batch = Batch(ctx)
    batch.add_tokens(np.arange(40, dtype=np.int32) % 50 + 20, 0, 0, outputs="none")
    ctx.decode(batch)
    out = []
    for r in range(rounds):
        if reset is not None and r == rounds // 2:
            reset(ctx)
        for n in shapes:
            batch.clear().add_tokens((np.arange(n, dtype=np.int32) * 7 + r) % 50 + 20, 40, 0, outputs="all")
            ctx.decode(batch)
            out.append(ctx.logits_view().copy())
            ctx.truncate(40, 0)
    batch.close()
    return out


def test_alternating_shapes_run_parked_plans_with_the_same_logits(models):
    plain = Context(models.target, CTX, what="no pool")
    pooled = Context(models.target, CTX, what="pool")
    pooled.set_plan_pool(8)
    want, got = _logits(plain, SHAPES), _logits(pooled, SHAPES)
    assert all(np.array_equal(a, b) for a, b in zip(want, got))
    reused, hits, built = pooled.plan_stats()
    calls = len(SHAPES) * 6 + 1
    assert plain.plan_stats()[0] < calls // 3  # one plan: only a shape repeated right away is reused
    assert hits > calls // 2 and reused >= hits and built <= 6  # four shapes (and the prompt's) built once
    one = Context(models.target, CTX, what="pool of one")
    one.set_plan_pool(1)
    _logits(one, [1, 8])  # two shapes take turns: one parked plan is enough
    assert one.plan_stats()[1] >= 9
    for c in (plain, pooled, one):
        c.close()


def test_a_reset_point_drops_the_parked_plans_and_outputs_stay_right(models):
    plain = Context(models.target, CTX, what="no pool")
    pooled = Context(models.target, CTX, what="pool")
    pooled.set_plan_pool(4)
    # extracting a layer's inputs (DFlash): llama.cpp reserves its scheduler again before the next decode
    extract = lambda ctx: ctx.enable_layer_inputs([1, 2])  # noqa: E731
    want, got = _logits(plain, SHAPES, reset=extract), _logits(pooled, SHAPES, reset=extract)
    assert all(np.array_equal(a, b) for a, b in zip(want, got))
    assert pooled.plan_stats()[2] >= 8  # the shapes were built again after the reset
    plain.close()
    pooled.close()


@pytest.mark.parametrize("draft,kind", [(DFLASH, None), (DRAFT, "draft-simple")])
def test_speculative_output_with_the_pool_is_plain_greedy_output(draft, kind):
    cfg = PairConfig(target=TARGET, draft=draft, spec_type=kind, n_max=3, ctx=CTX, plan_pool=8)
    with Engine.open(replace(cfg, plan_pool=0)) as base:
        want = [[t for s in generate_greedy(base, base.target_model.tokenize(p), 64, ignore_eos=True) for t in s.tokens]
                for p in PROMPTS[:4]]
    with Engine.open(cfg) as eng:
        got = [[t for s in generate_spec(eng, eng.target_model.tokenize(p), 64, ignore_eos=True) for t in s.tokens]
               for p in PROMPTS[:4]]
        assert got == want
        reused, hits, _ = eng.draft_ctx.plan_stats()
        # the draft's shapes take turns (DFlash: inject and noise block; draft-simple: catch-up and steps)
        assert hits > 0.4 * eng.draft_ctx.n_decodes and reused >= hits


def test_the_pool_size_is_checked():
    with pytest.raises(InputError, match="prepared plans must be 0..64"):
        PairConfig(target=TARGET, plan_pool=65).validate()


def test_llama_cpps_loop_takes_the_pool_from_its_environment(build_info):
    tool = find_tool(TOOL)
    cmd = [str(tool), "-m", str(TARGET), "-md", str(DFLASH), "--spec-type", "draft-dflash", "--spec-draft-n-max", "3",
           "-p", PROMPTS[0], "-n", "32", "-t", "1", "-td", "1", "-c", "1024", "--ignore-eos", "-fa", "off", "-v",
           *sampler_args(None)]  # greedy
    env = {k: v for k, v in os.environ.items() if k != "LLAMA_SCHED_POOL"}
    off = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    on = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env={**env, "LLAMA_SCHED_POOL": "4"})
    assert off.returncode == 0 and on.returncode == 0, on.stderr[-2000:]
    assert "prepared plans" not in off.stderr
    # "~llama_context: prepared plans: R graphs reused (H from the pool of 4), B built", one line per
    # context freed (the tool frees them before its log's last flush: patch 0012); the first line is
    # a context that only measured memory
    stats = [tuple(map(int, m.groups())) for m in
             re.finditer(r"prepared plans: (\d+) graphs reused \((\d+) from the pool of 4\), (\d+) built", on.stderr)]
    used = [s for s in stats if s[2] > 0]
    assert len(used) == 2, stats  # the target's and the draft's
    assert any(hits > 0 for _, hits, _ in used), stats
    assert off.stdout == on.stdout  # the same (greedy) text
