"""One step's transaction for every live sequence: six phases over one record.

  plan      the common draft length and the sequences that draft (the adaptive rule may shorten
            it or stop drafting for the step); the proposer's captured rows reach the draft
  propose   one draft call for every drafting sequence (token trees grown from its candidates),
            each draft cut where its budget, its grammar and its own limits stop it, then to the
            adaptive rule's length
  lay out   every sequence's span [id_last, d1..dn] (or its tree's nodes) in one verify batch
  verify    one target decode; each sequence's outcome: chains by the verifier, trees by their walk
  commit    per sequence: the proposer keeps the committed rows; rejected cells leave the target's
            cache (seq_rm, a recurrent plane switch) or, where no plane kept the state before the
            span, the committed tokens are replayed: every such sequence in one decode
  record    the step's costs to the rules that choose lengths and trees; each sequence takes its
            tokens and gets its Step

`Layout` is the record (in the spirit of vLLM's SpecDecodeMetadata): one `Part` per live
sequence (its draft, its rows, its outcome) and the step's totals. Each phase reads and writes it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from ggspec.speculative.proposer import Draft, Span, verify_span
from ggspec.speculative.sequence import Sequence
from ggspec.speculative.stats import Step, token_probs, top2_margin
from ggspec.speculative.tree_verify import Placed, TreeVerify
from ggspec.speculative.verifier import Outcome, accept_greedy, row_by_row


@dataclass(eq=False, slots=True)
class Part:
    """One live sequence's share of a step."""

    seq: Sequence
    made: Draft | None = None  # its draft as made and cut (budget, grammar, limits); None: it did not draft
    draft: Draft = field(default_factory=Draft.empty)  # what it verifies (`made` at the adaptive rule's length)
    span: Span | None = None  # its rows in the verify batch
    block: np.ndarray | None = None  # a chain's row tokens [id_last, d1..dn, padding]; None for a tree
    placed: Placed | None = None  # a tree's nodes in the batch; None for a chain
    outcome: Outcome | None = None  # the drafts accepted and the target's tokens
    path: list[int] | None = None  # a tree's committed rows (offsets in its span)
    probs: list | None = None  # each committed token's probabilities (when the sequence asks: n_probs)
    margin: float | None = None  # the target's top-2 margin of a plain step (record_margins)
    replayed: bool = False  # its committed tokens were decoded again (no plane kept its state)


@dataclass(slots=True)
class Layout:
    """One step: its parts, in sequence-id order, and what the whole step drafted and cost."""

    parts: list[Part]
    n: int = 0  # the common draft length of the drafting sequences
    drafting: list[Sequence] = field(default_factory=list)
    rows: int = 0  # rows of the verify batch
    calls0: int = 0  # llama.cpp calls before the step
    t_start: float = 0.0
    t_draft: float = 0.0  # proposing (trees included)
    t_grow: float = 0.0  # of which growing trees
    t_verify: float = 0.0  # the verify decode, acceptance and rolling back (injection not counted)
    t_inject: float = 0.0  # handing captured rows to the draft, wherever it happened
    t_replay: float = 0.0

    @property
    def live(self) -> list[Sequence]:
        return [p.seq for p in self.parts]


