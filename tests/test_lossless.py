"""Losslessness: speculative greedy output equals plain greedy output, token for token.

Run on the real patched build with tiny random-weight pairs (dense qwen3 and hybrid qwen35),
with the real DFlash draft and with forced acceptance lengths covering 0..n_max.
At a divergence the report gives the target's own top-2 margin there (see ggspec.speculative.lossless).
The hybrid target keeps F32 matrices and wide logit margins: every prompt must match exactly.
The dense target has F16 matrices like converted files, whose activations are rounded to F16
inside the matmuls: there, as on real models, a batched verify can flip a genuine near-tie; such
a divergence is allowed only when the target's own top-2 margin there is tiny (and is reported),
never a real one.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from conftest import PROMPTS

from ggspec.bench.forced import ForcedAcceptance, cycle_lengths
from ggspec.runtime import ContextParams
from ggspec.speculative.engine import Engine
from ggspec.speculative.lossless import run_prompts
from ggspec.speculative.models import PairConfig
from ggspec.speculative.stats import merge

N_PREDICT = 128
N_MAX = 7  # the fixtures' block size is 8
EXACT = ContextParams(n_ctx=1024, n_batch=256, n_ubatch=256, n_threads=1, type_k="f32", type_v="f32",
                      flash_attn="off")


def _open(pair) -> Engine:
    return Engine.open(PairConfig(target=pair.target, draft=pair.draft, fixed_block=True, n_max=N_MAX, ctx=EXACT))


def test_token_trees_equal_greedy_on_the_converter_shaped_pair(dense_pair, build_info):
    """The dense converter-shaped pair with its DFlash draft verifying token trees of 16 nodes
    (tree_verify.py): every prompt's output equals plain greedy but for near-ties (F16 rounding),
    and trees were verified."""
    cfg = PairConfig(target=dense_pair.target, draft=dense_pair.draft, fixed_block=True, n_max=N_MAX, ctx=EXACT,
                     tree_budget=16, tree_auto=False)
    with Engine.open(cfg) as sp:
        assert sp.tree_rule is not None and sp.target.kv_unified
        runs = list(run_prompts(sp, PROMPTS, N_PREDICT))
    diverged = [(i, r.divergence) for i, r in enumerate(runs) if r.divergence]
    report = "\n".join(f"prompt {i}: {d.describe()}" for i, d in diverged)
    assert all(d.benign for _, d in diverged), report
    assert len(diverged) <= len(PROMPTS) // 4, f"too many near-ties for F16 rounding:\n{report}"
    assert sum(r.spec_stats.tree_steps for r in runs) > 0


def _forced(sp: Engine, offsets):
    """A proposer factory forcing acceptance lengths 0..n_max, each prompt starting elsewhere."""
    def make(prompt, plain):
        lengths = itertools.islice(cycle_lengths(N_MAX), next(offsets), None)
        return ForcedAcceptance(sp.proposer, np.concatenate([prompt, plain]), lengths, sp.target_model.n_vocab)
    return make


@pytest.mark.parametrize("kind", ["dense", "hybrid"])
@pytest.mark.parametrize("proposer", ["dflash", "forced"])
def test_speculative_equals_greedy(kind, proposer, request, build_info):
    pair = request.getfixturevalue(f"{kind}_pair")
    with _open(pair) as sp:
        assert sp.target_model.is_recurrent == (kind == "hybrid")
        make = _forced(sp, itertools.count()) if proposer == "forced" else None
        runs = list(run_prompts(sp, PROMPTS, N_PREDICT, make))
    diverged = [(i, r.divergence) for i, r in enumerate(runs) if r.divergence]
    report = "\n".join(f"prompt {i}: {d.describe()}" for i, d in diverged)
    if kind == "hybrid":
        assert not diverged, report  # F32 matrices: exact
    else:
        assert all(d.benign for _, d in diverged), report
        assert len(diverged) <= len(PROMPTS) // 4, f"too many near-ties for F16 rounding:\n{report}"
        print(report)  # which prompts were near-ties, and their margins (pytest -s shows them)
    assert sum(len(r.plain) for r in runs) == len(PROMPTS) * N_PREDICT
    if proposer == "forced":
        hist = merge(r.spec_stats for r in runs).accept_hist
        assert len(hist) == N_MAX + 1 and all(hist), f"some acceptance length never happened: {hist}"


def test_gate_catches_an_off_by_one_accept(dense_pair, build_info, monkeypatch):
    """The gate has teeth: accepting one draft too many changes the output, and the margin
    there classifies it as a real divergence, not a near-tie."""
    from ggspec.speculative.verifier import GreedyVerifier, Outcome

    class OffByOne(GreedyVerifier):
        """Accepts one draft more than the target agrees with (a broken acceptance rule)."""

        def verify(self, logits, spans):
            out = []
            for (seq, draft, row0), o in zip(spans, super().verify(logits, spans)):
                a = min(len(draft), o.accepted + 1)
                rows = logits[row0:row0 + len(draft) + 1].argmax(axis=1)
                out.append(Outcome(a, [int(t) for t in draft.tokens[:a]] + [int(rows[a])]))
            return out

    with _open(dense_pair) as sp:
        sp.verifier = OffByOne()
        (run,) = run_prompts(sp, PROMPTS[:1], N_PREDICT, _forced(sp, itertools.count()))
    assert run.divergence is not None, "an off-by-one acceptance went unnoticed"
    assert not run.divergence.benign, run.divergence.describe()


PLANE_PROMPTS = PROMPTS[:6]


@pytest.mark.parametrize("planes", [3, 4, 5])
@pytest.mark.parametrize("lead", [0, "default", "auto"])
@pytest.mark.parametrize("proposer", ["dflash", "forced"])
def test_capped_planes_are_lossless(planes, lead, proposer, hybrid_pair, build_info):
    """Every capped layout gives plain greedy output; forced acceptance makes misses replay."""
    from ggspec.speculative.planes import PlaneOptions

    cfg = PairConfig(target=hybrid_pair.target, draft=hybrid_pair.draft, fixed_block=True, n_max=N_MAX, ctx=EXACT,
                     planes=PlaneOptions(planes, lead))
    with Engine.open(cfg) as sp:
        make = _forced(sp, itertools.count()) if proposer == "forced" else None
        runs = list(run_prompts(sp, PLANE_PROMPTS, N_PREDICT, make))
    failures = [f"prompt {i}: {r.divergence.describe()}" for i, r in enumerate(runs) if r.divergence]
    assert not failures, "\n".join(failures)
    stats = merge(r.spec_stats for r in runs)
    if proposer == "forced":
        assert stats.replays > 0  # some accepted counts are not kept: the replay path ran
        assert all(stats.accept_hist)


@pytest.mark.parametrize("planes", [None, 4])
def test_no_state_leaks_across_prompts(planes, hybrid_pair, build_info):
    """A prompt after an unrelated one on the same contexts runs exactly as it does alone:
    same tokens, same accepted counts and replays at every step (no state of one request reaches the next)."""
    from ggspec.speculative.driver import generate_spec
    from ggspec.speculative.planes import PlaneOptions

    cfg = PairConfig(target=hybrid_pair.target, draft=hybrid_pair.draft, fixed_block=True, n_max=N_MAX, ctx=EXACT,
                     planes=PlaneOptions(planes, "default"))

    def steps_of(sp, text):
        sp.reset()
        prompt = sp.target_model.tokenize(text)
        ref = [t for r in run_prompts(sp, [text], N_PREDICT) for t in r.plain]
        sp.reset()
        forced = ForcedAcceptance(sp.proposer, np.concatenate([prompt, ref]), cycle_lengths(N_MAX),
                                  sp.target_model.n_vocab)
        return [(s.tokens, s.accepted, s.replayed)
                for s in generate_spec(sp, prompt, N_PREDICT, proposer=forced, ignore_eos=True)]

    with Engine.open(cfg) as sp:
        alone = steps_of(sp, PROMPTS[3])
    with Engine.open(cfg) as sp:
        steps_of(sp, PROMPTS[7])  # an unrelated request first
        after = steps_of(sp, PROMPTS[3])
    assert after == alone
