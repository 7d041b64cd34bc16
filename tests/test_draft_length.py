"""The adaptive draft length (`--spec-draft-n-max auto`, ggspec/speculative/draft_length.py).

The rule on plain numbers (costs read off measured shapes, the best k for given acceptance and
costs, one k for equal spans, more rows to the sequence that accepts more, looks that back off,
drafts scored past the verified k); then on the real build: greedy output equals plain greedy
output for every kind of drafter (DFlash, draft-simple, EAGLE3, n-gram, MTP on a hybrid target
with capped planes, three sequences at once); DFlash rows held in host memory through steps without
a draft give the drafts a draft-context call every step gives; the CLI and bench show the choices.
"""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from conftest import PROMPTS, run_cli
from test_draft_model import DFLASH, DRAFT, TARGET
from test_eagle3 import EAGLE3
from test_mtp import Recorder
from ggspec.errors import InputError
from ggspec.fixtures.mtp_head import ensure_fitted
from ggspec.catalogue.tiny import ensure_tiny_pair
from ggspec.runtime import ContextParams
from ggspec.speculative.costs import Acceptance, ShapeCosts
from ggspec.speculative.draft_length import PROBE_FIRST, WARM_UP, DraftLength
from ggspec.speculative.engine import Engine
from ggspec.speculative.loop import generate_greedy
from ggspec.speculative.models import PairConfig, parse_n_max
from ggspec.speculative.planes import PlaneOptions
from ggspec.speculative.ngram import NgramSimpleOptions

CTX = ContextParams(n_ctx=2048, n_threads=1, flash_attn="off")
N = 96


# --- the rule on plain numbers ----------------------------------------------------------------------


def test_costs_of_unseen_shapes_are_read_off_the_nearest_ones():
    c = ShapeCosts()
    assert c.at([1, 5]).tolist() == [0.0, 0.0]  # nothing measured
    c.add(2, 1.0)
    assert c.at([1, 8]).tolist() == [1.0, 1.0]  # one size: the same everywhere
    c.add(4, 2.0)
    assert np.allclose(c.at([1, 3, 4, 8]), [0.5, 1.5, 2.0, 4.0])  # between, and the line past either end
    p = ShapeCosts(proportional=True)
    p.add(4, 2.0)
    assert np.allclose(p.at([1, 8]), [0.5, 4.0])  # a sequential draft: in proportion
    slow_first = ShapeCosts()  # the lower quartile of a size's recent calls: its slow first calls do not count
    for t in (4.0, 3.0, 1.0, 1.1, 1.2, 1.0, 1.05, 1.3):
        slow_first.add(4, t)
    assert 1.0 <= slow_first.at([4])[0] <= 1.1


def test_acceptance_gains_fall_with_the_position():
    a = Acceptance(6)
    for _ in range(50):
        a.add(6, 3, 6)  # right up to 3, wrong at the fourth
    g = a.gains(6)
    assert (np.diff(g) <= 0).all() and g[2] > 0.9 and g[3] < 0.05
    assert a.expected(3) == pytest.approx(1 + g[:3].sum())


class _Seq:
    """What the rule reads of a sequence."""

    def __init__(self, seq_id: int, history=(), left: int = 1000) -> None:
        self.seq_id, self.history, self.left = seq_id, list(history), left


def _rule(n_max=8, verify=((1, 1.0), (9, 1.1)), draft=((8, 0.1),), **kw) -> DraftLength:
    rule = DraftLength(n_max, cheap=kw.pop("cheap", False), fixed_block=kw.pop("fixed_block", False),
                       equal_spans=kw.pop("equal_spans", False), **kw)
    smallest = min(rows for rows, _ in verify)  # the plain steps' rows; the others verify drafts
    for rows, t in verify:
        (rule.plain if rows == smallest else rule.spec).add(rows, t)
    for n, t in draft:
        rule._draft_costs(1, exact=True).add(n, t)
    rule.rest_plain = rule.rest_spec = 0.0
    return rule


def _accepting(rule: DraftLength, seq, right: int, length: int = 8, times: int = 60) -> None:
    for _ in range(times):
        rule.tracks[seq.seq_id].acceptance.add(length, right, length)


def test_the_best_length_follows_acceptance_and_costs():
    seq = _Seq(0)
    rule = _rule()  # memory-bound: 9 rows cost 1.1 one row's time, drafting 0.1
    rule.begin(seq)
    _accepting(rule, seq, right=5)
    k = rule._choose([seq], [seq], 8, [8])[0]
    assert 4 <= k <= 6  # the drafts that survive, hardly more
    _accepting(rule, seq, right=0, times=600)
    assert rule._choose([seq], [seq], 8, [8]) == [0]  # nothing survives: plain decoding
    # compute-bound (this machine's tiny pair): an 8-row verify costs 3.1 decodes, a draft step half of one
    compute_bound = _rule(verify=((1, 1.0), (9, 3.1)), draft=((8, 4.0),))
    compute_bound.begin(seq)
    for right in [0, 1] * 40:  # half the first drafts survive
        _accepting(compute_bound, seq, right=right, times=1)
    assert compute_bound._choose([seq], [seq], 8, [8]) == [0]
    _accepting(compute_bound, seq, right=8, times=300)  # all of them survive: long drafts pay even here
    assert compute_bound._choose([seq], [seq], 8, [8])[0] >= 6


