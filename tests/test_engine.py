"""The engine with many sequences: every sequence's output is its solo greedy output, the llama.cpp
calls per step do not grow with the number of sequences, and sequences join and leave between steps.

The hybrid target (F32, wide margins) must match exactly; the dense F16 target may flip a genuine
near-tie in a larger batch, which the oracle names (and only a tiny margin passes)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from conftest import PROMPTS

from ggspec.bench.forced import ForcedAcceptance, cycle_lengths
from ggspec.catalogue.pairs import get_entry, resolve
from ggspec.errors import InputError
from ggspec.runtime import ContextParams
from ggspec.speculative.driver import generate_greedy
from ggspec.speculative.engine import CapacityError, Engine
from ggspec.speculative.lossless import compare
from ggspec.speculative.models import Models, PairConfig
from ggspec.speculative.planes import PlaneOptions
from ggspec.speculative.request import Request

N_PREDICT = 48
N_MAX = 7
EXACT = ContextParams(n_ctx=2048, n_batch=512, n_ubatch=512, n_threads=1, type_k="f32", type_v="f32", flash_attn="off")


def _solo(models, cfg, prompts):
    """Each prompt's plain greedy output and margins, alone on a parallel-1 engine."""
    with Engine(models, replace(cfg, parallel=1), plain=True) as eng:
        out = []
        for p in prompts:
            steps = list(generate_greedy(eng, p, N_PREDICT, record_margins=True, ignore_eos=True))
            out.append(([t for s in steps for t in s.tokens], [m for s in steps for m in s.margins]))
        return out


def _together(eng, prompts, proposer=None, speculate=True):
    if proposer is not None:
        eng.proposer = proposer
    seqs = [eng.add(Request(p, N_PREDICT, ignore_eos=True, tag=i, speculate=speculate)) for i, p in enumerate(prompts)]
    list(eng.run())
    return seqs


def _check(seqs, solo):
    failures = []
    for s in seqs:
        plain, margins = solo[s.tag]
        div = compare(plain, margins, s.tokens)
        if div is not None and not div.benign:
            failures.append(f"sequence {s.tag}: {div.describe()}")
    assert not failures, "\n".join(failures)
    return [compare(*solo[s.tag], s.tokens) for s in seqs]


@pytest.mark.parametrize("kind", ["dense", "hybrid"])
@pytest.mark.parametrize("parallel", [2, 4])
def test_every_sequence_equals_its_solo_greedy_output(kind, parallel, request, build_info):
    pair = request.getfixturevalue(f"{kind}_pair")
    cfg = PairConfig(target=pair.target, draft=pair.draft, n_max=N_MAX, ctx=EXACT, parallel=parallel)
    with Models(cfg) as models:
        prompts = [models.target.tokenize(t) for t in PROMPTS[:parallel + 1]]  # one more than the slots
        solo = _solo(models, cfg, prompts)
        with Engine(models, cfg) as eng:
            refs = [np.concatenate([p, solo[i][0]]) for i, p in enumerate(prompts)]
            forced = ForcedAcceptance(eng.proposer, lambda seq: refs[seq.tag], cycle_lengths(N_MAX), models.target.n_vocab)
            seqs = [eng.add(Request(p, N_PREDICT, ignore_eos=True, tag=i)) for i, p in enumerate(prompts[:parallel])]
            with pytest.raises(CapacityError):
                eng.add(Request(prompts[-1], N_PREDICT))  # every slot is taken
            eng.proposer = forced
            list(eng.run())
            divergences = _check(seqs, solo)
            if kind == "hybrid":
                assert divergences == [None] * parallel
            assert eng.stats.max_calls <= 3  # inject, draft, verify: whatever the number of sequences
            assert all(s.stats.accept_hist and len(s.stats.accept_hist) > 1 for s in seqs)
            assert not eng.active and eng.can_add(prompts[-1], N_PREDICT)  # everything was freed


def test_sequences_join_and_leave_between_steps(dense_pair, build_info):
    """Continuous batching: a sequence added mid-run, one cancelled, one with a short budget."""
    cfg = PairConfig(target=dense_pair.target, draft=dense_pair.draft, n_max=N_MAX, ctx=EXACT, parallel=3)
    with Models(cfg) as models:
        prompts = [models.target.tokenize(t) for t in PROMPTS[:4]]
        solo = _solo(models, cfg, prompts)
        with Engine(models, cfg) as eng:
            a = eng.add(Request(prompts[0], N_PREDICT, ignore_eos=True, tag=0))
            b = eng.add(Request(prompts[1], 5, ignore_eos=True, tag=1))
            c = eng.add(Request(prompts[2], N_PREDICT, ignore_eos=True, tag=2))
            for _ in range(3):
                eng.step()
            eng.cancel(c)
            assert c.cancelled and c not in eng.active
            d = eng.add(Request(prompts[3], N_PREDICT, ignore_eos=True, tag=3))  # takes the freed slot
            assert d.seq_id == c.seq_id
            list(eng.run())
            assert b.tokens == solo[1][0][:5]
            _check([a, d], solo)


