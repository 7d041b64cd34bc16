"""The adaptive draft length (`--spec-draft-n-max auto`, ggspec/speculative/rules/draft_length.py).

Costs read off measured shapes and acceptance by position; then the rule driven the way the
engine's step drives it (before, after, measured, committed) with made-up costs and drafts: the k
it verifies follows acceptance and costs, plain decoding (k = 0) where drafting cannot pay, more
rows to the sequence that accepts more and one k for equal spans, probes that back off while
drafts fail and come back when the text repeats, drafts scored past the verified k; then on the
real build: greedy output equals plain greedy output for every kind of drafter (DFlash,
draft-simple, EAGLE3, n-gram, MTP on a hybrid target with capped planes, three sequences at once);
DFlash rows held in host memory through steps without a draft give the drafts a draft-context call
every step gives; the CLI and bench show the choices.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import replace

import numpy as np
import pytest
from conftest import PROMPTS, run_cli
from helpers.drafts import Recorder
from helpers.fixtures.mtp_head import ensure_fitted
from helpers.pairs import DFLASH, DRAFT, EAGLE3, STACK, TARGET

from ggspec.catalogue.tiny import ensure_tiny_pair
from ggspec.errors import InputError
from ggspec.runtime import ContextParams
from ggspec.speculative.driver import generate_greedy
from ggspec.speculative.engine import Engine
from ggspec.speculative.models import PairConfig, parse_n_max
from ggspec.speculative.planes import PlaneOptions
from ggspec.speculative.proposer import Draft
from ggspec.speculative.request import Request
from ggspec.speculative.rules.costs import Acceptance, ShapeCosts
from ggspec.speculative.rules.draft_length import DraftLength
from ggspec.speculative.types.ngram import NgramSimpleOptions

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


def test_positions_few_drafts_reached_look_like_the_ones_before():
    """Drafts of 4 tokens, all right: the positions past them have no counts, and a long draft's
    tail is then worth what its head is (not one half per position, which made long n-gram drafts
    look hopeless)."""
    a = Acceptance(15)
    for _ in range(6):
        a.add(4, 4, 4)
    g = a.gains(15)
    assert (np.diff(g) <= 0).all() and g[3] > 0.8 and g[14] > 0.75 * g[3]
    wrong = Acceptance(15)  # and drafts wrong at their third token stay cut there
    for _ in range(6):
        wrong.add(15, 2, 15)
    assert wrong.gains(15)[2] < 0.15


class _Seq:
    """What the rule reads of a sequence; its text is `truth`, a fixed stream of tokens."""

    def __init__(self, seq_id: int) -> None:
        self.seq_id, self.left = seq_id, 10**6
        self.history = [self.truth(0)]

    def truth(self, pos: int) -> int:
        return 100 + (7 * pos + self.seq_id) % 50


WRONG = 9999  # a drafted token the text never has


def _linear(t1: float, t_last: float, rows_last: int = 9):
    """Seconds of a target decode by its rows: t1 for one row, t_last for rows_last."""
    return lambda rows: t1 + (t_last - t1) * (rows - 1) / (rows_last - 1)


class _World:
    """Drives the rule as the engine's step does (before, the draft call, after, the verify, measured,
    committed), with made-up seconds for the calls and drafts whose first right(seq, step) tokens
    are the text's. `steps` keeps each step's verified k per sequence, whether it made a draft
    call, and its seconds."""

    def __init__(self, rule: DraftLength, seqs: list[_Seq], verify, draft, right, n: int = 8) -> None:
        self.rule, self.seqs, self.verify, self.draft, self.right, self.n = rule, seqs, verify, draft, right, n
        self.steps: list[tuple[dict[int, int], bool, float]] = []
        for seq in seqs:
            rule.begin(seq)

    def run(self, steps: int) -> _World:
        for _ in range(steps):
            self._step()
        return self

    def _step(self) -> None:
        rule, live, i = self.rule, self.seqs, len(self.steps)
        n, drafting = rule.before(live, live, self.n)
        made = {}
        for seq in drafting:
            pos, right = len(seq.history) - 1, self.right(seq, i)
            made[seq] = Draft(np.array([seq.truth(pos + 1 + j) if j < right else WRONG for j in range(n)], dtype=np.int32))
        ks = rule.after(live, made) if made else {}
        assert all(0 <= ks[seq] <= len(made[seq]) for seq in made)
        t_draft = self.draft(len(drafting), n) if drafting else 0.0
        rows = sum(ks.get(seq, 0) + 1 for seq in live)
        t_verify = self.verify(rows)
        accepted = {seq: min(ks.get(seq, 0), self.right(seq, i)) for seq in live}
        rule.measured(len(live), len(drafting), n, t_draft, rows, t_verify, 0.0, sum(a + 1 for a in accepted.values()))
        for seq in live:
            pos, d = len(seq.history) - 1, made.get(seq)
            rule.committed(seq, pos, None if d is None else d.tokens, ks.get(seq, 0), accepted[seq])
            seq.history += [seq.truth(pos + 1 + j) for j in range(accepted[seq] + 1)]
        self.steps.append(({seq.seq_id: ks.get(seq, 0) for seq in live}, bool(drafting), t_draft + t_verify))

    def ks(self, seq_id: int = 0, last: int = 150) -> Counter:
        """How often each k was verified for a sequence in the last steps."""
        return Counter(k[seq_id] for k, _, _ in self.steps[-last:])

    def drafting(self, since: int = 0, until: int | None = None) -> list[int]:
        """The steps that made a draft call."""
        return [i for i, (_, called, _) in enumerate(self.steps[:until]) if called and i >= since]


def _rule(**kw) -> DraftLength:
    return DraftLength(8, cheap=kw.pop("cheap", False), fixed_block=kw.pop("fixed_block", False),
                       equal_spans=kw.pop("equal_spans", False), **kw)


def _chosen_k_is_zero(rule: DraftLength, world: _World, steps: int = 150) -> None:
    """Over the next steps the rule itself verifies no draft: every step that does is a probe."""
    probes, start = rule.probes, len(world.steps)
    world.run(steps)
    verified = [i for i, (k, _, _) in enumerate(world.steps) if i >= start and any(k.values())]
    assert len(verified) == rule.probes - probes and len(verified) < steps // 4, (len(verified), rule.probes - probes)


def test_the_chosen_length_follows_acceptance_and_costs():
    memory_bound = _linear(1.0, 1.1)  # 9 rows cost 1.1 one row's time; 8 drafted tokens 0.1
    world = _World(_rule(), [_Seq(0)], memory_bound, lambda seqs, n: 0.1 * n / 8, lambda seq, step: 5).run(300)
    k, count = world.ks().most_common(1)[0]
    assert 4 <= k <= 6 and count > 130, world.ks()  # the drafts that survive, hardly more
    rule = _rule()  # nothing survives: plain decoding
    _chosen_k_is_zero(rule, _World(rule, [_Seq(0)], memory_bound, lambda seqs, n: 0.1 * n / 8,
                                   lambda seq, step: 0).run(150))
    # compute-bound (the tiny pair on this machine): an 8-row verify costs 3.1 decodes, a DFlash
    # block 4; half of the first drafts survive: plain decoding
    compute_bound = _linear(1.0, 3.1)
    rule = _rule(fixed_block=True)
    _chosen_k_is_zero(rule, _World(rule, [_Seq(0)], compute_bound, lambda seqs, n: 4.0,
                                   lambda seq, step: step % 2).run(150))
    # all of them survive: long drafts pay even here
    world = _World(_rule(fixed_block=True), [_Seq(0)], compute_bound, lambda seqs, n: 4.0, lambda seq, step: 8).run(300)
    assert sum(c for k, c in world.ks().items() if k >= 6) > 130, world.ks()


def test_several_sequences_share_rows_by_their_acceptance_and_hybrids_verify_one_length():
    verify = _linear(1.0, 1.2, 17)

    def right(seq, step):  # sequence 0's drafts are right, sequence 1's never
        return 8 if seq.seq_id == 0 else 0

    world = _World(_rule(), [_Seq(0), _Seq(1)], verify, lambda seqs, n: 0.05 * n / 8, right).run(300)
    good, bad = world.ks(0), world.ks(1)
    assert sum(c for k, c in good.items() if k >= 6) > 130 and bad[0] > 130, (good, bad)
    hybrid = _World(_rule(equal_spans=True), [_Seq(0), _Seq(1)], verify, lambda seqs, n: 0.05 * n / 8, right).run(300)
    spans = Counter((k[0], k[1]) for k, _, _ in hybrid.steps[-150:])
    assert all(a == b for a, b in spans) and sum(c for (a, _), c in spans.items() if a > 0) > 130, spans  # (padded anyway)


def test_a_sequence_at_zero_probes_ever_less_often_until_the_text_repeats():
    """A model drafter whose drafts never survive: k = 0 stretches, broken by probes whose waits grow
    until probes cost about a hundredth of plain decoding; once the text repeats (whole drafts
    right), it probes soon and verifies drafts again."""
    plain, right_from = _linear(1.0, 3.1), 700
    rule = _rule()
    world = _World(rule, [_Seq(0)], plain, lambda seqs, n: 1.6 * n / 8,  # a probe costs 1.6 plain steps
                   lambda seq, step: 8 if step >= right_from else 0)
    world.run(40)
    probes = rule.probes
    world.run(right_from - 40)
    failing = world.drafting(since=40)
    assert rule.probes - probes == len(failing) > 5  # every draft call a probe, the rule's own choice 0
    gaps = np.diff([i for i in world.drafting(since=8)]).tolist()
    assert gaps == sorted(gaps) and gaps[-1] >= 4 * gaps[0], gaps  # ever less often, up to a cap
    extra = sum(t - plain(1) for _, _, t in world.steps[40:right_from])
    assert extra < 0.02 * sum(t for _, _, t in world.steps[40:right_from])  # probes cost ~1 % of the time
    world.run(200)
    after = world.drafting(since=right_from)
    assert after[0] - right_from <= gaps[-1]
    assert max(np.diff(after[:4])) <= gaps[0]  # a probe whose drafts were all right: it probes often again
    assert sum(1 for k, _, _ in world.steps[-100:] if k[0] > 0) > 80  # and then verifies drafts


def test_drafts_are_scored_past_the_verified_length_by_the_text_that_follows():
    """Only two tokens of each (n-gram) draft are verified: what the rule learns of the rest comes
    from the text committed after it. Right tails make it verify whole drafts, wrong ones two."""

    def learned(tails_right: bool) -> int:
        rule, seq = _rule(cheap=True), _Seq(0)
        rule.begin(seq)
        verify = _linear(1.0, 1.1)
        for step in range(150):
            n, drafting = rule.before([seq], [seq], 8)
            assert (n, drafting) == (8, [seq])  # an n-gram type always drafts, at its full length
            pos = len(seq.history) - 1
            tokens = np.array([seq.truth(pos + 1 + j) if j < 2 or tails_right else WRONG for j in range(8)], dtype=np.int32)
            if step % 2:
                rule.measured(1, 1, 8, 1e-5, 3, verify(3), 0.0, 3)
            else:
                rule.measured(1, 0, 8, 0.0, 1, verify(1), 0.0, 1)
            rule.committed(seq, pos, tokens, 2, 2)  # 2 verified, both right: the rest waits for the text
            seq.history += [seq.truth(pos + 1 + j) for j in range(3)]
        rule.before([seq], [seq], 8)
        pos = len(seq.history) - 1
        draft = Draft(np.array([seq.truth(pos + 1 + j) for j in range(8)], dtype=np.int32))
        return rule.after([seq], {seq: draft})[seq]

    assert learned(tails_right=True) == 8
    assert learned(tails_right=False) == 2


def test_short_sequences_of_right_ngram_drafts_verify_them_whole():
    """Gemma 3 270M's case: many short sequences, each with a few n-gram drafts that are all right,
    on a CPU where a verify row costs 0.35 of a decode. Each new sequence starts from the last one's
    counts (a few drafts' worth): the full length pays, and the rule verifies it."""
    rule = DraftLength(15, cheap=True, fixed_block=False, equal_spans=False)
    verify = _linear(1.0, 6.25, 16)
    ks = []
    for s in range(12):
        seq = _Seq(s)
        world = _World(rule, [seq], verify, lambda seqs, n: 1e-4, lambda seq, step: 15, n=15).run(6)
        ks += [k[s] for k, _, _ in world.steps[2:]]
        rule.forget(seq)
    assert sum(k >= 12 for k in ks[-20:]) >= 16, ks


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
        seqs = [eng.add(Request(eng.target_model.tokenize(text), N, ignore_eos=True, tag=text)) for text in prompts[:parallel]]
        waiting, got, ks = list(prompts[parallel:]), {}, []
        while eng.active:
            for seq, step in eng.step():
                if step.k is not None:
                    ks.append(step.k)
                if seq.done and seq.tag not in got:
                    got[seq.tag] = seq.tokens
                    if waiting:
                        text = waiting.pop(0)
                        seqs.append(eng.add(Request(eng.target_model.tokenize(text), N, ignore_eos=True, tag=text)))
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

    holds = False


def test_held_dflash_rows_give_the_drafts_a_call_every_step_gives():
    # (no calibration: it could find no length pays on this machine and keep every sequence plain)
    cfg = PairConfig(target=TARGET, draft=DFLASH, n_max=7, ctx=CTX, adaptive=True, calibrate=False)
    logs = []
    for wrapper in (Recorder, _NoHold):
        with Engine.open(cfg) as eng:
            eng.draft_length = _Every(eng.n_max, cheap=False, fixed_block=True, equal_spans=False)
            eng.proposer = rec = wrapper(eng.proposer)
            calls = eng.draft_ctx.n_decodes
            for text in PROMPTS[:3]:
                seq = eng.add(Request(eng.target_model.tokenize(text), N, ignore_eos=True))
                while not seq.done:
                    eng.step()
            logs.append((rec.log, eng.draft_ctx.n_decodes - calls))
    (held, held_calls), (flushed, flushed_calls) = logs
    assert len(held) > 30 and held == flushed
    assert held_calls < 0.75 * flushed_calls  # two of three steps make no draft-context call


def test_run_prints_the_choices_and_refuses_a_bad_length():
    r = run_cli("run", "--pair", "tiny-coder", "-t", "1", "-n", "48", "-p", PROMPTS[0], "--spec-draft-n-max", "auto")
    assert r.returncode == 0, r.stderr
    # (where the calibrated costs say no length pays, it decodes plainly and says so)
    assert ("auto ≤ 7" in r.stderr and "auto: k " in r.stderr) or "no draft-dflash draft length ≤ 7 pays" in r.stderr
    r = run_cli("run", "--pair", "tiny-coder", "--spec-type", "ngram-simple", "-t", "1", "-n", "48", "-p", STACK,
                "--spec-draft-n-max", "auto:6")  # (n-grams cost nothing to draft: the rule always decides)
    assert r.returncode == 0, r.stderr
    assert "ngram-simple auto ≤ 6" in r.stderr and "auto: k " in r.stderr
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
    # llama.cpp's loop has no adaptive length: beside auto7 it drafts the cap, 7, fixed
    assert any(row["label"].startswith("llama.cpp n3") for row in rows)
    assert any(row["label"].startswith("llama.cpp n7") for row in rows)


# --- giving up, starting plain, fixed sequences, hopeless pairs (issue 38) ---------------------------


def test_a_sequence_whose_probes_never_pay_gives_up_and_the_next_ones_start_plain():
    """Drafts that are always wrong, on costs where only good drafts pay: GIVE_UP failed probes
    and the sequence stops speculating (gave_up); the sequences after it start plain, 1, then 2,
    then 4; one whose drafts paid brings that back to 1."""
    from ggspec.speculative.rules.draft_length import GIVE_UP

    rule = _rule()
    seq = _Seq(0)
    w = _World(rule, [seq], _linear(1.0, 3.0), lambda _s, n: 0.3 * n, lambda _s, _i: 0)
    for _ in range(400):
        w.run(1)
        if rule.gave_up(seq):
            break
    assert rule.gave_up(seq) and rule.tracks[0].failed == GIVE_UP
    rule.forget(seq)
    starts = [rule.starts_plain() for _ in range(2)]
    assert starts == [True, False]  # one plain sequence, then one that explores again
    rule.begin(seq)
    rule.tracks[0].failed = GIVE_UP
    rule.forget(seq)
    assert [rule.starts_plain() for _ in range(3)] == [True, True, False]  # twice as many
    rule.begin(seq)
    rule.tracks[0].chose = True  # the rule chose its drafts: back to one
    rule.forget(seq)
    rule.begin(seq)
    rule.tracks[0].failed = GIVE_UP
    rule.forget(seq)
    assert [rule.starts_plain() for _ in range(2)] == [True, False]


def test_a_fixed_sequence_verifies_every_draft_beside_free_ones():
    """A seeded sampled sequence (fixed) verifies its whole draft whatever the rule chooses for the
    others, here plain decoding (drafts always wrong, dear verify rows)."""
    rule = _rule()
    free, fixed = _Seq(0), _Seq(1)
    rule.begin(free)
    rule.begin(fixed, fixed=True)
    w = _World.__new__(_World)
    w.rule, w.seqs, w.verify, w.draft, w.right, w.n, w.steps = (rule, [free, fixed], _linear(1.0, 3.0),
                                                               lambda _s, n: 0.3 * n, lambda _s, _i: 0, 8, [])
    w.run(200)
    assert set(w.ks(1)) == {8} and w.ks(0)[0] > 100
    assert not rule.gave_up(fixed)


def test_hopeless_only_where_no_length_pays_even_with_good_drafts():
    def measured(verify, draft):
        rule = _rule()
        for _ in range(8):
            rule.plain.add(1, verify(1))
            rule.spec.add(9, verify(9))
            rule.spec.add(2, verify(2))
            rule._draft_costs(1, exact=True).add(8, draft(8))
            rule._draft_costs(1, exact=True).add(1, draft(1))
        rule.rest_plain = rule.rest_spec = 0.0
        return rule.hopeless(1)

    assert measured(_linear(1.0, 9.0), lambda n: 0.5 * n)  # a CPU: rows cost as much as decodes
    assert not measured(_linear(1.0, 1.2), lambda n: 0.1 * n)  # a GPU: rows nearly free
    rule = _rule(cheap=True)
    assert not rule.hopeless(1)  # n-gram drafts cost nothing: never
