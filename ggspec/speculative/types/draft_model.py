"""draft-simple: a classic draft model — a smaller LLM with the target's vocabulary.

A port of llama.cpp's `common_speculative_impl_draft_simple` (the pinned
common/speculative.cpp:179-419). The draft has its own context and cache; per step it decodes
id_last at its position for every drafting sequence in one call, then one call per drafted
position for the sequences still drafting (SP:305-405). Each draft token is the argmax of the
draft's logits; a draft stops where that token's probability among the draft's 10 largest logits
(llama.cpp's top-10 sampler, no temperature) falls below p_min, or at n_max; a draft shorter than
n_min is dropped.

The draft's cache holds what the target's holds. llama.cpp mirrors every target batch into the
draft context (process(), SP:251-291) and removes the draft's own cells before verifying; ggspec
keeps the cells the draft wrote while drafting for the drafts the target accepts (they hold those
very tokens at those positions) and decodes only what the draft has not seen — the prompt, a
fully accepted draft's last token, tokens of steps it did not draft — together with id_last in
that first call. The cells are the same; what differs is which batch computed them (llama.cpp's
CPU kernels give the same rows either way: the drafts equal its dumps, tests/test_draft_model.py).
So a step costs n draft calls (llama.cpp's: n + 1, its mirror) and no mirror decode at all.

Where the draft's head runs on a GPU, a greedy sequence's draft token is picked in the draft's own
graph, as llama.cpp's loop does by default (its backend sampling): the argmax, or the 10 largest
logits where p_min needs their confidence. Only those come back, not a 151,936-float row per
drafted token (Qwen2.5). On the CPU the row is in host memory already and numpy's argmax is faster
than ggml's (which copies the logits once more to pad them): the draft's device picks measured
1.01-1.10x the time of a one-token decode with a host argmax (Qwen2.5-Coder 0.5B, Gemma 3 270M).

At temperature > 0 a sequence's drafts are drawn from the draft's distribution under its own
sampler, which travels with the draft for rejection sampling (llama.cpp drafts the argmax and
verifies it as a point mass; its top-10 confidence still gates p_min in both cases).
"""

from __future__ import annotations

from ggspec.errors import InputError
from ggspec.runtime import Batch, Context
from ggspec.runtime.preflight import check_model
from ggspec.speculative.proposer import Draft, Proposer, model_draft
from ggspec.speculative.types.archs import is_dflash
from ggspec.speculative.types.autoregressive import PickedRows, RowCandidates, draft_tokens
from ggspec.speculative.types.confidence import CONFIDENCE_TOP_K, pick_mode
from ggspec.speculative.types.draft_type import Build, DraftPlan, DraftType, Traits, check_draft_given
from ggspec.speculative.types.draft_vocab import DraftVocabOptions, set_draft_head
from ggspec.speculative.types.eagle3 import is_eagle3

# llama.cpp's vocabulary rules (SP:67-132): at most this many more or fewer tokens, and equal
# token text from this id on (the first ids are control tokens that may differ)
VOCAB_MAX_SIZE_DIFFERENCE = 128
VOCAB_CHECK_START_TOKEN_ID = 5


def check_vocab_compatible(target, draft) -> None:
    """Refuse a draft whose vocabulary is not the target's, by llama.cpp's rules (one line)."""
    lc, vt, vd = target.lc, target.vocab, draft.vocab
    where = f"the draft {draft.path}"
    if lc.llama_vocab_type(vt) != lc.llama_vocab_type(vd):
        raise InputError(f"{where} has another kind of vocabulary than the target (vocab type "
                         f"{lc.llama_vocab_type(vd)}, the target's {lc.llama_vocab_type(vt)})", field="draft")
    for what, add, tok in (("BOS", lc.llama_vocab_get_add_bos, lc.llama_vocab_bos),
                           ("EOS", lc.llama_vocab_get_add_eos, lc.llama_vocab_eos)):
        if add(vt) != add(vd) or (add(vt) and tok(vt) != tok(vd)):
            raise InputError(f"{where} adds its {what} token differently from the target (adds: {bool(add(vd))}, "
                             f"id {tok(vd)}; the target's: {bool(add(vt))}, id {tok(vt)})", field="draft")
    if abs(target.n_vocab - draft.n_vocab) > VOCAB_MAX_SIZE_DIFFERENCE:
        raise InputError(f"{where} has {draft.n_vocab} tokens, the target {target.n_vocab}: a draft's vocabulary "
                         f"may differ by at most {VOCAB_MAX_SIZE_DIFFERENCE}", field="draft")
    for i in range(VOCAB_CHECK_START_TOKEN_ID, min(target.n_vocab, draft.n_vocab)):
        if lc.llama_vocab_get_text(vt, i) != lc.llama_vocab_get_text(vd, i):
            raise InputError(f"{where}: token {i} is {lc.llama_vocab_get_text(vd, i)!r}, the target's "
                             f"{lc.llama_vocab_get_text(vt, i)!r} (the vocabularies must be the same)", field="draft")