def test_several_sequences_share_rows_by_their_acceptance_and_hybrids_verify_one_length():
    good, bad = _Seq(0), _Seq(1)
    rule = _rule(verify=((2, 1.0), (18, 1.2)), draft=((8, 0.05),))
    for seq in (good, bad):
        rule.begin(seq)
    _accepting(rule, good, right=8)
    _accepting(rule, bad, right=0)
    k_good, k_bad = rule._choose([good, bad], [good, bad], 8, [8, 8])
    assert k_good >= 6 and k_bad == 0
    hybrid = _rule(verify=((2, 1.0), (18, 1.2)), draft=((8, 0.05),), equal_spans=True)
    for seq in (good, bad):
        hybrid.begin(seq)
    _accepting(hybrid, good, right=8)
    _accepting(hybrid, bad, right=0)
    ks = hybrid._choose([good, bad], [good, bad], 8, [8, 8])
    assert ks[0] == ks[1] > 0  # one span length for both (the padding is paid anyway)


def test_a_sequence_at_zero_probes_ever_less_often_until_the_text_repeats():
    seq = _Seq(0, history=[1])
    rule = _rule(verify=((1, 1.0), (9, 3.1)), draft=((8, 1.6),))  # a probe costs 1.6 plain steps
    rule.begin(seq)
    _accepting(rule, seq, right=0, times=300)
    rule._steps = 2 * WARM_UP  # past the measuring steps
    longest = rule._longest_wait()
    assert longest == 160  # probes at 1 % of the time
    probes, right_from = [], 700
    for step in range(900):
        n, drafting = rule.before([seq], [seq], 8)
        pos, right = len(seq.history) - 1, step >= right_from
        if drafting:
            probes.append(step)
            k = rule._plan[0]
            assert k >= 1  # a probe verifies drafts
            accepted = k if right else 0
            rule.committed(seq, pos, np.full(n, 7 if right else 9, dtype=np.int32), k, accepted)
            seq.history += [7] * (accepted + 1)
        else:
            rule.committed(seq, pos, None, 0, 0)
            seq.history.append(7)
    gaps = np.diff(probes).tolist()
    assert probes[0] == PROBE_FIRST - 1 and gaps[:4] == [8, 16, 32, 64] and max(gaps) == longest
    first_right = next(i for i, step in enumerate(probes) if step >= right_from)
    assert max(gaps[first_right:first_right + 3]) <= 2 * PROBE_FIRST  # whole drafts right: it probes often again
    assert rule.probes == len(probes)


def test_drafts_are_scored_past_the_verified_length_by_the_text_that_follows():
    seq = _Seq(0, history=[5, 6, 7])
    rule = _rule()
    rule.begin(seq)
    draft = np.array([8, 9, 10, 11, 12, 13], dtype=np.int32)
    rule.committed(seq, 2, draft, k=2, accepted=2)  # both verified drafts right: the rest waits
    assert rule.tracks[0].pending
    seq.history += [8, 9, 10]  # the two drafts and the target's own token (= draft 3)
    rule._score(seq)
    assert rule.tracks[0].pending  # draft 4 is not decided yet
    seq.history += [11, 99]  # draft 4 right, draft 5 wrong
    rule._score(seq)
    acc = rule.tracks[0].acceptance
    assert not rule.tracks[0].pending
    assert acc.tried[:5].tolist() == [1, 1, 1, 1, 1] and acc.accepted[:5].tolist() == [1, 1, 1, 1, 0]
    rule.committed(seq, 7, draft, k=3, accepted=1)  # the verify decided: wrong at the second
    assert acc.tried[1] == pytest.approx(0.99 + 1) and acc.accepted[1] == pytest.approx(0.99)


def test_the_flag_takes_auto_and_a_cap():
    assert parse_n_max("7") == (7, False) and parse_n_max("auto") == (None, True) and parse_n_max("auto:5") == (5, True)
    for bad in ("0", "auto:0", "autox", "auto:x", ""):
        with pytest.raises(InputError):
            parse_n_max(bad)


# --- on the real build -------------------------------------------------------------------------------


def _plain(eng: Engine, prompt) -> list[int]:
    return [t for st in generate_greedy(eng, prompt, N, ignore_eos=True) for t in st.tokens]