class Transaction:
    """The phases of one step on `engine` for `live` (each sequence once, in sequence-id order)."""

    def __init__(self, engine, live: list[Sequence]) -> None:
        self.engine = engine
        self.layout = Layout([Part(seq) for seq in live])
        self._t_verify = 0.0  # when the verify phase began (lay_out)
        self._t_flushed = 0.0  # of the verify decode, seconds handing captured rows to the draft

    def run(self) -> list[tuple[Sequence, Step]]:
        """Each live sequence's Step (none where every sequence's context was full)."""
        self.plan()
        self.propose()
        if not self.lay_out():
            return []
        self.verify()
        self.commit()
        return self.record()

    # --- plan ------------------------------------------------------------------------------------

    def plan(self) -> None:
        """Reads the live sequences and the adaptive rule; writes `n` and `drafting`; flushes what
        the proposer captured (held in host memory instead where nobody drafts this step)."""
        e, r = self.engine, self.layout
        r.t_start, r.calls0 = time.perf_counter(), e.calls()
        r.n, r.drafting = self._draft_room(r.live)
        auto = e.draft_length
        if auto is not None and r.drafting:
            r.n, r.drafting = auto.before(r.live, r.drafting, r.n)
        e.holding = auto is not None and not r.drafting and e.proposer is not None and e.proposer.holds
        r.t_inject = e.flush()

    def _draft_room(self, live: list[Sequence]) -> tuple[int, list[Sequence]]:
        """The common draft length of this step and the sequences that draft. A sequence drafts
        while its budget leaves room for a draft; its block is as long as n_max and its context
        allow, whatever its budget (as in llama.cpp's loop: a DFlash block's length changes its
        drafts, so a sequence's drafts, and its sampled text, never depend on the others); the
        drafts past the budget are cut before verifying. Blocks must be equal: the length is the
        largest of those, and a sequence whose context cannot hold it verifies alone."""
        e = self.engine
        if e.proposer is None:
            return 0, []
        room = {seq: min(e.n_max, seq.limit - seq.pos - 1) for seq in live if seq.speculate and seq.left > 1}
        n = max(room.values(), default=0)
        if n <= 0:
            return 0, []
        return n, [seq for seq, r in room.items() if r >= n]

    # --- propose ---------------------------------------------------------------------------------

    def propose(self) -> None:
        """Reads `n` and `drafting`; writes each drafting part's `made` and `draft` (and t_draft):
        one draft call, trees grown where the tree rule wants them, each draft cut past its budget
        (never verified), at its grammar's first forbidden token and to its own limits, then to
        the length the adaptive rule verifies."""
        e, r = self.engine, self.layout
        t = time.perf_counter()
        if r.drafting:
            r.n = min(r.n, max(seq.limits.n_max for seq in r.drafting))  # no longer than any of them may verify
            proposed = self._drafts(r.drafting, r.n)
            by_seq = {p.seq: p for p in r.parts}
            made = {}
            for seq, d in zip(r.drafting, proposed):
                made[seq] = by_seq[seq].made = seq.limits.cut(grammar_cut(seq, d.head(seq.left - 1)))
            verified = e.draft_length.after(r.live, made) if e.draft_length is not None else None
            for seq, d in made.items():
                by_seq[seq].draft = d if verified is None else d.head(verified[seq])
        r.t_draft = time.perf_counter() - t

    def _drafts(self, drafting: list[Sequence], n: int) -> list[Draft]:
        """The proposer's drafts, grown into trees where the tree rule wants them (a drafter that
        keeps candidates while drafting is told before it drafts; they are read after)."""
        e, trees = self.engine, self.engine.tree_rule
        if trees is not None:
            trees.choose(len(self.layout.parts), len(drafting))
            e.proposer.want_candidates(trees.wants(len(drafting)))
        proposed = e.proposer.propose(drafting, n)
        if trees is not None:
            proposed = trees.grow(e.proposer, drafting, n, proposed, grows_tree)
            self.layout.t_grow = trees.last_grow
        return proposed

    # --- lay out ---------------------------------------------------------------------------------

    def lay_out(self) -> bool:
        """Reads each part's draft; writes its `span` and `block` or `placed`, and `rows`: every
        sequence's span (a chain's [id_last, d1..dn], or its tree) in the engine's batch. False
        when no sequence is left: a hybrid target's spans must be equal, and a sequence whose
        cells cannot hold such a span has filled its context and ends."""
        e, r = self.engine, self.layout
        self._t_verify = time.perf_counter()
        width = self._span_width()
        if width:
            for p in [p for p in r.parts if p.seq.limit - p.seq.pos < width]:
                p.seq.done = True
                r.parts.remove(p)
            if not r.parts:
                e.holding = False
                return False
        batch = e.batch.clear()
        for p in r.parts:
            seq, tree = p.seq, p.draft.tree
            if tree is not None and len(tree) > tree.n_chain:  # (a tree that is only its chain verifies as one)
                p.placed = e.tree_verify.add(batch, seq, tree, r.rows)
                tokens = np.concatenate([[seq.id_last], tree.tokens]).astype(np.int32)
                p.span = Span(seq.seq_id, r.rows, 1 + len(tree), seq.pos, tokens)
            else:
                p.block = verify_span(seq.id_last, p.draft.tokens, width)
                batch.add_tokens(p.block, seq.pos, seq.seq_id, outputs="all")
                p.span = Span(seq.seq_id, r.rows, len(p.block), seq.pos, p.block)
            r.rows += p.span.n_rows
        return True

    def _span_width(self) -> int | None:
        """Hybrid targets with several sequences verify equal spans: llama.cpp splits a batch into
        ubatches holding the same number of tokens of every sequence, and a span split across two
        ubatches loses its input state (no replay could rebuild it). Shorter spans are padded
        (the padding is rolled back like rejected drafts). None: spans keep their own length."""
        parts = self.layout.parts
        if not (self.engine.models.target.is_recurrent and len(parts) > 1):
            return None
        return max(len(p.draft) for p in parts) + 1

    # --- verify ----------------------------------------------------------------------------------

    def verify(self) -> None:
        """Reads the batch; writes each part's `outcome`, a tree's `path`, the `probs` and
        `margin` its sequence asks for: one target decode (the captured rows flushed first: they
        count as injection), chains judged by the verifier, trees by their walk."""
        e, r = self.engine, self.layout
        self._t_flushed = e.decode_target(e.batch, [p.span for p in r.parts if p.seq.speculate])
        r.t_inject += self._t_flushed
        logits = e.target.logits_view()
        chains = [p for p in r.parts if p.placed is None]
        if chains:
            for p, out in zip(chains, e.verifier.verify(logits, [(p.seq, p.draft, p.span.row0) for p in chains])):
                p.outcome = out
        for p in r.parts:
            seq = p.seq
            if p.placed is not None:
                p.outcome, p.path = walk_tree(logits, p.placed, seq)
            if seq.n_probs:
                p.probs = [token_probs(logits[p.span.row0 + j], t, seq.n_probs) for j, t in enumerate(p.outcome.tokens)]
            if seq.record_margins and not len(p.draft):
                p.margin = top2_margin(logits[p.span.row0])

    # --- commit ----------------------------------------------------------------------------------

    def commit(self) -> None:
        """Reads the outcomes; writes `replayed` and the step's verify and replay times: the
        proposer keeps each committed span's rows, a tree's accepted path becomes its cells (its
        branches go), a chain's rejected drafts and padding leave the cache, or are replayed."""
        e, r = self.engine, self.layout
        replays = []
        for p in r.parts:
            seq, out = p.seq, p.outcome
            if p.placed is not None:  # the accepted path's rows; its branches go
                if seq.speculate:
                    e.proposer.commit(seq, seq.pos, out.accepted + 1, rows=p.path)
                e.tree_verify.commit(seq, p.placed, p.path)
                continue
            if seq.speculate:
                e.proposer.commit(seq, seq.pos, out.accepted + 1)
            keep = seq.pos + out.accepted + 1
            if keep < seq.pos + len(p.block):  # rejected drafts (or padding) to roll back
                if e.target.can_truncate(keep, seq.seq_id):
                    e.target.truncate(keep, seq.seq_id)
                else:
                    replays.append((seq, p.block[:out.accepted + 1]))
                    p.replayed = True
        r.t_verify = time.perf_counter() - self._t_verify - self._t_flushed
        if replays:
            t = time.perf_counter()
            r.t_inject += self._replay(replays)
            r.t_replay = time.perf_counter() - t

    def _replay(self, replays: list[tuple[Sequence, np.ndarray]]) -> float:
        """Rebuild recurrent states no plane kept: restore each sequence's input plane (its state
        before this verify span) and decode its committed tokens [id_last, d1..da] again, all in
        one call. No outputs: the committed tokens are known, and the draft got these rows'
        features from the verify batch (flushed before this decode)."""
        e = self.engine
        e.batch.clear()
        for seq, committed in replays:
            e.target.truncate(seq.pos, seq.seq_id)
            e.batch.add_tokens(committed, seq.pos, seq.seq_id, outputs="none")
        return e.decode_target(e.batch, None)

    # --- record ----------------------------------------------------------------------------------

    def record(self) -> list[tuple[Sequence, Step]]:
        """Reads the whole layout; tells the engine's counters, the adaptive rule and the tree
        rule what the step cost, and has each sequence take its tokens: its Step."""
        e, r = self.engine, self.layout
        t_total = time.perf_counter() - r.t_start
        e.stats.count(t_total, e.calls() - r.calls0)
        if e.draft_length is not None:
            e.draft_length.measured(len(r.parts), len(r.drafting), r.n, r.t_draft, r.rows, r.t_verify,
                                    t_total - r.t_draft - r.t_verify, sum(p.outcome.accepted + 1 for p in r.parts))
        if e.tree_rule is not None and r.drafting:
            e.tree_rule.measured(len(r.parts), r.rows, r.t_verify, t_total - r.t_verify - r.t_grow,
                                 sum(p.placed is not None for p in r.parts))
        e.holding = False
        return [(p.seq, self._sequence_step(p, t_total)) for p in r.parts]

    def _sequence_step(self, p: Part, t_total: float) -> Step:
        """One sequence's Step: the adaptive rule and the recurrent lead hear how its draft did,
        and the sequence takes its tokens (cut at its budget or its end)."""
        e, r, seq, out = self.engine, self.layout, p.seq, p.outcome
        d = len(p.draft)
        step = Step([], "spec" if d else "plain", drafted=d, accepted=out.accepted, t_draft=r.t_draft,
                    t_verify=r.t_verify, t_inject=r.t_inject, t_replay=r.t_replay, replayed=p.replayed,
                    t_total=t_total, nodes=len(p.placed.tree) if p.placed is not None else d)
        if p.margin is not None:
            step.margins.append(p.margin)
        if out.failure is not None:  # it ends alone (its rows were rolled back as rejected drafts)
            seq.fail(out.failure)
            seq.stats.add(step)
            return step
        if e.auto_lead is not None and d:
            e.auto_lead.observe(out.accepted, d)
        if seq.plain_by_cost:
            step.k = 0
        auto = e.draft_length
        if auto is not None and seq.speculate:
            step.k = d
            # a tree's chain: how far a chain verify would have accepted it (the committed tokens
            # are the target's own, so the chain is right as long as it agrees with them)
            right = out.accepted if p.placed is None else accept_greedy(p.draft.tokens[:out.accepted].tolist(),
                                                                        out.tokens)
            auto.committed(seq, seq.pos, None if p.made is None else p.made.tokens, d, right)
            if auto.gave_up(seq):
                e.stop_speculating(seq)
        seq.pos += out.accepted + 1
        step.tokens += seq.take(out.tokens, e.target_model)
        if e.tree_rule is not None:
            e.tree_rule.committed(seq)
        if p.probs is not None:
            step.probs += p.probs[:len(step.tokens)]
        e.stats.tokens += len(step.tokens)
        seq.stats.add(step)
        return step