class DraftModelProposer(RowCandidates, Proposer):
    """Drafts with a classic draft model (see the module docstring)."""

    name = "draft-simple"
    max_draft: int | None = None

    def __init__(self, draft: Context, n_vocab: int, p_min: float = 0.0, n_min: int = 0) -> None:
        """`n_vocab`: the target's vocabulary; a larger draft's extra tokens are never drafted (a
        reduced head, draft.logit_ids, holds none of them)."""
        self.draft = draft
        self.n_vocab = min(n_vocab, draft.n_vocab) if draft.logit_ids is None else draft.n_logits
        self.p_min = p_min
        self.n_min = n_min
        # the device may pick from whole rows only (a larger draft's extra tokens are never drafted)
        self.pick_on_device = self.n_vocab == draft.n_logits and draft.model.head_on_device
        self._batch = Batch(draft)
        self._rows: list[int] = []  # the sequence of each output row of the next draft call
        self._held: dict[int, int] = {}  # seq_id -> the draft's cells hold its committed positions 0..held-1
        # seq_id -> (position, tokens) the cells of this step's draft hold from id_last on
        self._wrote: dict[int, tuple[int, list[int]]] = {}

    # --- following the target ---------------------------------------------------------------------

    def begin(self, seq, cached: int = 0) -> None:
        """The slot's first `cached` cells hold this prompt's first tokens (the engine keeps the
        draft's cells with the target's); the rest goes."""
        self.draft.remove(cached, seq.seq_id)
        if self.pick_on_device:
            mode = pick_mode(seq, seq.p_min(self.p_min))
            self.draft.pick_on_device(seq.seq_id, CONFIDENCE_TOP_K if mode == 0 and self.trees else mode)
        self._held[seq.seq_id] = cached
        self._wrote.pop(seq.seq_id, None)

    def observe(self, spans) -> None:
        """Nothing to capture: the draft reads tokens only, from the sequence's history."""

    def commit(self, seq, pos0: int, n_committed: int, other: bool = False, rows: list[int] | None = None) -> None:
        """The target keeps positions < pos0 + n_committed: so do the draft's cells (those of
        tokens other than the committed ones, which a wrapper may have proposed instead of the
        draft's, or a token tree's path off the chain, go when the committed tokens are known:
        _sync)."""
        wrote = self._wrote.get(seq.seq_id)
        if wrote is not None:
            p0, tokens = wrote
            kept = tokens[:max(0, pos0 + n_committed - p0)]
            self._wrote[seq.seq_id] = (p0, kept)
            self.draft.remove(p0 + len(kept), seq.seq_id)

    def flush(self) -> None:
        """Nothing to move: the draft catches up from tokens, in its first call of the next draft."""

    def _sync(self, seq) -> None:
        """Keep the cells this sequence's last draft wrote as far as they hold its committed tokens."""
        wrote = self._wrote.pop(seq.seq_id, None)
        if wrote is None:
            return
        p0, tokens = wrote
        history = seq.history[p0:p0 + len(tokens)]
        k = next((i for i, (a, b) in enumerate(zip(tokens, history)) if a != b), min(len(tokens), len(history)))
        if k < len(tokens):
            self.draft.remove(p0 + k, seq.seq_id)
        self._held[seq.seq_id] = p0 + k

    # --- drafting ---------------------------------------------------------------------------------

    def propose(self, seqs, n: int) -> list[Draft]:
        if not seqs:
            return []
        self._catch_up(seqs)  # its decode's logits are the first draft position's
        self._rows = [seq.seq_id for seq in seqs]

        def step(i: int):
            if i > 0:
                self.draft.decode(self._batch)
            # (the CPU's default: every row full, read as one array, as before the picks)
            rows = PickedRows(self.draft, self._rows, self.n_vocab) if self.pick_on_device \
                else self.draft.logits_view()[:, :self.n_vocab]
            self._batch.clear()
            self._rows = []
            return rows, None

        def feed(row: int, seq, token: int, i: int, _) -> None:
            self._batch.add_tokens([token], seq.pos + i + 1, seq.seq_id, outputs="all")
            self._rows.append(seq.seq_id)

        kept = self._keeping(seqs)
        made = draft_tokens(seqs, n, self.p_min, step, feed, ids=self.draft.logit_ids, kept=kept)
        self._kept(seqs, kept)
        self._batch.clear()
        for seq, (tokens, _) in zip(seqs, made):
            # cells from id_last on: it and every drafted token but one that reached n (never decoded)
            self._wrote[seq.seq_id] = (seq.pos, [seq.id_last, *tokens[:n - 1]])
        return [model_draft(t, d, self.n_min) for t, d in made]

    def _catch_up(self, seqs) -> None:
        """Decode what each sequence's cells lack, up to and with id_last, whose logits are the
        output rows of the last call (in sequence order). A long lag (a prompt) goes first in
        full batches, so the last call holds every sequence's id_last."""
        batch, n_batch = self._batch, self.draft.n_batch
        for seq in seqs:
            self._sync(seq)
        todo = [[seq, self._held[seq.seq_id]] for seq in seqs]  # (sequence, next position to decode)
        while sum(seq.pos - start for seq, start in todo) > n_batch - len(seqs):
            batch.clear()
            room = n_batch
            for item in todo:
                seq, start = item
                k = min(seq.pos - start, room)
                if k:
                    batch.add_tokens(seq.history[start:start + k], start, seq.seq_id, outputs="none")
                    item[1] += k
                    room -= k
                if not room:
                    break
            self.draft.decode(batch)
        batch.clear()
        for seq, start in todo:
            batch.add_tokens(seq.history[start:seq.pos + 1], start, seq.seq_id, outputs="last")
        self.draft.decode(batch)
        for seq in seqs:
            self._held[seq.seq_id] = seq.pos  # id_last's cell counts as the draft's (_wrote)


    # --- lifetime ---------------------------------------------------------------------------------

    def release(self, seq, keep: int = 0) -> int:
        """A sequence left: of its cells only the first `keep` may stay (the prompt cache), and
        only those the draft holds. Returns how many it holds."""
        sid = seq.seq_id
        self._sync(seq)
        kept = min(keep, self._held.get(sid, 0))
        if kept:
            self.draft.remove(kept, sid)
        else:
            self.draft.drop_sequence(sid)
        self._held[sid] = kept
        return kept

    def reset(self) -> None:
        self._held.clear()
        self._wrote.clear()
        self.draft.clear()

    def close(self) -> None:
        self._batch.close()


