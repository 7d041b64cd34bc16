"""draft-mtp: drafts from the target's own multi-token-prediction (nextn) head.

A port of llama.cpp's `common_speculative_impl_draft_mtp` in its single-head and shared-memory
modes (the pinned common/speculative.cpp:1331-1747; qwen35, qwen35moe, qwen3next, ...; Gemma 4). The head runs in a second
context of type MTP on the target's own weights; its cache holds only the MTP block's layer.

Pairing: the MTP entry at position q is (token q, h at q - 1) and predicts token q + 1, where h is
the target's hidden state after its final norm (the target exports it for every row of every
decode: `nextn` rows, unmasked). A sequence's first row pairs with the `pending` h carried from
its previous rows (zeros for a new sequence, as in llama.cpp's loop on a fresh slot).

Per step, in the engine's five calls:
  observe   the target decoded these rows (prompt chunks, or a verify span);
  commit    of a verify span only the committed rows stay (llama.cpp catches up over every row
            and removes the rejected cells afterwards: the kept cells are the same);
  flush     the catch-up: one MTP decode over every sequence's committed rows, each paired as
            above (SP:1497-1560); the last row's h becomes the sequence's pending h (SP:1732-1745);
  propose   one MTP decode per draft position for all drafting sequences together: the first
            holds (id_last, pending h) at id_last's position, each next one the drafted token with
            the head's own output state at the next position (SP:1583-1722); a draft stops where
            the top-10 softmax probability of its argmax falls below p_min, a draft shorter than
            n_min is dropped; the draft's cells are removed again afterwards.

Gemma 4 (`shared_kv`, llama.cpp's shared-memory mode): the head is a separate drafter file (arch
gemma4-assistant) whose context takes the target's through ctx_other and has no cache of its own:
its sliding-window layers attend through the target's layer n_layer - 2, its full layers through
n_layer - 1 (Q-only layers; llama_model::create_memory's share callback). So there is no catch-up
decode (flush only keeps the h of each sequence's last committed row), every draft step decodes
at id_last's position (the drafter writes no cell, its queries see the target's cells before it),
each next step pairs the drafted token with the drafter's own projected state, and nothing is
removed afterwards. Its cells being the target's, the prompt cache works as for the target alone.

Chained (`chain`, patch 0011; docs/concepts/mtp.md): one decode runs all n draft steps of every sequence inside
one graph (argmax, the next token's embedding and the next h on the device, each step's K/V in its
own cell), and only (token, confidence) per step comes back: one llama.cpp call per draft however
long. Same drafts as the unchained loop with the full vocabulary. With a reduced draft vocabulary
(`Model.set_draft_vocab`, chosen by ggspec.speculative.types.draft_vocab) the chained head scores only those rows of the output matrix; the target
still verifies against all of them, so the output is unchanged, only acceptance may drop. Sequences
that sample (temperature > 0) draft unchained: the chain takes argmaxes only.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ggspec.errors import InputError
from ggspec.runtime import Batch, Context
from ggspec.runtime.gguf_meta import GGUFMeta
from ggspec.runtime.preflight import check_model
from ggspec.speculative.proposer import Draft, Proposer, Span, capture_rows, model_draft, row_runs
from ggspec.speculative.types.archs import DRAFTER_ARCHS, is_mtp_drafter
from ggspec.speculative.types.autoregressive import RowCandidates, draft_tokens
from ggspec.speculative.types.draft_type import Build, DraftPlan, DraftType, Traits, option, type_names
from ggspec.speculative.types.draft_vocab import DraftVocabOptions, give_draft_vocab

# The architectures whose graph, in the pinned llama.cpp, has an MTP head (LLM_GRAPH_TYPE_DECODER_MTP);
# ggspec runs those with one nextn block (llama.cpp's single-head mode: the same calls for all of
# them). Tested on qwen35 fixtures; the others have no fixture yet.
MTP_ARCHS = frozenset({"bailingmoe3", "cohere2moe", "deepseek2", "deepseek32", "deepseek4", "glm-dsa", "glm4moe",
                       "glm5-next", "hy-v3", "nemotron_h_moe", "qwen35", "qwen35moe", "qwen3next"})

# the architectures whose MTP graph has patch 0011's chained mode
CHAIN_ARCHS = frozenset({"gemma4-assistant", "qwen35", "qwen35moe"})


def _sliding(meta) -> list[bool] | None:
    v = meta.arch_key("attention.sliding_window_pattern")
    return [bool(x) for x in v] if isinstance(v, list) and len(v) == meta.n_layer else None


def _per_layer(meta, suffix: str) -> list | None:
    v = meta.arch_key(suffix)
    return v if isinstance(v, list) else None if v is None else [v] * meta.n_layer


def check_drafter(target, drafter) -> None:
    """Refuse a Gemma 4 assistant that cannot read this target's cache, before llama.cpp builds a
    graph over mismatched views (its asserts abort): the drafter's sliding layers attend through
    the target's layer n_layer - 2, its full layers through n_layer - 1 (llama_model::create_memory),
    so those must be a sliding and a full layer whose head sizes and KV heads the drafter's match."""
    want = DRAFTER_ARCHS[drafter.arch]
    where = f"the drafter {drafter.path}"
    if target.arch != want:
        raise InputError(f"a {drafter.arch} drafter drafts for a {want} target; this target's architecture is "
                         f"'{target.arch}'", field="draft")
    if drafter.arch_key("embedding_length_out") != target.n_embd:
        raise InputError(f"{where} reads hidden states {drafter.arch_key('embedding_length_out')} wide "
                         f"(embedding_length_out); the target's are {target.n_embd}", field="draft")
    if drafter.n_vocab != target.n_vocab:
        raise InputError(f"{where} has {drafter.n_vocab} tokens, the target {target.n_vocab}", field="draft")
    t_swa, d_swa = _sliding(target), _sliding(drafter)
    if t_swa is None or d_swa is None or target.n_layer < 2 or not t_swa[-2] or t_swa[-1]:
        raise InputError("a Gemma 4 drafter reads the target's last sliding-window layer (n_layer - 2) and its "
                         "last full-attention layer (n_layer - 1): this pair's attention.sliding_window_pattern "
                         "does not have them", field="draft")
    for suffix in ("attention.key_length", "attention.key_length_swa", "attention.sliding_window"):
        if drafter.arch_key(suffix) != target.arch_key(suffix):
            raise InputError(f"{where}: {suffix} = {drafter.arch_key(suffix)}, the target's is "
                             f"{target.arch_key(suffix)} (its queries attend over the target's keys)", field="draft")
    t_kv, d_kv = _per_layer(target, "attention.head_count_kv"), _per_layer(drafter, "attention.head_count_kv")
    if t_kv is None or d_kv is None or len(d_kv) != drafter.n_layer or len(t_kv) != target.n_layer:
        raise InputError("the pair's attention.head_count_kv is missing or does not fit its layers", field="draft")
    for il, swa in enumerate(d_swa):
        if d_kv[il] != t_kv[-2 if swa else -1]:
            raise InputError(f"{where}: layer {il} has {d_kv[il]} KV heads, the target layer it reads "
                             f"{t_kv[-2 if swa else -1]}", field="draft")