def walk_tree(logits: np.ndarray, placed: Placed, seq: Sequence) -> tuple[Outcome, list[int]]:
    """A tree's outcome and the rows of its committed path: the greedy walk down its nodes, or
    the sampled one for a sequence that samples."""
    rows = logits[placed.row0:placed.row0 + 1 + len(placed.tree)]
    if seq.sampling.greedy:
        return TreeVerify.accept(rows.argmax(axis=1).tolist(), placed)
    return TreeVerify.sample(rows, placed, seq)


def grows_tree(seq: Sequence) -> bool:
    """Whether a sequence's drafts may be verified as a tree: nothing that judges rows by their
    history (a grammar, penalties, bias: their rows would each need the path's history) and no
    per-token probabilities asked for (they are read from a chain's consecutive rows)."""
    return not row_by_row(seq) and not seq.n_probs


def grammar_cut(seq: Sequence, draft: Draft) -> Draft:
    """A draft up to the first token the sequence's grammar forbids: the target could never
    commit it, so verifying it and what follows is wasted. Drafts drawn from a distribution keep
    their tokens (cutting on what was drawn would change the rejection sampler's distribution);
    the verifier rejects a forbidden one there."""
    if seq.grammar is None or not len(draft) or (draft.probs is not None and not seq.sampling.greedy):
        return draft
    return draft.head(seq.grammar.cut(draft.tokens.tolist()))
