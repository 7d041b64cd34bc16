"""The engine: many sequences, one speculative transaction per step for all of them.

Each `step()` first prefills the sequences that joined since the last step, then runs one
transaction for every active sequence together (transaction.py: plan, propose, lay out, verify,
commit, record, over one record of the step): one draft call holds every drafting sequence's
block, one target decode every sequence's span [id_last, d1..dn] (or a token tree's nodes:
rules/tree_budget.py chooses, tree_verify.py verifies), the verifier decides each sequence's
accepted drafts and the target's own token, and the rejected tails leave the target cache
(seq_rm, a recurrent plane switch) or, where no plane kept the state, are replayed: all such
sequences in one decode. So the llama.cpp calls per step do not grow with the number of
sequences: one injection (more only past the draft's n_ubatch), one draft, one verify, at most
one replay. Sequences join (`add`, a checked `Request`) and leave (finished, or `cancel`) between
steps; a leaving sequence frees its seq_id and its cache cells at once. Without a proposer the
same loop is plain decoding (n = 0 for all).

The one rule that ties proposer and target together, "inject the captured feature rows before
the target decodes again", lives in `decode_target`, the only place the target decodes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

import numpy as np

from ggspec.errors import ClosedError, InputError
from ggspec.runtime import Batch
from ggspec.runtime.grammar import Grammar
from ggspec.speculative.assembly import assemble, standby_plans
from ggspec.speculative.models import Models, PairConfig
from ggspec.speculative.planes import layout_words
from ggspec.speculative.proposer import Draft, Proposer, Span
from ggspec.speculative.request import DraftLimits, Request
from ggspec.speculative.rules.calibration import Calibration
from ggspec.speculative.sampling import DEFAULT_SEED, concrete_seed
from ggspec.speculative.sequence import Sequence
from ggspec.speculative.slots import CapacityError, Slots
from ggspec.speculative.stats import EngineStats, Step, token_probs, top2_margin
from ggspec.speculative.transaction import Transaction
from ggspec.speculative.tree_verify import TreeVerify
from ggspec.speculative.types.draft_type import DraftPlan
from ggspec.speculative.verifier import SequenceVerifier, Verifier


@dataclass(frozen=True)
class Serving:
    """What a server asks of an engine beyond `ggspec run` and the benchmarks (their defaults)."""

    # a slot keeps the cells of its last sequence, and a new prompt goes to the free slot whose
    # cells hold the longest prefix of it: only the rest is decoded (llama-server's cache_prompt;
    # a hybrid or window-sized target's cells are cut back through checkpoints)
    prompt_cache: bool = False
    # with the prompt cache, checkpoints kept per slot of a hybrid or window-sized target
    # (llama-server's --ctx-checkpoints): the state that cannot be cut back (a recurrent state, a
    # sliding window) a few tokens before the end of each prompt and at it
    ctx_checkpoints: int = 32
    # while other sequences generate, prompt rows a step may decode (the rest waits for the next
    # steps, so no stream stalls for a whole long prompt); None: every joining prompt whole
    prefill_rows: int | None = None
    # with the prompt cache, bytes of host memory for copies of cells a new prompt overwrites, which
    # a later prompt starting the same way gets back (llama-server's --cache-ram; 0: none, None: no
    # limit; prompt_store.py)
    cache_ram: int | None = 0
    # the prefill decodes the whole prompt and chooses the first token from its last row, as
    # llama-server does: a step earlier than llama.cpp's own loop, whose draft positions `ggspec
    # run` and the benchmarks mirror (Engine._prefill)
    first_token_from_prefill: bool = False
    # what a drafter learns from one request serves the next (ngram-mod's table lives as long as
    # the engine, as llama-server's; else each run starts afresh)
    keep_draft_state: bool = False
    # a speculative engine also holds the n-gram types it was not given, for the sequences that
    # name them (DraftLimits.types; a server's `speculative.type`); one that decodes plainly by
    # cost keeps them all (its own type goes), each drafting its own length for those sequences
    standby_types: bool = False


class Engine:
    """Contexts, caches and the loop over a `Models`. `Engine.open(cfg)` loads the models too
    and closes them with the engine."""

    def __init__(self, models: Models, cfg: PairConfig, *, verifier: Verifier | None = None, plain: bool = False,
                 serving: Serving = Serving(), wrap_proposer: Callable[[Proposer], Proposer] | None = None) -> None:
        """`plain`: no drafting at all (a baseline over the same weights, with no draft context
        and no rollback planes). `serving`: what a server asks beyond `ggspec run` (Serving).
        `wrap_proposer`: makes the proposer it drafts with from its own (forced acceptance)."""
        cfg.validate()
        self.models = models
        self.target_model, self.draft_model = models.target, models.draft  # the weights (Models owns them)
        self.cfg = cfg
        self.serving = serving
        self.parallel = cfg.parallel
        self.warnings: list[str] = list(models.warnings)
        self.plan = DraftPlan(None) if plain else models.plan
        self.speculative = self.plan.spec_type is not None
        self.sampling = cfg.sampling  # what a sequence added without its own settings gets
        self.verifier: Verifier = verifier or SequenceVerifier()
        self._owns_models = False
        self._closed = False
        self._state_bytes: int | None = None  # one recurrent state's bytes, measured at the first prefill
        parts = assemble(models, cfg, self.plan, keep_state=serving.keep_draft_state, warnings=self.warnings,
                         wrap=wrap_proposer, standby=serving.standby_types)
        self.n_max, self.target, self.draft_ctx = parts.n_max, parts.target, parts.draft_ctx
        self.proposer: Proposer | None = parts.proposer
        self.auto_lead, self.draft_length = parts.auto_lead, parts.draft_length
        self.tree_rule, self.tree_verify = None, None  # (set after the calibration: it verifies chains)
        self.batch: Batch | None = None
        self.holding = False  # this step drafts nothing and the proposer keeps rows for later (_flush)
        # (a draft whose own cells are recurrent cannot be cut back as the target's are)
        self.prompt_cache = serving.prompt_cache and not any(
            ctx.model.is_recurrent for ctx in parts.cell_contexts if ctx is not parts.target)
        self.first_token_from_prefill = serving.first_token_from_prefill
        self._cache_ram = serving.cache_ram
        self._prefill_rows_left: int | None = None  # this step's prompt rows left (Serving.prefill_rows)
        self._hold_cells(parts)
        self.active: list[Sequence] = []
        self.stats = EngineStats()
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
            self.batch = Batch(self.target)
            self.slots = Slots(self.target, parts.cell_contexts, self.parallel, self.prompt_cache, self._cache_ram,
                               self.block_cells + parts.tree_cells, self.serving.ctx_checkpoints)
            self.slots.lag = parts.proposer.cache_lag if parts.proposer is not None else 0
        except BaseException:
            self.close()
            raise

    def _reopen_plain(self) -> None:
        """An engine that will never verify a draft of its own (plain_by_cost) runs on a plain
        engine's contexts: the draft context goes (its memory with it), and the target's is made
        again as `--no-spec` makes it (no recurrent planes, no tree cells), so it decodes what
        that prints. A server's (standby_types) keeps the text drafters instead, for the requests
        that name them: each drafts its own length, as llama-server's do (its sequences decode
        plainly unless they name one)."""
        for obj in (self.batch, self.proposer, self.draft_ctx, self.target):
            if obj is not None:
                obj.close()
        self.batch = self.proposer = self.draft_ctx = None
        self.auto_lead = None
        self.target = None
        try:
            parts = self._standby_parts() if self.serving.standby_types and self.speculative else None
            if parts is None:  # (the draft types' options are the speculative engine's: checked, unused here)
                parts = assemble(self.models, replace(self.cfg, spec_options={}), DraftPlan(None), keep_state=False,
                                 warnings=[])
        except BaseException:
            self.close()
            raise
        self.target, self.proposer, self.auto_lead = parts.target, parts.proposer, parts.auto_lead
        if parts.proposer is not None:  # (the rule's costs were its own type's: the named drafters draft
            # their own length, within the engine's, so a request's room in its slot is what it was)
            self.draft_length, self.n_max = None, min(parts.n_max, self.n_max)
        self._hold_cells(parts)

    def _standby_parts(self):
        """The contexts and proposer of every text drafter (a plain-by-cost server's), each at its
        own length; None where the context cannot hold their longest verify block (the batch or
        the planes are too small for it): the engine then decodes plainly, as before."""
        plan = DraftPlan(None, parts=tuple(standby_plans(DraftPlan(None))))
        try:
            return assemble(self.models, replace(self.cfg, adaptive=False, n_max=None), plan,
                            keep_state=self.serving.keep_draft_state, warnings=[])
        except InputError:
            return None

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

    def add(self, request: Request) -> Sequence:
        """A new sequence for `request` (checked: Engine.check); its prompt is decoded at the
        next step. A sequence that must not depend on timings (sampled with a seed given) never
        decodes plainly by cost; one whose adaptive rule starts plain does (Sequence.plain_by_cost)."""
        if self._closed:
            raise ClosedError("this Engine is closed (close() was called): it cannot be used any more")
        request = self.check(request)
        if not self.can_add(request.prompt, request.n_predict):
            raise CapacityError(f"no room for another sequence now: all {self.parallel} slots are busy", field="parallel")
        sampling = request.sampling
        seed = sampling.seed if request.seed is None else request.seed
        fixed = not sampling.greedy and seed != DEFAULT_SEED  # a seeded sampled text must not depend on timings
        speculate = request.speculate and request.limits.n_max > 0
        rule = self.draft_length
        # (a plain-by-cost engine's standby text drafters draft for the sequences that name them)
        named = self.plain_by_cost and request.limits.types is not None
        by_cost = speculate and not named and (self.plain_by_cost or (
            self.proposer is not None and rule is not None and not fixed and rule.starts_plain()))
        grammar = None if request.grammar is None else Grammar(self.target_model, request.grammar)
        slot, cached = self.slots.take(request.prompt, reuse=request.cached)
        seq = Sequence(slot, request, speculate=speculate and self.proposer is not None and not by_cost,
                       plain_by_cost=by_cost, limits=request.limits, grammar=grammar, sampling=sampling,
                       seed=concrete_seed(seed), seeded=fixed, n_cached=cached,
                       limit=self.slots.limit(len(request.prompt), request.n_predict))  # (limit: positions it may use)
        self.active.append(seq)
        if seq.speculate:
            self.proposer.begin(seq, cached)
            if rule is not None:
                rule.begin(seq, fixed=fixed)
        elif self.proposer is not None:
            self.proposer.release(seq)  # its draft cells would go stale
        return seq

    def check(self, request: Request) -> Request:
        """The request checked on its own and against this engine (its prompt, its draft limits),
        with the engine's defaults filled in (sampling, limits): what `add` runs. A server calls
        it on admission, so a bad request is refused before it waits in the queue."""
        request.check()
        self.check_prompt(request.prompt)
        sampling = self.sampling if request.sampling is None else request.sampling  # (both checked)
        return replace(request, sampling=sampling, limits=self.check_limits(request.limits))

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
        """A sequence's own draft limits, checked against the engine's (None: the engine's)."""
        if limits is None:
            return DraftLimits(self.n_max)
        limits.check()
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
        if self.proposer is not None and (seq.speculate or not self.plain_by_cost):  # the draft's cells
            keep = self.proposer.release(seq, keep) if seq.speculate else 0  # must hold the target's positions
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
        """Decode the prompts of the sequences that joined since the last step, in the order they
        joined. `step()` does this first; a server calls it on its own to send the prefill's first
        tokens (see first_token_from_prefill) before the step's transaction; a sequence that
        finished at its prefill leaves, as finished ones leave a step. While other sequences are
        generating, a step decodes at most `Serving.prefill_rows` prompt rows (a longer prompt
        goes on at the next steps): only the sequences whose prompt is done have a Step."""
        if self._prefill_rows_left is None and self.serving.prefill_rows is not None \
                and any(seq.started and not seq.done for seq in self.active):
            self._prefill_rows_left = self.serving.prefill_rows
        out = []
        for seq in [s for s in self.active if not s.started]:
            step = self._prefill(seq)
            if step is not None:
                out.append((seq, step))
        self._retire_finished()
        return out

    def step(self) -> list[tuple[Sequence, Step]]:
        """Prefill the sequences that joined, then one transaction for every active sequence whose
        prompt is done. Returns each sequence's step (a newly joined sequence may have two:
        prefill and spec)."""
        out = self.prefill()
        # in sequence-id order: llama.cpp puts consecutive sequence ids into one ubatch
        live = sorted((seq for seq in self.active if seq.started and not seq.done), key=lambda seq: seq.seq_id)
        if live:
            out += Transaction(self, live).run()
        self._retire_finished()
        self._prefill_rows_left = None  # (the next step's prompt rows)
        return out

    def _retire_finished(self) -> None:
        for seq in [s for s in self.active if s.done]:
            self._retire(seq)

    def run(self) -> Iterator[tuple[Sequence, Step]]:
        """Step until no sequence is active."""
        while self.active:
            yield from self.step()

    def decode_target(self, batch: Batch, spans: list[Span] | None) -> float:
        """The only place the target decodes: the proposer flushes what it captured from the
        previous decode first (those rows are overwritten now), then hears about the new rows.
        Returns the seconds spent flushing."""
        t = self.flush()
        self.target.pause_layer_inputs(not spans)  # no speculating sequence: no draft reads these rows
        self.target.decode(batch)
        if self.proposer is not None and spans:
            self.proposer.observe(spans)  # only speculating sequences' spans are passed
        return t

    def flush(self) -> float:
        """Hand what the proposer captured to the draft (seconds spent); in a step that does not
        draft, a proposer that can keep the rows in host memory until it drafts again does
        (`hold`: the adaptive length's k = 0 steps then cost no draft-context call)."""
        t0 = time.perf_counter()
        if self.proposer is not None:
            if self.holding:
                self.proposer.hold()
            else:
                self.proposer.flush()
        return time.perf_counter() - t0

    def _prefill(self, seq: Sequence) -> Step | None:
        """Decode a sequence's prompt in chunks of at most n_batch rows (and this step's prompt
        rows left, Serving.prefill_rows); None while part of it is left for later steps. By
        default all but its last token, as llama.cpp's own loop does: the last prompt token is
        the first step's id_last, so the first generated token already comes with drafts (and
        every step sits where llama.cpp's would). With `first_token_from_prefill` the whole
        prompt, and the first token is chosen from the last row right away, by the verifier's
        rule for a step without drafts (greedy, or drawn with the draws that step would use): the
        time to the first token is a prefill instead of a prefill and a whole draft-and-verify
        step. Prompt rows are committed, so they reach the draft before its next call. A hybrid or
        window-sized target's state is checkpointed where `_marks` says (the prompt cache)."""
        t0 = time.perf_counter()
        first = self.first_token_from_prefill
        body = seq.prompt if first else seq.prompt[:-1]
        marks = self._marks(len(body))
        while seq.prefilled < len(body):
            off = seq.prefilled
            end = min(len(body), off + self.target.n_batch, *(m for m in marks if m > off))
            if self._prefill_rows_left is not None:
                if self._prefill_rows_left <= 0:
                    break
                end = min(end, off + self._prefill_rows_left)
                self._prefill_rows_left -= end - off
            part = body[off:end]
            outputs = "last" if first and end == len(body) else "none"
            self.batch.clear().add_tokens(part, off, seq.seq_id, outputs=outputs)
            spans = [Span(seq.seq_id, 0, len(part), off, part)] if seq.speculate else None
            seq.t_prefill_inject += self.decode_target(self.batch, spans)
            seq.prefilled = end
            if end in marks:
                self.slots.checkpoint(seq.seq_id, end)
        if seq.prefilled < len(body):
            seq.t_prefill += time.perf_counter() - t0
            return None
        t_inject = seq.t_prefill_inject
        t0 -= seq.t_prefill  # (the earlier steps' chunks count in its prefill's time)
        seq.id_last, seq.pos = int(seq.prompt[-1]), len(seq.prompt) - 1
        step = Step([], "prefill", n_prompt=len(seq.prompt), n_cached=seq.n_cached)
        if first:
            logits = self.target.logits_view()
            out = self.verifier.verify(logits, [(seq, Draft.empty(), 0)])[0]
            if out.failure is not None:  # (its grammar allows no first token: it ends here, alone)
                seq.fail(out.failure)
                return self._prefilled(seq, step, t0, t_inject)
            if seq.record_margins:
                step.margins.append(top2_margin(logits[0]))
            probs = token_probs(logits[0], out.tokens[0], seq.n_probs) if seq.n_probs else None
            seq.pos += 1
            step.tokens += seq.take(out.tokens, self.target_model)
            if probs is not None:
                step.probs.append(probs)
        else:  # (with a first token to send, the rows wait for the transaction's own flush)
            t_inject += self.flush()
        return self._prefilled(seq, step, t0, t_inject)

    def _marks(self, n_body: int) -> tuple[int, ...]:
        """Where a prompt's prefill checkpoints a hybrid or window-sized target's state (with the
        prompt cache): 4 + n_ubatch and 4 tokens before the end of the prompt, as llama-server does (a
        next turn's prompt renders the last message's end and the generation prompt anew), and at
        its end. A chunk of the prefill ends at each."""
        if self.slots.max_checkpoints <= 0:
            return ()
        return tuple(sorted({m for m in (n_body - 4 - self.target.n_ubatch, n_body - 4, n_body) if m > 0}))

    def _prefilled(self, seq: Sequence, step: Step, t0: float, t_inject: float) -> Step:
        """A prefill's step with its times, counted in the sequence's statistics."""
        step.t_total = time.perf_counter() - t0
        step.t_inject, step.t_verify = t_inject, step.t_total - t_inject
        seq.stats.add(step)
        if self._state_bytes is None and self.models.target.is_recurrent:
            # measured while the sequence holds a state: a freed sequence's is only a header
            self._state_bytes = self.target.recurrent_state_bytes(seq.seq_id)
        return step


    def stop_speculating(self, seq: Sequence) -> None:
        """The adaptive rule gave up on this sequence's drafts: it decodes plainly from now on (its
        steps then cost what plain ones do), its draft cells freed, what it learned kept for the next."""
        self.draft_length.forget(seq)
        self.proposer.release(seq)
        seq.speculate, seq.plain_by_cost = False, True

    def calls(self) -> int:
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
        for obj in (getattr(self, "batch", None), self.proposer, self.draft_ctx, getattr(self, "target", None)):
            if obj is not None:
                obj.close()
        if self._owns_models:
            self.models.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