def check_chain(arch: str, n_max: int, parallel: int, n_ubatch: int) -> None:
    """Refuse chained drafting where the patched graph cannot run it, before llama.cpp sees it."""
    if arch not in CHAIN_ARCHS:
        raise InputError(f"chained drafting runs the MTP heads of {', '.join(sorted(CHAIN_ARCHS))}; this "
                         f"head's architecture is '{arch}'", field="draft_chain")
    if n_max * parallel > n_ubatch:
        raise InputError(f"a chained draft of {n_max} steps for {parallel} sequences needs {n_max * parallel} rows in "
                         f"one physical batch, more than {n_ubatch}: raise it or lower the draft length",
                         field="n_ubatch")
    if n_max > 64:
        raise InputError(f"a chained draft runs at most 64 steps (draft length {n_max})", field="n_max")


def has_mtp_head(meta) -> bool:
    """Whether a target file carries a loadable MTP block (llama.cpp's own test: the last
    block's nextn.eh_proj, with nextn_predict_layers set)."""
    return meta.n_nextn > 0 and f"blk.{meta.n_layer - 1}.nextn.eh_proj.weight" in meta.tensors


class MTPProposer(RowCandidates, Proposer):
    """Drafts with the target's MTP head (see the module docstring)."""

    name = "draft-mtp"
    max_draft: int | None = None

    def __init__(self, target: Context, mtp: Context, p_min: float = 0.0, n_min: int = 0,
                 chain: bool = False, draft_vocab: bool = False, shared_kv: bool = False) -> None:
        """`shared_kv`: `mtp` is a separate drafter's context reading the target's cache (Gemma 4)."""
        self.target = target
        self.mtp = mtp
        self.shared_kv = shared_kv
        self.p_min = p_min
        self.n_min = n_min
        self.chain = chain
        self.draft_vocab = draft_vocab  # chained drafts score the model's reduced vocabulary
        self.n_embd = target.model.n_embd
        target.enable_nextn(masked=False)  # h of every target row, output or not
        mtp.enable_nextn(masked=True)  # the head's own state of its output rows
        self._batch = Batch(mtp)
        self._pending: dict[int, np.ndarray] = {}  # seq_id -> h to pair with its next row
        # rows the target decoded but the MTP cache has not caught up with, per sequence:
        # (first batch row, first position, tokens); read from the target's nextn buffer at flush,
        # so they must be flushed before the target decodes again (the engine does)
        self._rows: dict[int, tuple[int, int, np.ndarray]] = {}
        self._paths: dict[int, list[int]] = {}  # a token tree's committed rows (offsets from row0), per sequence

    # --- catching up with the target --------------------------------------------------------------

    def begin(self, seq, cached: int = 0) -> None:
        """A new sequence starts from nothing: no carried state (a leak once seen upstream: a stale pending
        h paired with the first token of an unrelated prompt) and no cells of the slot's last one."""
        if not self.shared_kv:
            self.mtp.drop_sequence(seq.seq_id)
        self._pending[seq.seq_id] = np.zeros(self.n_embd, dtype=np.float32)
        self._rows.pop(seq.seq_id, None)
        self._paths.pop(seq.seq_id, None)

    def observe(self, spans: list[Span]) -> None:
        capture_rows(self._rows, spans, "rows", "caught up", keep=lambda sp: sp.tokens[:sp.n_rows])

    def commit(self, seq, pos0: int, n_committed: int, other: bool = False, rows: list[int] | None = None) -> None:
        if seq.seq_id in self._rows:
            row0, first, tokens = self._rows[seq.seq_id]
            if rows is not None:  # a token tree's accepted path: its rows' tokens, in order
                self._paths[seq.seq_id] = rows[:n_committed]
                self._rows[seq.seq_id] = (row0, first, np.asarray(tokens)[rows[:n_committed]])
                return
            self._rows[seq.seq_id] = (row0, first, tokens[:max(0, pos0 + n_committed - first)])

    def flush(self) -> None:
        """The catch-up decode: every sequence's pending rows in one MTP call (more only past n_batch).
        A drafter sharing the target's cache has nothing to catch up: only the h of each
        sequence's last committed row is kept (SP:1496 skips the decode, SP:1562-1576)."""
        if not self._rows:
            return
        pending = [(seq_id, row_runs(row0, pos0, len(tokens), self._paths.pop(seq_id, None)), pos0, tokens)
                   for seq_id, (row0, pos0, tokens) in self._rows.items() if len(tokens)]
        self._rows.clear()
        self._paths.clear()
        if not pending:
            return
        if self.shared_kv:
            for seq_id, runs, _, _ in pending:
                last = runs[-1][0] + runs[-1][2] - 1
                self._pending[seq_id] = self.target.nextn_view(last + 1)[last].copy()
            return
        base, row_bytes = self.target.nextn_ptr(), self.n_embd * 4
        self._batch.clear()
        for seq_id, runs, pos0, tokens in pending:
            # each token pairs with the h of the committed row before it (the carried h for the first);
            # a tree's path is runs of consecutive rows (row_runs), each run's first token paired
            # with the last row of the run before it
            before = self._pending[seq_id].ctypes.data
            for row0, first_pos, count in runs:
                for off in range(0, count, self.mtp.n_batch):
                    i = first_pos - pos0 + off
                    part = tokens[i:i + min(self.mtp.n_batch, count - off)]
                    if self._batch.n_tokens + len(part) > self.mtp.n_batch:
                        self._decode()
                    first = before if off == 0 else base + (row0 + off - 1) * row_bytes
                    self._batch.add_tokens_h(part, first, base + (row0 + off) * row_bytes, first_pos + off, seq_id,
                                             self.n_embd, outputs=False)
                before = base + (row0 + count - 1) * row_bytes
            last = runs[-1][0] + runs[-1][2] - 1
            self._pending[seq_id] = self.target.nextn_view(last + 1)[last].copy()
        self._decode()

    def _decode(self) -> None:
        if self._batch.n_tokens:
            self.mtp.decode(self._batch)
        self._batch.clear()

    # --- drafting ---------------------------------------------------------------------------------

    def propose(self, seqs, n: int) -> list[Draft]:
        """Up to n drafts after each sequence's last token: one MTP decode per draft position for
        all sequences still drafting. A drafter sharing the target's cache decodes every step at
        id_last's position (SP:1697-1702: it writes no cells, so its queries see the target's
        cells before that position only)."""
        if not seqs:
            return []
        # a step that grows a token tree reads each draft step's row: unchained, unless the chain scores
        # a reduced vocabulary (its drafts differ from the unchained loop's: no tree then)
        unchained = self._wanted and self.trees and not self.draft_vocab
        self._candidates = {}  # (none from an earlier step: a chained one keeps none)
        if self.chain and all(seq.sampling.greedy for seq in seqs) and not unchained:
            return self._propose_chained(seqs, n)
        self._batch.clear()
        for seq in seqs:
            h = self._pending[seq.seq_id].ctypes.data
            self._batch.add_tokens_h([seq.id_last], h, h, seq.pos, seq.seq_id, self.n_embd, outputs=True)
        advance = 0 if self.shared_kv else 1  # position advance per draft step
        row_bytes = self.n_embd * 4

        def step(i: int):
            self.mtp.decode(self._batch)
            logits, base = self.mtp.logits_view(), self.mtp.nextn_ptr()
            self._batch.clear()
            return logits, base

        def feed(r: int, seq, token: int, i: int, base) -> None:
            h = base + r * row_bytes
            self._batch.add_tokens_h([token], h, h, seq.pos + advance * (i + 1), seq.seq_id, self.n_embd, outputs=True)

        kept = self._keeping(seqs)
        made = draft_tokens(seqs, n, self.p_min, step, feed, kept=kept)
        self._kept(seqs, kept)
        self._batch.clear()
        if not self.shared_kv:
            for seq in seqs:
                self.mtp.remove(seq.pos, seq.seq_id)  # the draft's cells; the catch-up rewrites them
        return [model_draft(t, d, self.n_min) for t, d in made]

    def _propose_chained(self, seqs, n: int) -> list[Draft]:
        """All n steps of every sequence in one decode: n rows per sequence, step-major (row
        i * len(seqs) + s: sequence s at its position + i); row 0 of each carries (id_last, pending
        h), the later rows are placeholders (the same inputs) the graph replaces with its own tokens
        and states."""
        self._batch.clear()
        step = 0 if self.shared_kv else 1  # a shared drafter's steps are all at id_last's position
        for i in range(n):
            for seq in seqs:
                h = self._pending[seq.seq_id].ctypes.data
                # outputs (never read): the context keeps its last graph per "has outputs", so the
                # chained graph and the catch-up's (no outputs) are both reused from step to step
                self._batch.add_tokens_h([seq.id_last], h, h, seq.pos + step * i, seq.seq_id, self.n_embd,
                                         outputs=True)
        cuts = [seq.p_min(self.p_min) for seq in seqs]
        self.mtp.set_mtp_chain(n, confidence=max(cuts) > 0, draft_vocab=self.draft_vocab)
        try:
            self.mtp.decode(self._batch)
        finally:
            self.mtp.set_mtp_chain(0)  # every other decode of this context runs one step
        self._batch.clear()
        ids, conf = self.mtp.chain_result(n * len(seqs))
        ids, conf = ids.reshape(n, len(seqs)), conf.reshape(n, len(seqs))
        drafts = []
        for s, seq in enumerate(seqs):
            tokens = ids[:, s]
            if cuts[s] > 0:  # the unchained loop stops at the first low-confidence step
                low = np.flatnonzero(conf[:, s] < cuts[s])
                tokens = tokens[:low[0]] if len(low) else tokens
            drafts.append(model_draft(tokens.tolist(), [], self.n_min))
            if not self.shared_kv:
                self.mtp.remove(seq.pos, seq.seq_id)
        return drafts


    # --- lifetime ---------------------------------------------------------------------------------

    def release(self, seq, keep: int = 0) -> int:
        """A sequence left. A head with its own cache keeps nothing for a later prompt: the
        carried h of a shorter prefix is gone (and the targets with MTP heads ggspec runs are
        recurrent: no prompt cache). A drafter sharing the target's cache holds no positions at
        all: the prompt's last row, always decoded, gives the next sequence its h."""
        self._rows.pop(seq.seq_id, None)
        self._paths.pop(seq.seq_id, None)
        self._pending.pop(seq.seq_id, None)
        if self.shared_kv:
            return keep
        self.mtp.drop_sequence(seq.seq_id)
        return 0

    def reset(self) -> None:
        self._rows.clear()
        self._paths.clear()
        self._pending.clear()
        if not self.shared_kv:  # a shared drafter's cells are the target's
            self.mtp.clear()

    def close(self) -> None:
        self._batch.close()


