"""The engine: many sequences, one speculative transaction per step for all of them.

Each `step()` first prefills the sequences that joined since the last step, then runs one
transaction for every active sequence together:
  propose  one draft call holds every drafting sequence's block (same length for all);
  verify   one target decode holds every sequence's span [id_last, d1..dn];
  accept   the verifier decides, per sequence, the accepted drafts and the target's own token;
  commit   per sequence: the rejected tail leaves the target cache (seq_rm, or a recurrent plane
           switch), the proposer keeps the committed rows' features; where no recurrent plane
           kept the needed state, the committed tokens are replayed: all such sequences in one
           decode.
A drafter that gives each position's candidates may have its drafts verified as token trees
(`--spec-tree-budget`; tree_budget.py chooses, tree_verify.py verifies): the same transaction,
with a sequence's span holding a tree's nodes instead of a chain.
So the llama.cpp calls per step do not grow with the number of sequences: one injection (more
only past the draft's n_ubatch), one draft, one verify, at most one replay. Sequences join
(`add`) and leave (finished, or `cancel`) between steps; a leaving sequence frees its seq_id and
its cache cells at once. Without a proposer the same loop is plain decoding (n = 0 for all).

The one rule that ties proposer and target together, "inject the captured feature rows before
the target decodes again", lives in `_decode_target`, the only place the target decodes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import replace

import numpy as np

from ggspec.errors import ClosedError, InputError
from ggspec.runtime import Batch
from ggspec.runtime.grammar import Grammar, GrammarSpec
from ggspec.speculative.assembly import assemble
from ggspec.speculative.rules.calibration import Calibration
from ggspec.speculative.types.draft_type import DraftPlan
from ggspec.speculative.models import Models, PairConfig
from ggspec.speculative.planes import layout_words
from ggspec.speculative.proposer import Draft, Proposer, Span, verify_span
from ggspec.speculative.sampling import DEFAULT_SEED, SamplerSettings, concrete_seed
from ggspec.speculative.sequence import DraftLimits, Sequence
from ggspec.speculative.slots import CapacityError, Slots
from ggspec.speculative.stats import EngineStats, Step, token_probs, top2_margin
from ggspec.speculative.tree_verify import Placed, TreeVerify
from ggspec.speculative.verifier import SequenceVerifier, Verifier, accept_greedy, row_by_row


class Engine:
    """Contexts, caches and the loop over a `Models`. `Engine.open(cfg)` loads the models too
    and closes them with the engine."""

    def __init__(self, models: Models, cfg: PairConfig, *, verifier: Verifier | None = None,
                 plain: bool = False, prompt_cache: bool = False, cache_ram: int | None = 0,
                 first_token_from_prefill: bool = False, keep_draft_state: bool = False,
                 wrap_proposer: Callable[[Proposer], Proposer] | None = None, standby_types: bool = False) -> None:
        """`plain`: no drafting at all (a baseline over the same weights, with no draft context
        and no rollback planes). `prompt_cache`: a slot keeps the cells of its last sequence, and
        a new prompt goes to the free slot whose cells hold the longest prefix of it: only the
        rest is decoded (llama-server's cache_prompt; not for recurrent targets, whose state
        cannot be cut back to a prefix). `cache_ram`: with the prompt cache, bytes of host memory
        for copies of cells a new prompt overwrites, which a later prompt starting the same way
        gets back (llama-server's --cache-ram; 0: none, None: no limit; see prompt_store.py).
        `first_token_from_prefill`: the prefill decodes the whole prompt and chooses the first
        token from its last row, as llama-server does, a step earlier than llama.cpp's own loop,
        whose draft positions `ggspec run` and the benchmarks mirror (see _prefill).
        `keep_draft_state`: what a drafter learns from one request serves the next (ngram-mod's
        table lives as long as the engine, as llama-server's; else each run starts afresh).
        `wrap_proposer`: makes the proposer it drafts with from its own (forced acceptance).
        `standby_types`: a speculative engine also holds the n-gram types it was not given, for
        the sequences that name them (DraftLimits.types; a server's `speculative.type`)."""
        cfg.validate()
        self.models = models
        self.target_model, self.draft_model = models.target, models.draft  # the weights (Models owns them)
        self.cfg = cfg
        self.parallel = cfg.parallel
        self.warnings: list[str] = list(models.warnings)
        self.plan = DraftPlan(None) if plain else models.plan
        self.speculative = self.plan.spec_type is not None
        self.sampling = cfg.sampling  # what a sequence added without its own settings gets
        self.verifier: Verifier = verifier or SequenceVerifier()
        self._owns_models = False
        self._closed = False
        self._state_bytes: int | None = None  # one recurrent state's bytes, measured at the first prefill
        parts = assemble(models, cfg, self.plan, keep_state=keep_draft_state, warnings=self.warnings,
                         wrap=wrap_proposer, standby=standby_types)
        self.n_max, self.target, self.draft_ctx = parts.n_max, parts.target, parts.draft_ctx
        self.proposer: Proposer | None = parts.proposer
        self.auto_lead, self.draft_length = parts.auto_lead, parts.draft_length
        self.tree_rule, self.tree_verify = None, None  # (set after the calibration: it verifies chains)
        self._batch: Batch | None = None
        self._holding = False  # this step drafts nothing and the proposer keeps rows for later (_flush)
        self.prompt_cache = prompt_cache and not models.target.is_recurrent
        if self.prompt_cache:
            self.warnings += [t.note_prompt_cache for t in self.plan.types if t.note_prompt_cache]
        self.first_token_from_prefill = first_token_from_prefill
        self._cache_ram = cache_ram
        self._hold_cells(parts)
        self.active: list[Sequence] = []
        self.stats = EngineStats()
        self._is_eog = models.target.is_eog
        self.notes: list[str] = []  # what the user should know about how it will run (not a problem)
        self.calibration: Calibration | None = None  # the adaptive rule's costs, known before the first step
        self._plain_by_cost = False
        if self.draft_length is not None and cfg.calibrate:
            try:
                self.calibration = Calibration(self)
            except BaseException:
                self.close()
                raise
            self._plain_by_cost = self.draft_length.hopeless(self.parallel)
            if self.plain_by_cost:
                self._reopen_plain()
            if self.calibration.measured:
                self.notes.append(f"measured this pair's step costs on this machine in {self.calibration.seconds:.1f} s "
                                  f"(cached for the next runs: {self.calibration.path.parent})")
            if self.plain_by_cost:
                self.notes.append("no draft length pays on this machine for this pair (measured: a draft of k "
                                  "tokens and its verify cost more than the plain steps they save, even with 95 % "
                                  "of the drafted tokens right): decoding plainly, the draft model unused")
        if parts.tree_rule is not None and not self.plain_by_cost and self.proposer.grows_trees:
            self.tree_rule = parts.tree_rule
            self.tree_verify = TreeVerify(self.target, self.parallel, parts.tree_leaves)
            self.proposer.keep_candidates()

    def _hold_cells(self, parts) -> None:
        """The batch and the slots over the assembled contexts."""
        try:
            self._batch = Batch(self.target)
            self.slots = Slots(self.target, parts.cell_contexts, self.parallel, self.prompt_cache, self._cache_ram,
                               self.block_cells + parts.tree_cells)
        except BaseException:
            self.close()
            raise

    def _reopen_plain(self) -> None:
        """An engine that will never verify a draft (plain_by_cost) runs on a plain engine's
        contexts: the draft context goes (its memory with it), and the target's is made again as
        `--no-spec` makes it (no recurrent planes, no tree cells), so it decodes what that prints."""
        for obj in (self._batch, self.proposer, self.draft_ctx, self.target):
            if obj is not None:
                obj.close()
        self._batch = self.proposer = self.draft_ctx = None
        self.auto_lead = None
        try:
            # (the draft types' options are the speculative engine's: checked, and unused here)
            parts = assemble(self.models, replace(self.cfg, spec_options={}), DraftPlan(None), keep_state=False,
                             warnings=[])
        except BaseException:
            self.target = None
            self.close()
            raise
        self.target = parts.target
        self._hold_cells(parts)

    @classmethod
    def open(cls, cfg: PairConfig, **kwargs) -> Engine:
        """Load the pair's models and build an engine that owns them."""
        models = Models(cfg)
        try:
            engine = cls(models, cfg, **kwargs)
        except BaseException:
            models.close()
            raise
        engine._owns_models = True
        return engine

    # --- sequences -------------------------------------------------------------------------------

    @property
    def capacity(self) -> int:
        """Cache cells of one sequence (Slots.capacity)."""
        return self.slots.capacity

    @property
    def block_cells(self) -> int:
        """Cells a sequence needs past its prompt and its budget: one verify block."""
        return (self.n_max if self.speculative else 0) + 1

    def check_prompt(self, prompt: np.ndarray) -> None:
        """Reject prompts llama.cpp cannot take, before anything is decoded."""
        self.slots.check_prompt(prompt)

    def can_add(self, prompt: np.ndarray, n_predict: int) -> bool:
        """Whether `add` would find a free slot now (every slot has its own cells)."""
        return bool(self.slots.free)

    def add(self, prompt, n_predict: int, *, ignore_eos: bool = False, tag: object = None,
            speculate: bool = True, record_margins: bool = False, seed: int | None = None,
            sampling: SamplerSettings | None = None, limits: DraftLimits | None = None,
            grammar: str | GrammarSpec | None = None, n_probs: int = 0, cached: bool = True) -> Sequence:
        """A new sequence; its prompt is decoded at the next step. `speculate=False` decodes it
        plainly (the baseline), `record_margins` keeps the target's top-2 margin of its plain steps,
        `sampling` chooses its tokens (default: the engine's settings; each sequence of a batch may
        have its own), `seed` keys its random draws when sampling (default: the settings' seed;
        llama.cpp's default seed means a random one), `limits` bounds its drafts' lengths within
        the engine's (a server request's own n_max / n_min), `grammar` (GBNF) constrains its
        tokens: each one is the best the grammar allows, drafts are cut where it stops allowing
        them, and sampled tokens follow the distribution the grammar leaves (llama.cpp's
        grammar sampler); with `n_probs`, each step says every committed token's probability
        and the n likeliest tokens of its row (Step.probs). `cached` False: its whole prompt is
        decoded even where a slot's cells hold its beginning (llama-server's cache_prompt: a
        cached prompt's last token is decoded alone, and llama.cpp's arithmetic depends on the
        batch, so the text can differ from an uncached run's)."""
        if self._closed:
            raise ClosedError("this Engine is closed (close() was called): it cannot be used any more")
        prompt = np.ascontiguousarray(prompt, dtype=np.int32)
        self.check_prompt(prompt)
        if n_predict < 1:
            raise InputError(f"the token budget must be at least 1 (got {n_predict})", field="n_predict")
        limits = self.check_limits(limits)
        speculate = speculate and limits.n_max > 0
        if n_probs < 0:
            raise InputError(f"n_probs must be at least 0 (got {n_probs})", field="n_probs")
        constraint = None if grammar is None else Grammar(self.target_model, grammar)
        sampling = self.sampling if sampling is None else sampling
        sampling.validate()
        if not self.can_add(prompt, n_predict):
            raise CapacityError(f"no room for another sequence now: all {self.parallel} slots are busy", field="parallel")
        explicit_seed = (sampling.seed if seed is None else seed) != DEFAULT_SEED
        slot, cached = self.slots.take(prompt, reuse=cached)
        rule = self.draft_length
        fixed = not sampling.greedy and explicit_seed  # a seeded sampled text must not depend on timings
        by_cost = speculate and (self.plain_by_cost or (
            self.proposer is not None and rule is not None and not fixed and rule.starts_plain()))
        seq = Sequence(slot, prompt, n_predict, ignore_eos=ignore_eos, tag=tag, plain_by_cost=by_cost,
                       speculate=speculate and self.proposer is not None and not by_cost,
                       record_margins=record_margins, limits=limits, grammar=constraint, n_probs=n_probs,
                       sampling=sampling, seed=concrete_seed(sampling.seed if seed is None else seed), seeded=fixed)
        seq.limit = self.slots.limit(len(prompt), n_predict)  # positions it may use
        seq.n_cached = cached
        self.active.append(seq)
        if seq.speculate:
            self.proposer.begin(seq, cached)
            if rule is not None:
                rule.begin(seq, fixed=fixed)
        elif self.proposer is not None:
            self.proposer.release(seq)  # its draft cells would go stale
        return seq

    @property
    def request_types(self) -> tuple[str, ...]:
        """The speculative types a sequence may name (DraftLimits.types): the engine's own and
        those on standby, in llama.cpp's order; none where it does not speculate (decoding plainly
        by cost, its own: its sequences decode plainly whatever they name)."""
        if not self.speculative:
            return ()
        held = getattr(self.proposer, "proposers", None)
        return self.plan.kinds if held is None else tuple(p.name for p in held)

    def check_limits(self, limits: DraftLimits | None) -> DraftLimits:
        """A sequence's own draft limits, validated against the engine's (None: the engine's)."""
        if limits is None:
            return DraftLimits(self.n_max)
        if limits.p_min is not None and not 0.0 <= limits.p_min <= 1.0:
            raise InputError(f"a sequence's confidence cut-off must be within 0..1 (got {limits.p_min})", field="p_min")
        if limits.types is not None:
            held = self.request_types
            unknown = [t for t in limits.types if t not in held]
            if unknown or not limits.types:
                have = f"drafts with {', '.join(held)}" if held else "does not speculate"
                raise InputError(f"this engine {have}: a sequence cannot draft with "
                                 f"{', '.join(unknown) or 'no type'}", field="spec_type")
        if not 0 <= limits.n_max <= self.n_max:
            raise InputError(f"a sequence's draft length must be within 0..{self.n_max} (this engine's n_max; got "
                             f"{limits.n_max})", field="n_max")
        if not 0 <= limits.n_min <= limits.n_max:
            raise InputError(f"a sequence's shortest draft must be within 0..{limits.n_max} (its n_max; got "
                             f"{limits.n_min})", field="n_min")
        return limits

    @property
    def plain_by_cost(self) -> bool:
        """The costs calibrated before the first step say no draft can pay with every slot decoding:
        its sequences decode plainly, the draft model never called (see DraftLength.hopeless).
        Decided once, so every request on the engine runs the same way."""
        return self._plain_by_cost

    def cancel(self, seq: Sequence) -> None:
        """Stop a sequence now; its slot and cells are free for the next `add`."""
        if seq in self.active and not self._closed:
            seq.cancelled = seq.done = True
            self._retire(seq)

    def _retire(self, seq: Sequence) -> None:
        """Free a sequence's slot. With the prompt cache its cells stay, up to its last decoded
        position, for a later prompt that starts the same way."""
        self.active.remove(seq)
        if seq.grammar is not None:
            seq.grammar.close()
        if self.draft_length is not None:
            self.draft_length.forget(seq)
        if self.tree_rule is not None:
            self.tree_rule.forget(seq)
        keep = min(seq.pos, len(seq.history) - 1) if self.prompt_cache and seq.started else 0
        if self.proposer is not None and not self.plain_by_cost:  # the draft's cells must hold the same
            keep = self.proposer.release(seq, keep) if seq.speculate else 0  # positions as the target's
        self.slots.give_back(seq.seq_id, np.asarray(seq.history[:keep], dtype=np.int32) if keep > 0 else None)

    def reset(self) -> None:
        """Drop every sequence and empty every cache (the `auto` layout keeps what it learned)."""
        for seq in list(self.active):
            self.cancel(seq)
        self.slots.clear()
        self.target.clear()
        if self.proposer is not None:
            self.proposer.reset()

    # --- the loop --------------------------------------------------------------------------------

    def prefill(self) -> list[tuple[Sequence, Step]]:
        """Decode the prompts of the sequences that joined since the last step. `step()` does this
        first; a server calls it on its own to send the prefill's first tokens (see
        first_token_from_prefill) before the step's transaction; a sequence that finished at its
        prefill leaves, as finished ones leave a step."""
        out = [(seq, self._prefill(seq)) for seq in self.active if not seq.started]
        self._retire_finished()
        return out

    def step(self) -> list[tuple[Sequence, Step]]:
        """Prefill the sequences that joined, then one transaction for every active sequence.
        Returns each sequence's step (a newly joined sequence may have two: prefill and spec)."""
        out = self.prefill()
        # in sequence-id order: llama.cpp puts consecutive sequence ids into one ubatch
        live = sorted((seq for seq in self.active if not seq.done), key=lambda seq: seq.seq_id)
        if live:
            out += self._transaction(live)
        self._retire_finished()
        return out

    def _retire_finished(self) -> None:
        for seq in [s for s in self.active if s.done]:
            self._retire(seq)

    def run(self) -> Iterator[tuple[Sequence, Step]]:
        """Step until no sequence is active."""
        while self.active:
            yield from self.step()

    def _decode_target(self, batch: Batch, spans: list[Span] | None) -> float:
        """The only place the target decodes: the proposer flushes what it captured from the
        previous decode first (those rows are overwritten now), then hears about the new rows.
        Returns the seconds spent flushing."""
        t = self._flush()
        self.target.pause_layer_inputs(not spans)  # no speculating sequence: no draft reads these rows
        self.target.decode(batch)
        if self.proposer is not None and spans:
            self.proposer.observe(spans)  # only speculating sequences' spans are passed
        return t

    def _flush(self) -> float:
        """Hand what the proposer captured to the draft (seconds spent); in a step that does not
        draft, a proposer that can keep the rows in host memory until it drafts again does
        (`hold`: the adaptive length's k = 0 steps then cost no draft-context call)."""
        t0 = time.perf_counter()
        if self.proposer is not None:
            if self._holding:
                self.proposer.hold()
            else:
                self.proposer.flush()
        return time.perf_counter() - t0

    def _prefill(self, seq: Sequence) -> Step:
        """Decode a sequence's prompt in n_batch chunks. By default all but its last token, as
        llama.cpp's own loop does: the last prompt token is the first step's id_last, so the
        first generated token already comes with drafts (and every step sits where llama.cpp's
        would). With `first_token_from_prefill` the whole prompt, and the first token is chosen
        from the last row right away, by the verifier's rule for a step without drafts (greedy,
        or drawn with the draws that step would use): the time to the first token is a prefill
        instead of a prefill and a whole draft-and-verify step. Prompt rows are committed, so
        they reach the draft before its next call."""
        t0 = time.perf_counter()
        t_inject = 0.0
        first = self.first_token_from_prefill
        body, chunk = (seq.prompt if first else seq.prompt[:-1]), self.target.n_batch
        for off in range(seq.n_cached, len(body), chunk):  # the slot's cells hold the first n_cached
            part = body[off:off + chunk]
            outputs = "last" if first and off + chunk >= len(body) else "none"
            self._batch.clear().add_tokens(part, off, seq.seq_id, outputs=outputs)
            spans = [Span(seq.seq_id, 0, len(part), off, part)] if seq.speculate else None
            t_inject += self._decode_target(self._batch, spans)
        seq.id_last, seq.pos = int(seq.prompt[-1]), len(seq.prompt) - 1
        step = Step([], "prefill", n_prompt=len(seq.prompt), n_cached=seq.n_cached)
        if first:
            logits = self.target.logits_view()
            out = self.verifier.verify(logits, [(seq, Draft.empty(), 0)])[0]
            if seq.record_margins:
                step.margins.append(top2_margin(logits[0]))
            probs = token_probs(logits[0], out.tokens[0], seq.n_probs) if seq.n_probs else None
            seq.pos += 1
            step.tokens += seq.take(out.tokens, self._is_eog)
            if probs is not None:
                step.probs.append(probs)
        else:  # (with a first token to send, the rows wait for the transaction's own flush)
            t_inject += self._flush()
        step.t_total = time.perf_counter() - t0
        step.t_inject, step.t_verify = t_inject, step.t_total - t_inject
        seq.stats.add(step)
        if self._state_bytes is None and self.models.target.is_recurrent:
            # measured while the sequence holds a state: a freed sequence's is only a header
            self._state_bytes = self.target.recurrent_state_bytes(seq.seq_id)
        return step

    def _plan_drafts(self, live: list[Sequence]) -> tuple[int, list[Sequence]]:
        """The common draft length of this step and the sequences that draft. A sequence drafts
        while its budget leaves room for a draft; its block is as long as n_max and its context
        allow, whatever its budget (as in llama.cpp's loop: a DFlash block's length changes its
        drafts, so a sequence's drafts, and its sampled text, never depend on the others); the
        drafts past the budget are cut before verifying. Blocks must be equal: the length is the
        largest of those, and a sequence whose context cannot hold it verifies alone."""
        if self.proposer is None:
            return 0, []
        room = {seq: min(self.n_max, seq.limit - seq.pos - 1) for seq in live if seq.speculate and seq.left > 1}
        if not room:
            return 0, []
        n = max(room.values())
        if n <= 0:
            return 0, []
        return n, [seq for seq, r in room.items() if r >= n]

    def _transaction(self, live: list[Sequence]) -> list[tuple[Sequence, Step]]:
        t_start = time.perf_counter()
        calls0 = self._calls()
        n, drafting = self._plan_drafts(live)
        auto = self.draft_length
        if auto is not None and drafting:
            n, drafting = auto.before(live, drafting, n)
        self._holding = auto is not None and not drafting and self.proposer is not None and self.proposer.holds
        t_inject = self._flush()

        t = time.perf_counter()
        drafts = dict.fromkeys(live, Draft.empty())
        made: dict[Sequence, Draft] = {}  # the drafts as made (the adaptive rule scores them whole)
        trees, t_grow = self.tree_rule, 0.0
        if drafting:
            n = min(n, max(seq.limits.n_max for seq in drafting))  # no longer than any of them may verify
            if trees is not None:  # (a drafter that keeps candidates while drafting is told first)
                trees.choose(len(live), len(drafting))
                self.proposer.want_candidates(trees.wants(len(drafting)))
            proposed = self.proposer.propose(drafting, n)
            if trees is not None:  # (the candidates are read from the draft call just made)
                proposed = trees.grow(self.proposer, drafting, n, proposed, self._grows_tree)
                t_grow = trees.last_grow
            for seq, d in zip(drafting, proposed):
                made[seq] = seq.limits.cut(grammar_cut(seq, d.head(seq.left - 1)))  # past the budget: never verified
            verified = auto.after(live, made) if auto is not None else None
            for seq, d in made.items():
                drafts[seq] = d if verified is None else d.head(verified[seq])
        t_draft = time.perf_counter() - t

        # verify: every sequence's span [id_last, d1..dn] (or its tree) in one target decode
        t = time.perf_counter()
        width = self._span_width(live, drafts)
        if width:  # a sequence whose cells cannot hold an equal span has filled its context: it ends
            for seq in [seq for seq in live if seq.limit - seq.pos < width]:
                seq.done = True
                live.remove(seq)
            if not live:
                self._holding = False
                return []
        batch = self._batch.clear()
        spans, blocks, row = [], [], 0
        placed: dict[Sequence, Placed] = {}
        for seq in live:
            tree = drafts[seq].tree
            if tree is not None and len(tree) > tree.n_chain:  # (a tree that is only its chain verifies as one)
                placed[seq] = self.tree_verify.add(batch, seq, tree, row)
                blocks.append(None)
                spans.append(Span(seq.seq_id, row, 1 + len(tree), seq.pos,
                                  np.concatenate([[seq.id_last], tree.tokens]).astype(np.int32)))
                row += 1 + len(tree)
                continue
            block = verify_span(seq.id_last, drafts[seq].tokens, width)
            blocks.append(block)
            batch.add_tokens(block, seq.pos, seq.seq_id, outputs="all")
            spans.append(Span(seq.seq_id, row, len(block), seq.pos, block))
            row += len(block)
        t_flushed = self._decode_target(batch, [sp for seq, sp in zip(live, spans) if seq.speculate])
        t_inject += t_flushed
        logits = self.target.logits_view()
        outcomes, paths = self._accept(logits, live, drafts, spans, placed)
        probs = {seq: [token_probs(logits[sp.row0 + j], t, seq.n_probs) for j, t in enumerate(out.tokens)]
                 for seq, sp, out in zip(live, spans, outcomes) if seq.n_probs}  # (before a replay reuses the rows)

        # commit or roll back, per sequence; replays of all sequences that need one in one decode
        replays = []
        for seq, out, block in zip(live, outcomes, blocks):
            keep = seq.pos + out.accepted + 1
            if seq in placed:  # the tree's accepted path becomes the sequence's cells, its branches go
                if seq.speculate:
                    self.proposer.commit(seq, seq.pos, out.accepted + 1, rows=paths[seq])
                self.tree_verify.commit(seq, placed[seq], paths[seq])
                continue
            if seq.speculate:
                self.proposer.commit(seq, seq.pos, out.accepted + 1)
            if keep < seq.pos + len(block):  # rejected drafts (or padding) to roll back
                if self.target.can_truncate(keep, seq.seq_id):
                    self.target.truncate(keep, seq.seq_id)
                else:
                    replays.append((seq, block[:out.accepted + 1]))
        # the verify decode, acceptance and rolling back; an injection flushed before the decode
        # counts as injection, not twice
        t_verify = time.perf_counter() - t - t_flushed
        t_replay = 0.0
        if replays:
            t = time.perf_counter()
            t_inject += self._replay(replays)
            t_replay = time.perf_counter() - t

        t_total = time.perf_counter() - t_start
        self.stats.count(t_total, self._calls() - calls0)
        if auto is not None:
            auto.measured(len(live), len(drafting), n, t_draft, row, t_verify, t_total - t_draft - t_verify,
                          sum(out.accepted + 1 for out in outcomes))
        if trees is not None and drafting:
            trees.measured(len(live), row, t_verify, t_total - t_verify - t_grow, len(placed))
        self._holding = False
        replayed = {seq for seq, _ in replays}
        result = []
        for seq, out, sp in zip(live, outcomes, spans):
            d = len(drafts[seq])
            step = Step([], "spec" if d else "plain", drafted=d, accepted=out.accepted, t_draft=t_draft,
                        t_verify=t_verify, t_inject=t_inject, t_replay=t_replay, replayed=seq in replayed,
                        t_total=t_total, nodes=len(placed[seq].tree) if seq in placed else d)
            if seq.record_margins and not d:
                step.margins.append(top2_margin(logits[sp.row0]))
            if self.auto_lead is not None and d:
                self.auto_lead.observe(out.accepted, d)
            if seq.plain_by_cost:
                step.k = 0
            if auto is not None and seq.speculate:
                step.k = d
                m = made.get(seq)
                # a tree's chain: how far a chain verify would have accepted it (the committed tokens
                # are the target's own, so the chain is right as long as it agrees with them)
                right = accept_greedy(drafts[seq].tokens[:out.accepted].tolist(), out.tokens) if seq in placed \
                    else out.accepted
                auto.committed(seq, seq.pos, None if m is None else m.tokens, d, right)
                if auto.gave_up(seq):
                    self._stop_speculating(seq)
            seq.pos += out.accepted + 1
            step.tokens += seq.take(out.tokens, self._is_eog)
            if trees is not None:
                trees.committed(seq)
            if seq in probs:
                step.probs += probs[seq][:len(step.tokens)]
            self.stats.tokens += len(step.tokens)
            seq.stats.add(step)
            result.append((seq, step))
        return result

    def _accept(self, logits: np.ndarray, live: list[Sequence], drafts: dict, spans: list[Span],
                placed: dict[Sequence, Placed]) -> tuple[list, dict[Sequence, list[int]]]:
        """Each sequence's outcome: chains by the verifier, trees by their greedy walk (and the
        offsets of the rows that hold a tree's committed positions)."""
        chains = [(seq, drafts[seq], sp.row0) for seq, sp in zip(live, spans) if seq not in placed]
        by_chain = iter(self.verifier.verify(logits, chains) if chains else ())
        outcomes, paths = [], {}
        for seq in live:
            if seq in placed:
                tree = placed[seq]
                rows = logits[tree.row0:tree.row0 + 1 + len(tree.tree)]
                if seq.sampling.greedy:
                    out, paths[seq] = TreeVerify.accept(rows.argmax(axis=1).tolist(), tree)
                else:
                    out, paths[seq] = TreeVerify.sample(rows, tree, seq)
                outcomes.append(out)
            else:
                outcomes.append(next(by_chain))
        return outcomes, paths

    @staticmethod
    def _grows_tree(seq: Sequence) -> bool:
        """Whether a sequence's drafts may be verified as a tree: nothing that judges rows by their
        history (a grammar, penalties, bias: their rows would each need the path's history) and no
        per-token probabilities asked for (they are read from a chain's consecutive rows)."""
        return not row_by_row(seq) and not seq.n_probs

    def _stop_speculating(self, seq: Sequence) -> None:
        """The adaptive rule gave up on this sequence's drafts: it decodes plainly from now on (its
        steps then cost what plain ones do), its draft cells freed, what it learned kept for the next."""
        self.draft_length.forget(seq)
        self.proposer.release(seq)
        seq.speculate, seq.plain_by_cost = False, True

    def _span_width(self, live: list[Sequence], drafts: dict) -> int | None:
        """Hybrid targets with several sequences verify equal spans: llama.cpp splits a batch into
        ubatches holding the same number of tokens of every sequence, and a span split across two
        ubatches loses its input state (no replay could rebuild it). Shorter spans are padded
        (the padding is rolled back like rejected drafts). None: spans keep their own length."""
        if not (self.models.target.is_recurrent and len(live) > 1):
            return None
        return max(len(d) for d in drafts.values()) + 1

    def _replay(self, replays: list[tuple[Sequence, np.ndarray]]) -> float:
        """Rebuild recurrent states no plane kept: restore each sequence's input plane (its state
        before this verify span) and decode its committed tokens [id_last, d1..da] again, all in
        one call. No outputs: the committed tokens are known, and the draft got these rows'
        features from the verify batch (flushed before this decode)."""
        self._batch.clear()
        for seq, committed in replays:
            self.target.truncate(seq.pos, seq.seq_id)
            self._batch.add_tokens(committed, seq.pos, seq.seq_id, outputs="none")
        return self._decode_target(self._batch, None)

    def _calls(self) -> int:
        return self.target.n_decodes + (self.draft_ctx.n_decodes if self.draft_ctx is not None else 0)

    @property
    def store(self):
        """The prompt cache's host-memory store (None without one)."""
        return self.slots.store

    # --- reporting -------------------------------------------------------------------------------

    @property
    def plane_layout(self) -> str:
        """The recurrent-state layout in words, for stats lines."""
        hybrid = self.proposer is not None and self.models.target.is_recurrent
        return layout_words(self.target, self.cfg.planes, self.n_max, self.auto_lead) if hybrid else "none"

    def recurrent_bytes(self) -> int:
        """Recurrent state memory per sequence: planes x bytes per plane (0 for dense targets)."""
        if not self.models.target.is_recurrent:
            return 0
        per_plane = self._state_bytes if self._state_bytes is not None else self.target.recurrent_state_bytes()
        return (1 + self.target.n_rs_seq) * per_plane

    # --- lifetime --------------------------------------------------------------------------------

    def close(self) -> None:
        self._closed = True
        for obj in (getattr(self, "_batch", None), self.proposer, self.draft_ctx, getattr(self, "target", None)):
            if obj is not None:
                obj.close()
        if self._owns_models:
            self.models.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def grammar_cut(seq: Sequence, draft: Draft) -> Draft:
    """A draft up to the first token the sequence's grammar forbids: the target could never
    commit it, so verifying it and what follows is wasted. Drafts drawn from a distribution keep
    their tokens (cutting on what was drawn would change the rejection sampler's distribution);
    the verifier rejects a forbidden one there."""
    if seq.grammar is None or not len(draft) or (draft.probs is not None and not seq.sampling.greedy):
        return draft
    return draft.head(seq.grammar.cut(draft.tokens.tolist()))