# --- the registry entry ----------------------------------------------------------------------------

def _plan(cfg, target, draft, warnings: list[str]) -> DraftPlan:
    """draft-simple: the draft must be an ordinary LLM (its vocabulary is checked once loaded,
    by llama.cpp's rules: check_vocab_compatible)."""
    draft = check_draft_given("draft-simple", draft)
    if is_dflash(draft):
        raise InputError("the draft is a DFlash model: it drafts draft-dflash (or draft-dspark), not draft-simple",
                         field="spec_type")
    if is_eagle3(draft):
        raise InputError("the draft is an EAGLE3 head: it drafts draft-eagle3, not draft-simple", field="spec_type")
    check_model(draft, "draft")
    return DraftPlan(DRAFT_SIMPLE, reads_draft=True, grows_trees=True)


def check_draft_model(target, draft) -> None:
    """draft-simple, once both are loaded: llama.cpp's vocabulary rules, and a draft whose cache
    a seq_rm rolls back (a recurrent draft would need state planes of its own)."""
    if draft.is_recurrent:
        raise InputError(f"the draft's architecture '{draft.arch}' has recurrent layers: ggspec cannot roll back "
                         "a recurrent draft model's drafted tokens yet (use an attention-only draft)", field="draft")
    check_vocab_compatible(target, draft)


def _make(b: Build) -> DraftModelProposer:
    ctx = b.draft_context(b.models.draft, "draft")
    set_draft_head(ctx, b.models.draft, b.options.vocab, counted=b.models.target)
    return DraftModelProposer(ctx, b.models.target.n_vocab, b.cfg.p_min, b.cfg.n_min)


DRAFT_SIMPLE = DraftType(
    name="draft-simple", priority=6, plan=_plan, make=_make, check_loaded=check_draft_model, options=DraftVocabOptions,
    traits=Traits(draft_model="required", target_features=False, fixed_block=False, cheap=False, n_min=True,
                  confidence=True),
    detect=lambda target, draft: draft is not None, detect_rank=4)  # any other draft file: an ordinary LLM
TYPES = (DRAFT_SIMPLE,)