# --- the registry entry ----------------------------------------------------------------------------

@dataclass(frozen=True)
class MTPOptions(DraftVocabOptions):
    """Chained drafting, and (DraftVocabOptions) the reduced vocabulary its head scores."""

    chain: bool = option(False, "draft_chain", ("--spec-draft-chain",),
                         "draft-mtp: run all draft steps in one graph (argmax on the device; patch 0011).",
                         low=None, high=None)

    def check_unused(self, running: tuple[DraftType, ...]) -> None:
        super().check_unused(running)
        if self.chain:
            raise InputError(f"chained drafting options apply to draft-mtp, not to {type_names(running)}",
                             field="draft_chain")


def check_mtp(target: GGUFMeta) -> None:
    """Refuse draft-mtp for a target whose file or architecture has no single MTP head."""
    if target.arch in DRAFTER_ARCHS.values():
        raise InputError(f"a {target.arch} target has no MTP block of its own: draft-mtp drafts for it with a separate "
                         f"drafter ({', '.join(DRAFTER_ARCHS)}), given as the draft model", field="spec_type")
    if target.arch not in MTP_ARCHS:
        raise InputError(f"the target's architecture '{target.arch}' has no MTP head in this llama.cpp build "
                         "(draft-mtp runs qwen35, qwen35moe, qwen3next, glm4moe, deepseek2, ...)", field="spec_type")
    if not has_mtp_head(target):
        raise InputError(f"the target has no MTP block (no nextn_predict_layers / blk.N.nextn.eh_proj tensors; "
                         f"convert it with its MTP layers): {target.path}", field="spec_type")
    if target.n_nextn != 1:
        raise InputError(f"the target has {target.n_nextn} MTP blocks: ggspec runs single-head MTP only "
                         "(llama.cpp's chain-head mode is not ported yet)", field="spec_type")