def _auto_equals_plain(cfg: PairConfig, prompts=PROMPTS[:4], parallel: int = 1) -> Engine:
    """Every prompt's auto output equals its plain greedy output; `parallel` sequences at once."""
    with Engine.open(cfg) as plain_eng:
        want = {text: _plain(plain_eng, plain_eng.target_model.tokenize(text)) for text in prompts}
    with Engine.open(replace(cfg, adaptive=True, parallel=parallel)) as eng:
        assert eng.draft_length is not None
        seqs = [eng.add(eng.target_model.tokenize(text), N, ignore_eos=True, tag=text) for text in prompts[:parallel]]
        waiting, got, ks = list(prompts[parallel:]), {}, []
        while eng.active:
            for seq, step in eng.step():
                if step.k is not None:
                    ks.append(step.k)
                if seq.done and seq.tag not in got:
                    got[seq.tag] = seq.tokens
                    if waiting:
                        text = waiting.pop(0)
                        seqs.append(eng.add(eng.target_model.tokenize(text), N, ignore_eos=True, tag=text))
        assert got == want
        assert ks and max(ks) <= eng.n_max
        return eng


@pytest.mark.parametrize("parallel", [1, 3])
def test_auto_dflash_output_is_plain_greedy_output(parallel):
    _auto_equals_plain(PairConfig(target=TARGET, draft=DFLASH, n_max=7, ctx=CTX), parallel=parallel)


@pytest.mark.parametrize("kind", ["draft-simple", "draft-eagle3", "ngram-simple"])
def test_auto_output_is_plain_greedy_output_for_every_drafter(kind):
    draft = {"draft-simple": DRAFT, "draft-eagle3": EAGLE3, "ngram-simple": None}[kind]
    cfg = PairConfig(target=TARGET, draft=draft, spec_type=kind, n_max=4, ctx=CTX,
                     spec_options={"ngram-simple": NgramSimpleOptions(size_n=3, size_m=8)})
    _auto_equals_plain(cfg, prompts=PROMPTS[:3], parallel=2)


def test_auto_on_a_hybrid_target_with_capped_planes(fixture_dir, build_info):
    target = ensure_fitted(fixture_dir, ensure_tiny_pair(fixture_dir, "hybrid-mtp").target)
    cfg = PairConfig(target=target, n_max=3, ctx=ContextParams(n_ctx=2048, n_threads=1),
                     planes=PlaneOptions.parse("3", "default"))
    _auto_equals_plain(cfg, prompts=PROMPTS[:3], parallel=2)


class _Every(DraftLength):
    """A fixed schedule instead of the rule: draft (and verify everything) every third step."""

    def before(self, live, eligible, n):
        self._steps += 1
        return (n, eligible) if self._steps % 3 == 0 else (0, [])

    def after(self, live, drafts):
        return {seq: len(d) for seq, d in drafts.items()}


class _NoHold(Recorder):
    """The recorder, for a proposer that flushes into the draft before every target decode."""

    def __getattr__(self, name):
        if name == "hold":
            raise AttributeError(name)
        return getattr(self.inner, name)


def test_held_dflash_rows_give_the_drafts_a_call_every_step_gives():
    cfg = PairConfig(target=TARGET, draft=DFLASH, n_max=7, ctx=CTX, adaptive=True)
    logs = []
    for wrapper in (Recorder, _NoHold):
        with Engine.open(cfg) as eng:
            eng.draft_length = _Every(eng.n_max, cheap=False, fixed_block=True, equal_spans=False)
            eng.proposer = rec = wrapper(eng.proposer)
            calls = eng.draft_ctx.n_decodes
            for text in PROMPTS[:3]:
                seq = eng.add(eng.target_model.tokenize(text), N, ignore_eos=True)
                while not seq.done:
                    eng.step()
            logs.append((rec.log, eng.draft_ctx.n_decodes - calls))
    (held, held_calls), (flushed, flushed_calls) = logs
    assert len(held) > 30 and held == flushed
    assert held_calls < 0.75 * flushed_calls  # two of three steps make no draft-context call


def test_run_prints_the_choices_and_refuses_a_bad_length():
    r = run_cli("run", "--pair", "tiny-coder", "-t", "1", "-n", "48", "-p", PROMPTS[0], "--spec-draft-n-max", "auto")
    assert r.returncode == 0, r.stderr
    assert "auto ≤ 7" in r.stderr and "auto: k " in r.stderr
    r = run_cli("run", "--pair", "tiny-coder", "-n", "8", "-p", "x", "--spec-draft-n-max", "often")
    assert r.returncode != 0 and "--spec-draft-n-max" in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_bench_runs_auto_beside_fixed_lengths(tmp_path):
    out = tmp_path / "b.json"
    r = run_cli("bench", "--pair", "tiny-coder", "-t", "1", "-n", "24", "-r", "1", "--spec-draft-n-max", "3,auto",
                "--matrix", "--native", "--save", str(out), timeout=600)
    assert r.returncode == 0, r.stderr
    rows = [row for row in json.loads(out.read_text())["rows"] if row["category"] == "all"]
    auto = next(row for row in rows if row["label"].startswith("auto7"))
    assert sum(auto["k_hist"]) > 0 and 0 <= auto["k0_share"] <= 1 and auto["identical"].split("/")[0] == \
        auto["identical"].split("/")[1]
    assert "llama.cpp's loop has no adaptive draft length" in r.stdout + r.stderr
    assert any(row["label"].startswith("llama.cpp n3") for row in rows)