def test_plain_steps_batch_too(hybrid_pair, build_info):
    """--no-spec at parallel N: one target call per step for all sequences, solo outputs."""
    cfg = PairConfig(target=hybrid_pair.target, draft=hybrid_pair.draft, n_max=N_MAX, ctx=EXACT, parallel=4)
    with Models(cfg) as models:
        prompts = [models.target.tokenize(t) for t in PROMPTS[:4]]
        solo = _solo(models, cfg, prompts)
        with Engine(models, cfg, plain=True) as eng:
            seqs = _together(eng, prompts)
            assert _check(seqs, solo) == [None] * 4
            assert eng.stats.max_calls == 1 and eng.stats.steps == N_PREDICT  # one token per step


@pytest.mark.parametrize("planes", [3, 4])
def test_capped_planes_replay_several_sequences_in_one_call(planes, hybrid_pair, build_info):
    cfg = PairConfig(target=hybrid_pair.target, draft=hybrid_pair.draft, n_max=N_MAX, ctx=EXACT, parallel=3,
                     planes=PlaneOptions(planes, "default"))
    with Models(cfg) as models:
        prompts = [models.target.tokenize(t) for t in PROMPTS[4:7]]
        solo = _solo(models, cfg, prompts)
        with Engine(models, cfg) as eng:
            refs = [np.concatenate([p, solo[i][0]]) for i, p in enumerate(prompts)]
            forced = ForcedAcceptance(eng.proposer, lambda seq: refs[seq.tag], cycle_lengths(N_MAX),
                                      models.target.n_vocab)
            eng.proposer = forced
            # different budgets: near its end a sequence drafts fewer tokens than the others, and
            # its shorter span must not split the others' spans across ubatches (their planes)
            seqs = [eng.add(Request(p, n, ignore_eos=True, tag=i)) for i, (p, n) in enumerate(zip(prompts, (N_PREDICT, 21, 34)))]
            list(eng.run())
            for s in seqs:
                assert s.tokens == solo[s.tag][0][:len(s.tokens)] and len(s.tokens) == s.n_predict
            assert sum(s.stats.replays for s in seqs) > 0
            # inject, draft, verify, then for the replay: inject the verified rows, replay; whatever
            # the number of sequences
            assert eng.stats.max_calls <= 5


def test_capacity_is_checked_before_anything_runs(dense_pair, build_info):
    small = replace(EXACT, n_ctx=512)
    cfg = PairConfig(target=dense_pair.target, draft=dense_pair.draft, n_max=N_MAX, ctx=small, parallel=2)
    with Engine.open(cfg) as eng:
        assert eng.capacity == 256  # every slot has its own cells: -c / -np
        prompt = eng.target_model.tokenize(PROMPTS[0])
        eng.add(Request(prompt, 200))
        eng.add(Request(prompt, 200))
        assert not eng.can_add(prompt, 200)
        with pytest.raises(CapacityError, match="slots are busy"):
            eng.add(Request(prompt, 200))
        with pytest.raises(InputError) as err:
            eng.add(Request(np.zeros(0, dtype=np.int32), 4))
        assert err.value.field == "prompt"
        with pytest.raises(InputError) as err:
            eng.check_prompt(np.ones(250, dtype=np.int32))  # with a draft block it needs 258 positions
        assert err.value.field == "prompt" and "holds 256" in str(err.value)
    with pytest.raises(InputError) as err:
        Engine.open(replace(cfg, parallel=64, ctx=replace(small, n_batch=256, n_ubatch=256)))
    assert err.value.field == "n_batch" and "64 x" in str(err.value)


def test_trained_pair_at_parallel_4(build_info):
    """The trained pair drafts for real: four sequences together, each equal to its solo output."""
    files = resolve(get_entry("tiny-coder"))
    ctx = ContextParams(n_ctx=2048, n_threads=1)
    cfg = PairConfig(target=files.target, draft=files.draft, n_max=N_MAX, ctx=ctx, parallel=4)
    with Models(cfg) as models:
        prompts = [models.target.tokenize(t) for t in PROMPTS[:4]]
        solo = _solo(models, cfg, prompts)
        with Engine(models, cfg) as eng:
            seqs = _together(eng, prompts)
            _check(seqs, solo)
            tau = sum(s.stats.committed_spec for s in seqs) / sum(s.stats.spec_steps for s in seqs)
            assert tau > 2.0  # real acceptance, not forced
            assert eng.stats.max_calls <= 3