def _detect(target, draft) -> bool:
    """A separate drafter given as the draft, or no draft and a target with one MTP head."""
    if draft is not None:
        return is_mtp_drafter(draft)
    return target.arch in MTP_ARCHS and has_mtp_head(target) and target.n_nextn == 1


def _plan(cfg, target, draft, warnings: list[str]) -> DraftPlan:
    """The target's own head, or a Gemma 4 drafter given as the draft (llama.cpp needs
    --spec-type draft-mtp for it; ggspec detects it): its layers read the target's cells."""
    o = cfg.options(DRAFT_MTP)
    if o.vocab and not o.chain:  # (the vocabulary option is shared: only here does it need a chain)
        raise InputError("a reduced draft vocabulary is scored by chained drafts: add --spec-draft-chain",
                         field="spec_draft_vocab")
    if draft is not None and is_mtp_drafter(draft):
        if cfg.fixed_block:
            raise InputError(f"the draft is a {draft.arch} MTP drafter: its spec type is draft-mtp", field="spec_type")
        check_model(draft, "draft")
        check_drafter(target, draft)
        return DraftPlan(DRAFT_MTP, reads_draft=True, shares_cells=True, grows_trees=True)
    if draft is not None:
        warnings.append("draft-mtp drafts with the target's own MTP head: the draft model is not used")
    check_mtp(target)
    # (a target's own MTP block: only hybrid targets carry one here, on which trees do not run yet;
    # its catch-up pairs a tree path's tokens by row_runs, untested without a dense such target)
    return DraftPlan(DRAFT_MTP, target_mtp=True)


