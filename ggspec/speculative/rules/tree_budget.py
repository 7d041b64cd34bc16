"""`--spec-tree-budget N|auto`: how many draft nodes a step verifies as a token tree (0: the chain).

A tree of B nodes is grown from the draft's per-position candidates (tree.ddtree) and verified in
one target decode of B + 1 rows per sequence (tree_verify.py) where the chain takes n + 1. Its
greedy accepted length is never below the chain's (the chain is its first path) and never above n.
Whether that pays depends on the machine: on a GPU a verify of 33 rows costs about what 8 do, on
two CPU cores 2-3x as much (verify_cost.py --rows). So with `auto` each step's budget is chosen:
  rate(b) = (1 + A(b)) / (other + verify(rows(b)) + grow),
the expected committed tokens of a step at budget b (A: its mean accepted length) over its
seconds: the step's draft and the rest (`other`, measured), the verify decode at the step's rows
(the adaptive draft length's cost table by rows, or this rule's own), and growing the tree
(reading the candidates, measured). b = 0 is the chain, A(0) the chain's accepted length.

Learning A(b) costs nothing extra once trees are verified: a tree of the largest budget holds the
trees of every smaller one (DDTree adds nodes best-first: its first b nodes are the budget-b tree),
so scoring the tree against the text the target commits gives A(b) for every b at once, A(0) too
(its first n nodes are the chain). While the rule verifies chains it grows a tree every
SCORE_EVERY drafting steps only to score it, twice as long after each choice of the chain (up to
SCORE_MAX: reading candidates costs ~3 ms for 7 rows of a 150k vocabulary on this CPU, and on the
tiny pair, whose steps take 1.4 ms, scoring every fourth step cost 20 % of the speed), and not at
all where even the best tree could not pay: a budget whose
verify costs more than (1 + GAIN_MAX) times the chain's, for every budget, is hopeless (a tree
accepts at most GAIN_MAX more per call than the chain: DDTree's best reported gain is +65 %).
Costs of row counts not measured yet are read off the line through those measured, so a tree
is tried where that line says it could pay, one budget beyond the largest measured at a time, and
its measured cost corrects the line.

Every choice is made from the past only, and the tree's walk commits what the target would
(tree_verify.py): greedy output equals plain greedy, sampled output keeps the target's
distribution, whatever the budget.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from ggspec.errors import InputError
from ggspec.speculative.proposer import Draft
from ggspec.speculative.rules.costs import ShapeCosts, ema
from ggspec.speculative.tree import Tree, ddtree
from ggspec.speculative.tree_verify import MAX_SEQ, tree_seq_ids

BUDGETS = (8, 16, 32, 64)  # the budgets `auto` chooses among (from 2 n_max up to its cap), and 0: the chain
AUTO_MAX = 64  # `auto`'s largest budget
TOP_K = 8  # candidates per draft position a tree grows from
GAIN_MAX = 0.65  # the most a tree is believed to add to the chain's tokens per target call
SCORE_EVERY = 4  # drafting steps per scored tree while the rule verifies chains, at first
SCORE_MAX = 256  # ... and at most, after choices of the chain in a row (each doubles the wait)
REPLAN = 16  # steps between two choices
DECAY = 0.98  # per scored tree: the acceptance follows the text's current kind


def parse_tree_budget(text: str) -> tuple[int | None, bool]:
    """`N` (a fixed budget; 0: chains), `auto` (chosen by cost, up to AUTO_MAX nodes) or `auto:N`
    (chosen, up to N). Returns (the budget or its cap, None for `auto`'s default cap; chosen?)."""
    text = text.strip().lower()
    auto = text == "auto" or text.startswith("auto:")
    value = text[5:] if text.startswith("auto:") else None if auto else text
    if value is None:
        return None, True
    try:
        budget = int(value)
    except ValueError:
        raise InputError(f"{text}: expected a number of tree nodes, 'auto' or 'auto:N'", field="tree_budget") from None
    if not 0 <= budget <= 255:
        raise InputError(f"the tree budget must be within 0..255 nodes (got {budget})", field="tree_budget")
    return budget, auto


@dataclass
class _Scored:
    """A tree waiting for the text that decides it: grown after position pos0."""

    pos0: int
    tree: Tree
    n: int  # the draft length it was grown for (its deepest node)


@dataclass
class TreeStats:
    """What the rule has seen: trees grown and verified, and the mean accepted length per budget."""

    grown: int = 0
    verified: int = 0
    scored: int = 0
    accepted: dict[int, float] = field(default_factory=dict)  # budget (0: chain) -> mean accepted


class TreeBudget:
    """Grows the drafts' trees and chooses the budget (module docstring)."""

    def __init__(self, n_max: int, cap: int, auto: bool, verify_costs: ShapeCosts | None = None) -> None:
        """`cap`: the largest budget (fixed: every step's); `verify_costs`: the target decode's
        seconds by rows (the adaptive draft length's table; None: this rule measures its own)."""
        self.n_max = n_max
        self.cap = cap
        self.auto = auto
        # `auto` chooses among trees of at least two chains' nodes (a smaller one adds too few)
        self.budgets = sorted({b for b in BUDGETS if 2 * n_max <= b < cap} | {cap}) if auto else [cap]
        self._own_costs = verify_costs is None
        self.verify = ShapeCosts() if verify_costs is None else verify_costs
        self.other: float | None = None  # seconds of a drafting step besides its verify and growing
        self.grow_cost: float | None = None  # seconds to grow the trees of one step
        self.stats = TreeStats()
        self._counts = {b: [0.0, 0.0] for b in [0, *self.budgets]}  # budget -> [weight, accepted sum]
        self._pending: dict[int, list[_Scored]] = {}
        self.budget = cap if not auto else 0  # this step's
        self.score_every = SCORE_EVERY
        self._steps = 0
        self._since = REPLAN
        self.last_grow = 0.0  # seconds growing this step's trees

    # --- growing ---------------------------------------------------------------------------------

    def wants(self, n_drafting: int) -> bool:
        """Whether the next step grows trees: to verify them, or (auto, verifying chains) to score
        one, every `score_every` drafting steps where some budget could pay."""
        if self.budget:
            return True
        return self.auto and (self._steps + 1) % self.score_every == 0 and not self.hopeless(n_drafting)

    def grow(self, proposer, seqs: list, n: int, drafts: list[Draft], eligible) -> list[Draft]:
        """The drafts with a tree each, for the sequences `eligible(seq)` allows (no grammar,
        penalties or bias), where this step verifies trees or scores one. The candidates are read
        from the draft's last call (or what it kept of its rows), so this runs right after propose."""
        grows = self.wants(len(seqs))
        self._steps += 1
        self.last_grow = 0.0
        # (a seeded sampled sequence's draws walk its tree: under `auto`, whose choice follows timings,
        # it verifies chains, so the same seed gives the same text on any machine and batch)
        mine = [i for i, seq in enumerate(seqs)
                if eligible(seq) and len(drafts[i]) == n and not (self.auto and seq.seeded)] if grows else []
        if not mine:
            return drafts
        t0 = time.perf_counter()
        out = list(drafts)
        for i, candidates in zip(mine, proposer.marginals([seqs[i] for i in mine], n, TOP_K)):
            if candidates is not None and len(candidates[0]) == n:
                out[i] = self._grown(seqs[i], drafts[i], candidates, n)
        self.last_grow = time.perf_counter() - t0
        self.grow_cost = ema(self.grow_cost, self.last_grow)
        return out

    def _grown(self, seq, draft: Draft, candidates: tuple[np.ndarray, np.ndarray], n: int) -> Draft:
        """One sequence's draft with its tree (auto: the largest budget's, kept to be scored; the
        step verifies its first `budget` nodes, or the chain while the budget is 0)."""
        room = seq.limit - seq.pos - 1  # cells for the tree's nodes
        tree = ddtree(*candidates, self.cap if self.auto else min(self.cap, room))
        if seq.sampling.greedy and not np.array_equal(tree.tokens[:tree.n_chain], draft.tokens[:tree.n_chain]):
            return draft  # (a draft picked otherwise than the candidates' best: keep the chain)
        self.stats.grown += 1
        if self.auto:
            self._pending.setdefault(seq.seq_id, []).append(_Scored(seq.pos, tree, n))
        if not self.budget:
            return draft
        tree = tree.within(n, min(self.budget, room))
        # a sampling sequence's drafts were drawn: the tree's nodes (point masses) replace them
        chain = draft if seq.sampling.greedy else Draft(tree.tokens[:tree.n_chain])
        return Draft(chain.tokens, chain.probs, tree)

    # --- learning --------------------------------------------------------------------------------

    def committed(self, seq) -> None:
        """Score the sequence's pending trees against the text committed after them."""
        pending = self._pending.get(seq.seq_id)
        if not pending:
            return
        history, still = seq.history, []
        for item in pending:
            continuation = history[item.pos0 + 1:item.pos0 + 1 + item.n]
            path = item.tree.held(continuation)
            if len(path) == len(continuation) < item.n:  # the text has not decided it yet
                still.append(item)
                continue
            self._score(path, item.tree.n_chain)
        self._pending[seq.seq_id] = still

    def _score(self, path: list[int], n_chain: int) -> None:
        """One decided tree: its accepted length at each budget (the leading path nodes among its
        first b nodes; the chain: among its first n_chain)."""
        self.stats.scored += 1
        for b, counts in self._counts.items():
            limit = n_chain if b == 0 else b
            held = next((j for j, node in enumerate(path) if node >= limit), len(path))
            counts[0] = counts[0] * DECAY + 1.0
            counts[1] = counts[1] * DECAY + held
            self.stats.accepted[b] = counts[1] / counts[0]

    def forget(self, seq) -> None:
        self._pending.pop(seq.seq_id, None)

    def measured(self, n_live: int, rows: int, t_verify: float, t_other: float, trees: int) -> None:
        """A drafting step's costs: its verify decode of `rows` rows and the rest (draft, injection,
        Python); `trees`: how many trees it verified."""
        if self._own_costs:
            self.verify.add(rows, t_verify)
        self.other = ema(self.other, t_other)
        self.stats.verified += trees
        self._since += 1

    # --- choosing --------------------------------------------------------------------------------

    def choose(self, n_live: int, n_drafting: int) -> int:
        """This step's budget (0: the chain): fixed, or every REPLAN steps the best rate."""
        if not self.auto:
            return self.budget
        if self._since < REPLAN or self.other is None or not self.verify:
            return self.budget
        self._since = 0
        a = self.stats.accepted
        if 0 not in a:
            return self.budget
        rates = {b: (1.0 + a.get(b, a[0])) / self._seconds(b, n_live, n_drafting)
                 for b in [0, *self._reachable(n_live, n_drafting)]}
        self.budget = max(rates, key=lambda b: (rates[b], -b))
        self.score_every = SCORE_EVERY if self.budget else min(2 * self.score_every, SCORE_MAX)
        return self.budget

    def _reachable(self, n_live: int, n_drafting: int) -> list[int]:
        """The budgets whose verify cost is measured, and the next larger one: a size beyond the
        measured ones is read off a line (or, with one size measured, taken as that size's cost),
        so trees are tried one budget up at a time, each try measuring the next point of the line
        (on this CPU a first try of 64 nodes would cost 6x a chain step, 16 of them 20 % of a run)."""
        seen = max(self.verify.samples, default=0)
        out = []
        for b in self.budgets:
            out.append(b)
            if n_live + n_drafting * b > seen:
                break
        return out

    def _seconds(self, b: int, n_live: int, n_drafting: int) -> float:
        """A drafting step's expected seconds at budget b (0: the chain at the full length)."""
        rows = n_live + n_drafting * (b if b else self.n_max)
        grow = (self.grow_cost or 0.0) if b else 0.0
        return float(self.verify.at([rows])[0]) + (self.other or 0.0) + grow

    def hopeless(self, n_drafting: int) -> bool:
        """Whether no budget could pay even if its trees gained GAIN_MAX over the chain: then no
        tree is grown even to score it (on a CPU whose rows cost in proportion)."""
        if not self.verify or self.other is None:
            return False
        chain = self._seconds(0, n_drafting, n_drafting)
        return all(self._seconds(b, n_drafting, n_drafting) > (1.0 + GAIN_MAX) * chain for b in self.budgets)


def _byte_exact(cfg) -> bool:
    """Whether the pair runs where the oracle is byte identity (ggspec.speculative.lossless)."""
    from ggspec.native.bindings import batch_invariant

    on_cpu = not cfg.n_gpu_layers and not cfg.n_gpu_layers_draft and not cfg.placement.multi_device
    return on_cpu and batch_invariant() > 0


def plan_trees(cfg, plan, recurrent: bool, n_max: int) -> int:
    """The largest tree budget an engine may verify (0: chains only). A budget given as a number
    that cannot run here is refused in one line; `auto` allows trees only where they run and
    allowing them costs nothing: one sequence (several would share one unified cache, every
    verify row attending over every sequence's cells: 22 % of the aggregate speed at -np 4 on
    the tiny pair), and not where outputs are byte-exact (every model on the CPU backend with its
    batch invariance): a tree step keeps its accepted path's cells among freed branch cells, which
    later rows fill, so attention then sums over cells out of position order and a near-tie can flip
    (seen once in 12 prompts on the Qwen2.5-Coder pair at n_max 15; docs/concepts/losslessness.md)."""
    cap = AUTO_MAX if cfg.tree_budget is None else cfg.tree_budget
    if cap == 0 or not plan.types:
        return 0
    fixed = not cfg.tree_auto
    if not fixed and _byte_exact(cfg):
        return 0

    def refuse(why: str, field: str = "tree_budget") -> int:
        if fixed:
            raise InputError(f"token trees (a budget of {cap} nodes) {why}", field=field)
        return 0

    if not plan.grows_trees:
        return refuse(f"grow from a draft's per-position candidates, which {plan.spec_type} drafts do not give here "
                      "(docs/concepts/trees.md lists the drafters that do)", "spec_type")
    if recurrent:
        return refuse("run on dense targets only for now: on recurrent layers every branch needs a recurrent state "
                      "of its own (19 MiB each on Qwen3.5-0.8B's shape), the tree's decode costs 1.7-1.8x a chain of "
                      "as many rows, and the accepted path's state would have to be replayed")
    if cfg.inject != "pruned":
        return refuse(f"give the draft their accepted path's features by pruned injection, not {cfg.inject}",
                      "inject")
    if not fixed and cfg.parallel > 1:
        return 0
    if tree_seq_ids(cfg.parallel, cap) > MAX_SEQ:
        return refuse(f"with {cfg.parallel} parallel sequences need {tree_seq_ids(cfg.parallel, cap)} sequence ids "
                      f"(a branch per leaf), and llama.cpp holds {MAX_SEQ}: lower the budget or the parallel sequences")
    rows = cfg.parallel * (cap + 1)
    if min(cfg.ctx.n_batch, cfg.ctx.n_ctx) < rows:
        return refuse(f"verify {rows} rows at once ({cfg.parallel} x (budget + 1)), more than the batch size "
                      f"{min(cfg.ctx.n_batch, cfg.ctx.n_ctx)}", "n_batch")
    return max(cap, 0) if cap >= 1 else 0
