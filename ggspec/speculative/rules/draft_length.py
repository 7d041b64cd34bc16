"""`--spec-draft-n-max auto`: how many drafted tokens each sequence verifies, chosen every step.

A step that verifies k_s drafted tokens of every sequence s commits, in expectation,
  sum over s of (1 + g_s(1) + ... + g_s(k_s)),   g_s(i) = the chance that drafts 1..i all survive
(running, decaying per-position counts of the sequence's own drafts; costs.Acceptance), and costs
  draft(n) + verify(rows) + rest,
the measured seconds of the draft call for a length n = max k_s (none when every k_s is 0), of a
target decode of rows = sum (k_s + 1), and of the rest of a step (injection, replays, Python).
The rule takes the k_s that maximise committed tokens per second. Since each g_s falls with i, the
best use of j verify rows beyond the sequences' own is the j largest g_s(i) of all sequences: one
sorted pass gives every j, and the step picks the best j, k = 0 for everyone (plain decoding)
included. Hybrid targets with several sequences verify equal spans (engine._span_width), so there
every sequence gets the same k.

What the rule does not change: a DFlash-family block keeps its length n (its drafts depend on it,
so only how many of them are verified changes); the text drafters (n-gram types, suffix) draft at
their full length whatever k is (it costs microseconds, and the tokens past k are scored against
the text), but after IDLE_MIN drafting steps in a row that verified nothing they draft every
other step, then every 4th, up to every IDLE_WAIT_MAX-th, until a draft is verified again (where
the text does not repeat, drafting and scoring every step cost a small model a few per cent); a model
drafter is asked for max k_s tokens (their first k are what a longer draft would start with).
Every choice is made from the past only, so greedy output equals plain greedy and sampled output
keeps its distribution whatever k is.

Learning: every draft is scored against the committed text as it arrives, also past the verified
k (a verify that accepts all k leaves the rest to the tokens that follow), so the counts cover
every drafted position. A sequence at k = 0 with a model drafter makes no drafts and learns
nothing, as a bandit's unplayed arm: after PROBE_FIRST steps it probes, a step at the best k > 0
(the drafts and what verifying them costs are what the rule lacks, and the probe's own tokens
count), and waits twice as long after each probe, up to what keeps probes at PROBE_SHARE of the
time beyond plain decoding (at most WAIT_MAX steps). A probe whose every drafted token proves right
(the text repeats) brings the wait back to PROBE_FIRST, as does the rule choosing k > 0 again. A
sequence starts from what the last sequence to finish learned (its counts scaled to PRIOR_WEIGHT
drafts, and its wait: the same workload usually continues), the first one from an even prior.

Where no draft length could pay even with drafts as good as the best pairs' (`hopeless`: each
drafted token surviving with chance HOPE), the engine does not speculate at all and the draft model
is never called (on two CPU cores the real Qwen2.5-Coder 1.5B + 0.5B pair is such a case: a step
verifying k drafts costs more than the k + 1 plain steps it could save).

Costs: an engine starts from tables measured before its first step (calibration.py: a schedule of
lengths run through the engine itself, cached per machine, build, files and settings, refined as it
runs). Without them (a context too small for the schedule, `calibrate=False`) the first WARM_UP
steps draft at the full length, as many more verify nothing, so both ends are measured (the first half of those steps not: an engine's first calls of each shape build and
allocate graphs, 2-4x the time of later ones); costs of shapes not seen yet are read off the line through the nearest ones seen
(costs.ShapeCosts). Plain and speculative steps are measured apart: a draft call evicts the
target's weights from the caches, so the target decode after it is slower (on the tiny pair, a
one-row decode after a draft call costs 1.3-2x one after another decode), and only a step with a
draft has injection to do; for the same reason the first speculative step after plain ones is
not measured as one (a stretch of them costs less: on the tiny pair a DFlash draft call costs 3x
as much after plain steps as after another draft call). A probe's injection also carries what the
steps before it held, so a probe counts only towards what probes cost. For the same cold caches
a choice to verify drafts holds for at least STRETCH steps (alternating plain and speculative
steps costs more than a stretch of either: on the tiny pair this lifted auto:3 from 0.84-0.91 to
0.92-0.94 of the best fixed length, and from 64-98 % to 28-38 % of the steps at k = 0).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ggspec.speculative.rules.costs import Acceptance, ShapeCosts, draft_match, ema

PROBE_FIRST = 4  # steps at k = 0 before a sequence with a model drafter probes its drafts again
PROBE_SHARE = 0.01  # what probes may cost beyond plain decoding, as a share of its time
WAIT_MAX = 256  # the longest wait between two probes, whatever the costs
PRIOR_WEIGHT = 4.0  # drafts' worth of the last finished sequence's counts a new sequence starts from
REPLAN = 64  # steps without new counts before the rule is computed again (costs drift slowly)
REPLAN_MIN = 4  # steps between two computations of the rule (each costs tens of microseconds)
STRETCH = 16  # steps a choice to verify drafts lasts at least (the first speculative steps after
# plain ones pay for cold caches: alternating costs more than either kind of stretch)
COST_REFRESH = 16  # steps between two readings of the cost tables
PLAIN_RUNS_MAX = 16  # new sequences that start plain at most after one gave up
GIVE_UP = 3  # probes in a row that did not pay before a sequence with a model drafter stops speculating
HOPE = 0.95  # the chance a drafted token survives on the best workloads (the real Qwen2.5-Coder pair: 91-96 % on
# code): where no draft length pays even at this rate, a model drafter is not called at all
WARM_UP = 8  # steps at the full length, then as many without drafts, before the rule decides
IDLE_MIN = 4  # a text drafter's drafting steps in a row that verified nothing before it drafts less often
IDLE_WAIT_MAX = 8  # then it drafts at least every this many steps (a repeat that starts is found soon)


@dataclass
class _Track:
    """What the rule keeps of one sequence."""

    acceptance: Acceptance
    pending: list = field(default_factory=list)  # [pos0, tokens, first unchecked index, a probe's?] to score
    k: int = -1  # the length chosen at its last step (-1: none yet)
    waited: int = 0  # steps at k = 0 since its last probe
    probe: bool = False  # this step probes it
    wait: int = PROBE_FIRST
    fresh: bool = True  # counts changed since the rule was last computed
    fixed: bool = False  # it verifies every draft, at the full length (a seeded sampled sequence)
    failed: int = 0  # probes in a row that did not pay, since the rule last chose to verify drafts
    chose: bool = False  # the rule chose to verify its drafts at least once
    idle: int = 0  # a text drafter's drafting steps in a row that verified nothing
    skip: int = 0  # steps it leaves out before drafting again
    idle_wait: int = 1  # the next such wait


class DraftLength:
    """Chooses, per step, which sequences draft, the length asked, and each one's verified k."""

    def __init__(self, n_max: int, *, cheap: bool, fixed_block: bool, equal_spans: bool, n_min: int = 0) -> None:
        """`cheap`: drafting costs next to nothing (n-gram types: always draft, choose k after);
        `fixed_block`: the draft's length must stay n (DFlash family); `equal_spans`: several
        sequences verify spans of one length (hybrid targets); `n_min`: a model drafter drops
        drafts shorter than this, so it is never asked for fewer."""
        self.n_max = n_max
        self.cheap = cheap
        self.fixed_block = fixed_block
        self.equal_spans = equal_spans
        self.n_min = n_min
        # verify decodes by rows, of plain steps (no draft verified, no draft call in this step or
        # the one before: a draft call also slows the next target call, its caches gone) and of
        # speculative ones; and the rest of each kind of step (injection, replays, Python)
        self.plain = ShapeCosts()
        self.spec = ShapeCosts()
        self.rest_plain: float | None = None
        self.rest_spec: float | None = None
        self.draft: dict[int, ShapeCosts] = {}  # by sequences drafting, then by length asked
        self._called = False  # the last step made a model draft call
        self.tracks: dict[int, _Track] = {}
        self.probes = 0  # steps the rule did not choose, verifying drafts to measure them
        self._steps = 0
        self._since = 0  # steps since the rule was last computed
        # a stretch of steps at k = 0 that need no rule (no probe due, nothing to score): its length
        # left, the sequences it is for, and the steps it has had (added to the waits when it ends)
        self._quiet = self._quiet_seqs = self._quiet_steps = 0
        self.probe_cost: float | None = None  # seconds a probe costs beyond plain decoding (measured)
        self.true_plain: tuple[int, float] | None = None  # (sequences, seconds) of a step that does not speculate
        self.plain_engine: tuple[int, float] | None = None  # (sequences, seconds) of a plain engine's step (calibration.plain_engine_step)
        self._table: tuple | None = None  # (key, step, costs) the rule last read (_tables)
        self._probing = False  # this step probes
        self._plan: dict[int, int] = {}  # seq_id -> k, for the drafts of this step
        self._learned: tuple | None = None  # (tried, accepted, wait) a new sequence starts from
        self._plain_left, self._plain_next = 0, 1  # new sequences to start plain (starts_plain)
        self._forced: int | None = None  # a calibration's k for the next step, every sequence alike
        self._forcing = False  # this step's k is the calibration's
        self._skip = WARM_UP // 2  # steps up to this one are not measured (their graphs are new)

    # --- sequences --------------------------------------------------------------------------------

    def begin(self, seq, fixed: bool = False) -> None:
        """A new sequence; `fixed`: it verifies every draft (its sampled text then depends on its
        seed alone, not on the costs measured or the sequences beside it)."""
        track = _Track(Acceptance(self.n_max), fixed=fixed)
        if self._learned is not None:  # what the last sequence to finish learned, and its wait
            tried, accepted, track.wait = self._learned
            track.acceptance.tried, track.acceptance.accepted = tried.copy(), accepted.copy()
        self.tracks[seq.seq_id] = track
        self._plan.pop(seq.seq_id, None)

    def forget(self, seq) -> None:
        """A sequence leaves (or stops speculating): what it learned is where the next one starts,
        probing soon; one that gave up keeps the next few sequences plain (starts_plain)."""
        t = self.tracks.pop(seq.seq_id, None)
        if t is None:
            return
        if t.acceptance.tried[0] > 0:
            scale = min(1.0, PRIOR_WEIGHT / t.acceptance.tried[0])
            self._learned = (t.acceptance.tried * scale, t.acceptance.accepted * scale, PROBE_FIRST)
        if t.failed >= GIVE_UP:  # the next `_plain_next` sequences start plain, twice as many each time
            self._plain_left, self._plain_next = self._plain_next, min(2 * self._plain_next, PLAIN_RUNS_MAX)
        elif t.chose:  # its drafts paid: the next sequence that gives up skips one only
            self._plain_next = 1

    def starts_plain(self) -> bool:
        """Whether a new sequence decodes plainly from its start: after a sequence gave up
        (gave_up), 1, then 2, 4, ... PLAIN_RUNS_MAX new sequences do, each run of them ending
        with one that explores again (its steps at k = 0 are what a plain one costs, and more)."""
        if self._plain_left > 0:
            self._plain_left -= 1
            return True
        return False

    # --- before the draft call ----------------------------------------------------------------------

    def before(self, live: list, eligible: list, n: int) -> tuple[int, list]:
        """The length to ask of the proposer and the sequences to draft for (0, []: no draft call).
        `eligible`: the sequences that may draft this step, `n` the engine's block for them.
        Sequences at a fixed length draft n whatever the rule chooses for the others."""
        fixed = [seq for seq in eligible if self.tracks[seq.seq_id].fixed]
        if not fixed:
            return self._before(live, eligible, n)
        free = [seq for seq in eligible if not self.tracks[seq.seq_id].fixed]
        ask, chosen = self._before(live, free, n) if free else (0, [])
        if not free:
            self._steps += 1
        self._plan.update((seq.seq_id, n) for seq in fixed)
        drafting = set(chosen) | set(fixed)
        return max(ask, self._ask(n, [n])), [seq for seq in eligible if seq in drafting]

    def _before(self, live: list, eligible: list, n: int) -> tuple[int, list]:
        self._steps += 1
        if self._quiet and len(eligible) == self._quiet_seqs:  # a stretch at k = 0 with nothing to do
            self._quiet -= 1
            self._quiet_steps += 1
            return 0, []
        if self._quiet_steps:
            self._wake(eligible)
        for seq in eligible:
            self._score(seq)
        k, self._forced = self._forced, None
        self._forcing = k is not None
        if self._forcing:  # a calibration step: every sequence verifies the schedule's k
            self._plan = dict.fromkeys((seq.seq_id for seq in eligible), k)
            if self.cheap:
                return n, eligible
            return (self._ask(n, [k]), eligible) if k else (0, [])
        if self.cheap:  # drafting is cheap: draft, choose k once the drafts are known (after)
            drafting = [seq for seq in eligible if self._drafts_now(self.tracks[seq.seq_id])]
            return (n, drafting) if drafting else (0, [])
        if self._steps <= 2 * WARM_UP:  # measure both ends first: the full length, then none
            full = self._steps <= WARM_UP
            self._plan = dict.fromkeys((seq.seq_id for seq in eligible), n if full else 0)
            return (n, eligible) if full else self._probe(eligible, n)
        if self._keep(eligible):
            self._since += 1
            ks = [self._plan[seq.seq_id] for seq in eligible]
        else:
            self._since = 0
            ks = self._choose(live, eligible, n, [n] * len(eligible))
            for seq, k in zip(eligible, ks):
                t = self.tracks[seq.seq_id]
                t.fresh = False
                if k:  # back to verifying drafts: probe soon again once back at k = 0
                    t.wait, t.failed, t.chose = PROBE_FIRST, 0, True
            self._plan = {seq.seq_id: k for seq, k in zip(eligible, ks)}
        if not any(ks):
            return self._probe(eligible, n)
        return self._ask(n, ks), eligible  # (sequences at k = 0 ride along: their drafts are scored, not verified)

    @staticmethod
    def _drafts_now(t: _Track) -> bool:
        """Whether a text drafter drafts for this sequence this step: after IDLE_MIN drafting steps
        in a row that verified nothing, it drafts every other step, then every 4th, up to every
        IDLE_WAIT_MAX-th (drafting and scoring cost tens of microseconds a step, a few per cent
        of a small model's step, where the text does not repeat); verifying a draft again ends it."""
        if t.skip > 0:
            t.skip -= 1
            return False
        return True

    def _idle(self, drafts: dict, ks: dict) -> None:
        """A text drafter's idle count and wait, after its drafts' k were chosen."""
        for seq in drafts:
            t = self.tracks[seq.seq_id]
            if ks[seq] > 0:
                t.idle, t.idle_wait = 0, 1
                continue
            t.idle += 1
            if t.idle >= IDLE_MIN:
                t.skip, t.idle_wait = t.idle_wait, min(2 * t.idle_wait, IDLE_WAIT_MAX)

    def _ask(self, n: int, ks: list[int]) -> int:
        """The draft length to ask for verified lengths ks: a DFlash block stays n, a model drafter
        drafts the longest k (never fewer than its n_min)."""
        return n if self.fixed_block else max(max(ks), self.n_min, 1)

    def _wake(self, eligible: list) -> None:
        """The end of a quiet stretch: its steps count as waited and as steps since the rule."""
        for seq in eligible:
            t = self.tracks[seq.seq_id]
            t.waited += self._quiet_steps
        self._since += self._quiet_steps
        self._quiet = self._quiet_steps = 0

    def _keep(self, eligible: list) -> bool:
        """Whether this step keeps the last choice: the rule is computed again when new counts came
        in (at most every REPLAN_MIN steps, every STRETCH steps while drafts are verified) or REPLAN
        steps passed (costs drift), and for a sequence it has not chosen for yet."""
        if any(seq.seq_id not in self._plan for seq in eligible) or self._since >= REPLAN:
            return False
        least = STRETCH if any(self._plan[seq.seq_id] for seq in eligible) else REPLAN_MIN
        return self._since < least or not any(self.tracks[seq.seq_id].fresh for seq in eligible)

    def _probe(self, eligible: list, n: int) -> tuple[int, list]:
        """No sequence verifies drafts by the rule this step: those whose wait is over probe, at
        the length the rule finds best among those that verify drafts (what the drafts and the
        steps that verify them cost now is what the rule lacks, and a probe's own tokens count)."""
        due = []
        for seq in eligible:
            t = self.tracks[seq.seq_id]
            t.waited += 1
            if t.waited >= t.wait:
                t.waited = 0
                t.wait = min(2 * t.wait, self._longest_wait())
                due.append(seq)
        if not due:
            tracks = [self.tracks[seq.seq_id] for seq in eligible]
            if not any(t.pending for t in tracks):  # until the next probe or computation, steps need no rule
                self._quiet = max(0, min(min(t.wait - t.waited for t in tracks), REPLAN - self._since) - 1)
                self._quiet_seqs = len(eligible)
            return 0, []
        self.probes += len(due)
        ks = self._choose(eligible, due, n, [n] * len(due), probe=True)
        self._plan.update((seq.seq_id, k) for seq, k in zip(due, ks))
        for seq in due:
            self.tracks[seq.seq_id].probe = True
        self._probing = True
        return self._ask(n, ks), due

    def _longest_wait(self) -> int:
        """The wait between probes that keeps them at PROBE_SHARE of the time of plain steps."""
        plain = self._plain_cost(1)
        probe = self.probe_cost if self.probe_cost is not None else float(self._draft_cost(1, [self.n_max])[0])
        if plain <= 0 or probe <= 0:
            return PROBE_FIRST
        return int(min(WAIT_MAX, max(PROBE_FIRST, probe / (PROBE_SHARE * plain))))

    # --- after the draft call -----------------------------------------------------------------------

    def after(self, live: list, drafts: dict) -> dict:
        """Each drafting sequence's verified length (drafts: seq -> Draft, as the proposer made them)."""
        if self.cheap and not self._forcing:
            fixed = {seq: len(d) for seq, d in drafts.items() if self.tracks[seq.seq_id].fixed}
            seqs = [seq for seq, d in drafts.items() if len(d) and seq not in fixed]
            ks = self._choose(live, seqs, self.n_max, [len(drafts[seq]) for seq in seqs],
                              confidence=[drafts[seq].confidence for seq in seqs]) if seqs else []
            chosen = {**dict.fromkeys(drafts, 0), **dict(zip(seqs, ks)), **fixed}
            self._idle(drafts, chosen)
            return chosen
        return {seq: min(len(d), self._plan.get(seq.seq_id, 0)) for seq, d in drafts.items()}

    def _choose(self, live: list, seqs: list, n: int, lengths: list[int], probe: bool = False,
                confidence: list | None = None) -> list[int]:
        """The rule of the module docstring: k for each of `seqs`, whose drafts can be this long.
        `probe`: the best choice that verifies drafts, even where plain decoding is worth more;
        `confidence`: each draft's own estimate per position (Draft.confidence), or None."""
        n_live, m = len(live), max(1, n)
        if not (self.plain or self.spec):  # nothing measured yet (no calibration): verify whole drafts
            return [min(length, m, max(0, seq.left - 1)) for seq, length in zip(seqs, lengths)]
        gains = np.zeros((len(seqs), m))
        for e, (seq, length) in enumerate(zip(seqs, lengths)):
            room = max(0, min(length, m, seq.left - 1))  # drafts past the budget are never verified
            gains[e, :room] = self.tracks[seq.seq_id].acceptance.gains(room, confidence[e] if confidence else None)
        plain_cost, spec, draft = self._tables(n_live, len(seqs), m)  # spec[r - n_live]: r rows; draft[length]
        # the step without drafts to beat: n-gram drafts are made either way; a model drafter's
        # sequences can stop speculating (gave_up), so its bar is a step that keeps no draft current
        plain = n_live / (plain_cost + draft[min(n, m)] if self.cheap else self._bar(n_live, plain_cost))
        if self.equal_spans and n_live > 1:  # one k for every sequence
            ks = np.arange(1, m + 1)
            value = n_live + np.cumsum(gains.sum(axis=0))
            cost = spec[n_live * ks] + draft[ks]
            j = int(np.argmax(value / cost))
            k = int(ks[j]) if probe or value[j] / cost[j] > plain else 0
            return [min(k, int(np.count_nonzero(g))) for g in gains]
        flat = gains.ravel()
        order = np.argsort(-flat, kind="stable")
        order = order[flat[order] > 0]
        if not len(order):
            return [0] * len(seqs)
        value = n_live + np.cumsum(flat[order])
        need = np.maximum.accumulate(order % m) + 1  # the draft length each prefix needs
        ratio = value / (spec[1:len(order) + 1] + draft[need])
        j = int(np.argmax(ratio))
        if ratio[j] <= plain and not probe:
            return [0] * len(seqs)
        return np.bincount(order[:j + 1] // m, minlength=len(seqs)).tolist()

    def _tables(self, n_live: int, n_seqs: int, m: int) -> tuple[float, np.ndarray, np.ndarray]:
        """The costs the rule reads, computed again every COST_REFRESH steps (they drift slowly,
        and reading them off the measured shapes is most of the rule's time): a plain step's, a
        speculative step's by its verify rows (from the sequences' own rows to all of them at
        length m), and the draft call's by its length (0..m)."""
        key = (n_live, n_seqs, m)
        if self._table is not None and self._table[0] == key and self._steps - self._table[1] < COST_REFRESH:
            return self._table[2]
        rows = np.arange(n_live, n_live * (m + 1) + 1)
        tables = (self._plain_cost(n_live), self._spec_cost(rows, n_live), self._draft_cost(n_seqs, np.arange(m + 1)))
        self._table = (key, self._steps, tables)
        return tables

    def _plain_cost(self, n_live: int) -> float:
        """Seconds of a step that verifies no draft (the speculative steps' costs where no plain
        step was measured yet)."""
        costs, rest = (self.plain, self.rest_plain) if self.plain else (self.spec, self.rest_spec)
        return float(costs.at([n_live])[0]) + (rest or 0.0)

    def _spec_cost(self, rows: np.ndarray, n_live: int) -> np.ndarray:
        """Seconds of the verify and the rest of a step verifying `rows` rows, without its draft
        call; the plain steps' verify is the line's point at the sequences' own rows."""
        rest = self.rest_spec if self.rest_spec is not None else (self.rest_plain or 0.0)
        if self.plain and self.spec and n_live not in self.spec:
            return self.spec.at(rows, extra={n_live: float(self.plain.at([n_live])[0])}) + rest
        return (self.spec if self.spec else self.plain).at(rows) + rest

    def _draft_cost(self, n_seqs: int, lengths) -> np.ndarray:
        """Seconds of a draft call for these lengths (the fixed block's, whatever the length)."""
        lengths = np.asarray(lengths)
        return self._draft_costs(n_seqs).at(np.full(lengths.shape, self.n_max) if self.fixed_block else lengths)

    def _draft_costs(self, n_seqs: int, exact: bool = False) -> ShapeCosts:
        """The draft call's costs with this many sequences drafting (unless `exact`, the nearest
        count's when this one was never measured)."""
        if exact or n_seqs in self.draft or not self.draft:
            return self.draft.setdefault(n_seqs, ShapeCosts(proportional=not (self.cheap or self.fixed_block)))
        return self.draft[min(self.draft, key=lambda c: abs(c - n_seqs))]

    # --- costs known before the first step (calibration.py) ---------------------------------------

    def force(self, k: int) -> None:
        """Verify exactly k drafts of every sequence in the next step (a calibration's schedule);
        the step is measured as any other."""
        self._forced = k

    def skip(self, steps: int) -> None:
        """Do not measure the next `steps` steps (their graphs are new)."""
        self._skip = self._steps + steps

    @property
    def steps(self) -> int:
        """Steps the rule has seen (a calibration's included)."""
        return self._steps

    def settle(self) -> None:
        """The calibration is over: what its steps cost is kept, what its drafts taught is not (the
        model's own continuation of a synthetic prompt repeats itself: on the tiny pair it drafted
        at 70-98 % per position, and new sequences started from it verified drafts that lost), and
        the rule decides from the next step on."""
        self.tracks.clear()
        self._plan.clear()
        self._plain_left, self._plain_next = 0, 1
        self._learned = None
        self._forced = None
        self.probes = 0
        self._quiet = self._quiet_seqs = self._quiet_steps = 0
        self._steps = max(self._steps, 2 * WARM_UP)  # no warm-up: the costs are known

    def tables(self) -> dict:
        """The cost tables as plain data (JSON): what `seed` starts another rule from."""
        return {"plain": self.plain.to_json(), "spec": self.spec.to_json(),
                "draft": {str(n): c.to_json() for n, c in self.draft.items()},
                "rest_plain": self.rest_plain, "rest_spec": self.rest_spec, "probe_cost": self.probe_cost,
                "true_plain": self.true_plain, "plain_engine": self.plain_engine}

    def seed(self, tables: dict) -> None:
        """Start from costs measured before (`tables`): no warm-up; what this rule measures refines them."""
        proportional = not (self.cheap or self.fixed_block)
        plain, spec = ShapeCosts.seeded(tables["plain"]), ShapeCosts.seeded(tables["spec"])  # (all read
        draft = {int(n): ShapeCosts.seeded(c, proportional) for n, c in tables["draft"].items()}  # first)
        rest = (tables["rest_plain"], tables["rest_spec"], tables["probe_cost"])
        true_plain = (int(tables["true_plain"][0]), float(tables["true_plain"][1])) if tables.get("true_plain") else None
        self.plain, self.spec, self.draft, self.true_plain = plain, spec, draft, true_plain
        self.plain_engine = (int(tables["plain_engine"][0]), float(tables["plain_engine"][1])) \
            if tables.get("plain_engine") else None
        self.rest_plain, self.rest_spec, self.probe_cost = rest
        self._table = None
        self.settle()

    def hopeless(self, n_live: int) -> bool:
        """Whether no draft could pay with n_live sequences even if drafts were as good as the best
        pairs' (each drafted token surviving with chance HOPE): for every k, a step verifying k
        drafts of each sequence (its draft call and its verify of n_live (k + 1) rows) costs more
        than the plain steps it would save, as a plain engine makes them (plain_engine: the engine
        becomes one). Then a model drafter is not worth calling at all. False until both kinds of
        step were measured."""
        if self.cheap or not self.plain or not (self.spec and self.draft):
            return False
        ks = np.arange(1, self.n_max + 1)
        saved = np.cumsum(HOPE ** ks) + 1  # expected committed tokens of a step at k
        spec = self._spec_cost(n_live * (ks + 1), n_live) + self._draft_cost(n_live, ks)
        return bool(np.all(spec >= saved * self._plain_engine_cost(n_live)))

    def _plain_engine_cost(self, n_live: int) -> float:
        """Seconds of a plain engine's step of n_live sequences: measured by the calibration (in
        proportion to this engine's k = 0 steps for another count), else this engine's own (_bar)."""
        bar = self._bar(n_live, self._plain_cost(n_live))
        if self.plain_engine is None:
            return bar
        n0, seconds = self.plain_engine
        at_n0 = self._plain_cost(n0)
        return min(bar, seconds * self._plain_cost(n_live) / at_n0) if at_n0 > 0 else bar

    def _bar(self, n_live: int, plain_cost: float) -> float:
        """Seconds of a step of n_live sequences that do not speculate at all (measured by the
        calibration, read off the k = 0 steps' costs in proportion), else of a k = 0 step: the
        first is cheaper where keeping a draft current costs (features captured, held, flushed)."""
        if self.true_plain is None or not self.plain:
            return plain_cost
        n0, seconds = self.true_plain
        at_n0 = self._plain_cost(n0)
        return min(plain_cost, seconds * plain_cost / at_n0) if at_n0 > 0 else plain_cost

    # --- after the verify ---------------------------------------------------------------------------

    def measured(self, n_live: int, n_drafting: int, n: int, t_draft: float, rows: int, t_verify: float,
                 t_rest: float, n_committed: int) -> None:
        """One step's costs: the draft call (n_drafting sequences, length n; 0: none), the verify
        decode of `rows` rows (n_live sequences), the rest of the step, and the tokens it committed."""
        called = n_drafting > 0 and not self.cheap  # a model's draft call
        if self._steps <= self._skip:  # the engine's first steps build and allocate their graphs
            self._called = called
            return
        warm = self._called or self.cheap  # the step before drafted too: the caches hold both models
        if n_drafting and (warm or not self._draft_costs(n_drafting)):
            self._draft_costs(n_drafting, exact=True).add(self.n_max if self.fixed_block else n, t_draft)
        if self._probing:  # also injected what the steps before it held: what it cost beyond plain decoding
            self._probing = False
            if self.plain:
                extra = t_draft + t_verify + t_rest - n_committed * self._plain_cost(n_live) / n_live
                self.probe_cost = ema(self.probe_cost, max(extra, 0.05 * self._plain_cost(n_live)))

        elif rows > n_live:  # drafts verified; the first step of a stretch pays for cold caches
            if warm or not self.spec:
                self.spec.add(rows, t_verify)
                self.rest_spec = ema(self.rest_spec, t_rest)
        elif not self._called and not called:
            self.plain.add(rows, t_verify)
            self.rest_plain = ema(self.rest_plain, t_rest)
        self._called = called

    def committed(self, seq, pos0: int, tokens: np.ndarray, k: int, accepted: int) -> None:
        """A sequence's step is over: its draft (None: it made none) of which k were verified and
        `accepted` survived. Drafts are scored when the text that decides them is committed."""
        t = self.tracks[seq.seq_id]
        probe, t.probe = t.probe, False
        t.k = 0 if probe else k  # (the rule's own choice: a probe leaves it at 0)
        if probe:
            self._plan[seq.seq_id] = 0
        # a probe is judged on what its verify accepted at the steady costs (its own step also paid
        # for catching the draft up on the steps before it, which a stretch of drafting would not)
        paid = probe and tokens is not None and self._paid(accepted, k)
        if probe:
            t.failed = 0 if paid else t.failed + 1
        if tokens is None or not len(tokens):
            return
        if accepted < k or accepted == len(tokens):  # the verify decided it
            t.acceptance.add(len(tokens), accepted, len(tokens))
            t.fresh = True
            if paid:  # it paid: probe often again
                t.wait = PROBE_FIRST
        else:
            t.pending.append([pos0, tokens.tolist(), accepted, probe])

    def gave_up(self, seq) -> bool:
        """Whether a sequence should stop speculating for the rest of its text: GIVE_UP probes in a
        row did not pay and the rule never chose drafts in between (a model drafter: its steps at
        k = 0 still pay for keeping the draft current, on the tiny pair 10-20 % of a plain step;
        a new sequence starts afresh, from what this one learned)."""
        t = self.tracks.get(seq.seq_id)
        return t is not None and not self.cheap and not t.fixed and t.failed >= GIVE_UP

    def _paid(self, right: int, drafted: int) -> bool:
        """Whether a step whose `right` first drafts of `drafted` survived committed more tokens per
        second than plain decoding (one sequence's costs): a probe that did is a sign to probe
        again soon (the text repeats, or the drafts are better than the counts say)."""
        if not self.plain or not self.spec:
            return right == drafted
        k = min(drafted, self.n_max)
        cost = float(self._spec_cost(np.array([k + 1]), 1)[0] + self._draft_cost(1, [k])[0])
        return (right + 1) * self._bar(1, self._plain_cost(1)) >= cost

    def _score(self, seq) -> None:
        """Score the sequence's pending drafts against the tokens committed after them."""
        t = self.tracks[seq.seq_id]
        if not t.pending:
            return
        history, still = seq.history, []
        for item in t.pending:
            pos0, tokens, start, probe = item
            matched, reach = draft_match(tokens, history, pos0, start)
            known = min(len(tokens), reach)
            if known <= start:
                still.append(item)
                continue
            if probe and self._paid(matched, len(tokens)):  # it would have paid: probe often again
                t.wait = PROBE_FIRST
            if matched < known or known == len(tokens):
                t.acceptance.add(len(tokens), matched, len(tokens))
                t.fresh = True
            else:
                item[2] = known
                still.append(item)
        t.pending = still