def _target_params(cfg, plan: DraftPlan, params, warnings: list[str]) -> None:
    """A Gemma 4 drafter reads the target's cells, sliding layers too: every cell is kept (the
    layout its drafts were checked against llama.cpp's with). A chained one reads them in one
    ubatch, step-major: one stream."""
    if plan.shares_cells:
        params.swa_full = True
    if plan.shares_cells and cfg.options(DRAFT_MTP).chain and cfg.parallel > 1 and not params.kv_unified:
        params.kv_unified = True
        warnings.append("chained Gemma 4 drafts read the target's cache as one stream: it is unified "
                        "for the parallel sequences")


def _make(b: Build) -> MTPProposer:
    """The head's context on the target's own weights (its cache holds only the MTP layer, in one
    stream for all sequences: a chained draft's rows are step-major, one ubatch), and for a
    reduced draft vocabulary its compacted head, built once per set of weights."""
    cfg, model, o = b.cfg, b.models.target, b.options
    drafter = b.models.draft if b.plan.shares_cells else None
    if o.chain:
        check_chain((drafter or model).arch, b.n_max, b.parallel, min(cfg.ctx.n_ubatch, cfg.ctx.n_batch))
    if drafter is not None:
        # a Gemma 4 drafter: its own weights, no cache (its layers read the target's: the same
        # streams and cells as the target's context, which it takes through ctx_other)
        ctx = b.draft_context(drafter, "MTP drafter", ctx_other=b.target, mtp=True,
                              kv_unified=b.target.params.kv_unified)
    else:
        ctx = b.draft_context(model, "MTP", mtp=True, kv_unified=True)
    head = drafter or model  # the weights whose output head drafts
    if o.vocab:
        give_draft_vocab(head, o.vocab, counted=model)  # the target's tokens (a drafter has the same)
    return MTPProposer(b.target, ctx, cfg.p_min, cfg.n_min, chain=o.chain, draft_vocab=o.vocab > 0,
                       shared_kv=drafter is not None)


DRAFT_MTP = DraftType(
    name="draft-mtp", priority=8, plan=_plan, make=_make, options=MTPOptions, target_params=_target_params,
    traits=Traits(draft_model="optional", target_features=True, fixed_block=False, cheap=False, n_min=True,
                  confidence=True),
    detect=_detect, detect_rank=0)
TYPES = (DRAFT_MTP,)
