"""draft-eagle3: an EAGLE3 head (arch `eagle3`) drafting from three of the target's hidden states.

A port of llama.cpp's `common_speculative_impl_draft_eagle3` (the pinned
common/speculative.cpp:421-920) over `src/models/eagle3.cpp`. The head has two graphs:
  encoder  g_P = fc(features_P): the target's features at position P are the inputs of the three
           layers `eagle3.target_layers` names, concatenated (an id equal to the target's n_layer
           means its final normed state);
  decoder  one layer over [RMSNorm(embedding of token P + 1), RMSNorm(g_P)] at position P (the
           attention residual is the raw g), whose pre-norm output state h drafts the token after
           P + 1 through the head's own output rows, which `d2t` scatters to target ids.
So the decoder cell at position P holds the pair (token P + 1, g_P): the pair of the last committed
position waits for the token the target chooses next (llama.cpp's "deferred boundary").

In the engine's five calls:
  observe   the target decoded these rows (its layer inputs are readable until it decodes again);
  commit    only the committed rows of a verify span count (llama.cpp encodes and writes the
            rejected rows too, then removes their cells: the cells kept are the same);
  flush     one encoder call over every sequence's new committed rows: their g rows are kept;
  propose   one decoder call writes each sequence's pending pairs before its last committed
            position P = pos - 1 (llama.cpp's process() does it after the verify), the next the
            seeds (id_last, g_P), whose outputs draft the first tokens (SP:742-768; in calls of
            their own: see _write_pairs); each next call holds (drafted token, h of the step before) at
            the next position, for the sequences still drafting (SP:777-840). Argmax, top-10
            confidence for p_min, n_min as for draft-simple; at temperature > 0 drafts are drawn
            from the head's distribution and travel with it. The drafts' cells go afterwards.

A sequence's decoder cells pair each position with the *next* token, so with the prompt cache a
later prompt sharing n tokens keeps the pairs at positions < n - 1 only (their next tokens are
shared), and the target decodes its rows again from n - 1 (`cache_lag`), whose features make the
pair at n - 1 with the new prompt's own token there.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ggspec.errors import InputError, LlamaError
from ggspec.runtime import Batch, Context
from ggspec.speculative.proposer import Draft, Proposer, Span, capture_rows, model_draft, row_runs
from ggspec.speculative.types.archs import FINAL_STATE_ARCHS, LAYER_INPUT_ARCHS
from ggspec.speculative.types.autoregressive import RowCandidates, draft_tokens
from ggspec.speculative.types.draft_type import Build, DraftPlan, DraftType, Traits, draft_of_kind


@dataclass(frozen=True)
class Eagle3Info:
    target_layers: tuple[int, ...]  # llama.cpp ids; the target's n_layer means its final normed state
    n_embd: int  # the head's hidden size (g and h rows)
    n_embd_target: int  # eagle3.target_hidden_size
    n_vocab_draft: int  # rows of its own head (d2t), or the target's vocabulary


def is_eagle3(meta) -> bool:
    return meta.arch == "eagle3"


def eagle3_info(meta) -> Eagle3Info:
    layers = meta.arch_key("target_layers")
    d2t = next((t for t in meta.tensor_info if t.name == "d2t"), None)
    n_draft = d2t.shape[0] if d2t is not None else meta.n_vocab
    return Eagle3Info(tuple(int(x) for x in layers) if isinstance(layers, list) else (),
                      int(meta.n_embd), int(meta.arch_key("target_hidden_size") or 0), int(n_draft))


def check_eagle3(target, draft, info: Eagle3Info) -> None:
    """Refuse an EAGLE3 head llama.cpp would throw on or abort with for this target (one line)."""
    where = f"the EAGLE3 head {draft.path}"
    if len(info.target_layers) != 3:
        raise InputError(f"{where} names {len(info.target_layers)} target layers (eagle3.target_layers); "
                         "EAGLE3 reads exactly 3", field="draft")
    bad = [il for il in info.target_layers if not 0 <= il <= target.n_layer_main]
    if bad:
        raise InputError(f"{where} reads target layer(s) {bad}; the target has layers 0..{target.n_layer_main - 1} "
                         f"(and {target.n_layer_main}: its final state)", field="draft")
    if target.n_layer_main in info.target_layers and target.arch not in FINAL_STATE_ARCHS:
        raise InputError(f"{where} reads the target's final state (target layer {target.n_layer_main}), which a "
                         f"'{target.arch}' graph does not export in this llama.cpp build (llama.cpp would read an "
                         "unwritten buffer)", field="draft")
    if info.n_embd_target != target.n_embd:
        raise InputError(f"{where} was trained on hidden states {info.n_embd_target} wide "
                         f"(eagle3.target_hidden_size); the target's are {target.n_embd}", field="draft")
    if any(il < target.n_layer_main for il in info.target_layers) and target.arch not in LAYER_INPUT_ARCHS:
        raise InputError(f"the target's architecture '{target.arch}' does not expose its layer inputs in this "
                         "llama.cpp build, which EAGLE3 reads", field="target")
    if "token_embd.weight" not in draft.tensors and info.n_embd != target.n_embd:
        raise InputError(f"{where} is {info.n_embd} wide and has no token embeddings of its own: it reads the "
                         f"target's, which are {target.n_embd} wide", field="draft")
    if draft.n_vocab != target.n_vocab:
        raise InputError(f"{where} has {draft.n_vocab} tokens, the target {target.n_vocab}", field="draft")
    if info.n_vocab_draft > target.n_vocab:
        raise InputError(f"{where}: its head has {info.n_vocab_draft} rows (d2t), more than the target's "
                         f"{target.n_vocab} tokens", field="draft")


class Eagle3Proposer(RowCandidates, Proposer):
    """Drafts with an EAGLE3 head (see the module docstring)."""

    name = "draft-eagle3"
    max_draft: int | None = None

    def __init__(self, target: Context, draft: Context, info: Eagle3Info, p_min: float = 0.0, n_min: int = 0) -> None:
        self.target, self.draft, self.info = target, draft, info
        self.p_min, self.n_min = p_min, n_min
        n_layer = target.model.n_layer
        self.layer_ids = [il for il in info.target_layers if il < n_layer]
        if self.layer_ids:
            target.enable_layer_inputs(self.layer_ids)
        if n_layer in info.target_layers:
            target.enable_nextn(masked=False)  # the final normed state of every row
        draft.enable_nextn(masked=True)  # g rows of the encoder, h rows of the decoder's outputs
        self.n_embd = info.n_embd
        self._enc = Batch(draft)
        self._batch = Batch(draft)
        self._rows: dict[int, tuple[int, int, int]] = {}  # seq_id -> (row0, pos0, n) observed, not encoded
        self._paths: dict[int, list[int]] = {}  # seq_id -> a token tree's committed rows (offsets from row0)
        self._g: dict[int, tuple[int, np.ndarray]] = {}  # seq_id -> (first position, g rows) not written yet
        self._written: dict[int, int] = {}  # seq_id -> the decoder cells hold its pairs at positions < this

    # --- following the target ---------------------------------------------------------------------

    cache_lag = 1

    def begin(self, seq, cached: int = 0) -> None:
        """The slot's pairs at positions < cached stay (the engine decodes the target from
        `cached`, one before the shared prefix's end: cache_lag), the rest goes."""
        self.draft.remove(cached, seq.seq_id)
        self._rows.pop(seq.seq_id, None)
        self._paths.pop(seq.seq_id, None)
        self._g.pop(seq.seq_id, None)
        self._written[seq.seq_id] = cached

    def observe(self, spans: list[Span]) -> None:
        capture_rows(self._rows, spans, "rows", "encoded")

    def commit(self, seq, pos0: int, n_committed: int, other: bool = False, rows: list[int] | None = None) -> None:
        if seq.seq_id in self._rows:
            row0, first, n = self._rows[seq.seq_id]
            self._rows[seq.seq_id] = (row0, first, max(0, min(n, pos0 + n_committed - first)))
            if rows is not None:  # a token tree's accepted path: its rows, not the span's first ones
                self._paths[seq.seq_id] = rows[:n_committed]

    def flush(self) -> None:
        """The encoder over every sequence's new committed rows, one call (more past n_ubatch)."""
        pending = [(sid, *run) for sid, (row0, pos0, n) in self._rows.items()
                   for run in row_runs(row0, pos0, n, self._paths.pop(sid, None))]
        self._rows.clear()
        self._paths.clear()
        if not pending:
            return
        g = self._encode(pending)
        at = 0
        for sid, _, pos0, n in pending:
            rows = g[at:at + n]
            at += n
            if sid in self._g:  # after the rows it has (a prompt in several chunks)
                first, old = self._g[sid]
                if first + len(old) != pos0:
                    raise LlamaError(f"sequence {sid}: encoded rows jump from position {first + len(old)} to {pos0}")
                rows = np.concatenate([old, rows])
                pos0 = first
            self._g[sid] = (pos0, rows)

    def _encode(self, pending) -> np.ndarray:
        """g rows of the pending target rows, in order: the encoder in calls of n_ubatch rows. Its
        rows come straight from the target's buffers (the shim copies them) unless the head reads
        the target's final state, which is gathered here. The encoder has no attention: its
        positions are placeholders past sequence 0's cells (llama.cpp's choice, which its batch
        checks accept)."""
        total, step = sum(n for *_, n in pending), self.draft.n_ubatch
        g = np.empty((total, self.n_embd), dtype=np.float32)
        direct = len(self.layer_ids) == len(self.info.target_layers)
        feats = None if direct else self._features(pending)
        parts = [(row0 + off, min(step, n - off)) for _, row0, _, n in pending for off in range(0, n, step)]
        done = 0
        while parts:
            self._enc.clear()
            pos = self.draft.pos_max(0) + 1
            while parts and self._enc.n_tokens + parts[0][1] <= step:
                row0, n = parts.pop(0)
                if direct:
                    self._enc.add_layer_inputs(self.target, self.info.target_layers, row0, n, pos, 0, outputs=True)
                else:
                    self._enc.add_embd_rows(feats[done + self._enc.n_tokens:done + self._enc.n_tokens + n], pos, 0,
                                            outputs=True)
                pos += n
            self.draft.encode(self._enc)
            g[done:done + self._enc.n_tokens] = self.draft.nextn_view(self._enc.n_tokens)
            done += self._enc.n_tokens
        self._enc.clear()
        return g

    def _features(self, pending) -> np.ndarray:
        """The target's features of the pending rows, [rows, 3 * n_embd_target], in llama.cpp's order."""
        n_rows = max(row0 + n for _, row0, _, n in pending)
        layer = {il: self.target.layer_inputs([il], n_rows) for il in self.layer_ids}
        n_layer = self.target.model.n_layer
        if n_layer in self.info.target_layers:
            layer[n_layer] = self.target.nextn_view(n_rows)
        return np.concatenate([np.concatenate([layer[il][row0:row0 + n] for il in self.info.target_layers], axis=1)
                               for _, row0, _, n in pending])

    # --- drafting ---------------------------------------------------------------------------------

    def propose(self, seqs, n: int) -> list[Draft]:
        if not seqs:
            return []
        self._write_pairs(seqs)  # its seeds' logits are the first draft position's
        row_bytes = self.n_embd * 4

        def step(i: int):
            if i > 0:
                self.draft.decode(self._batch)
            logits, h = self.draft.logits_view(), self.draft.nextn_ptr()
            self._batch.clear()
            return logits, h

        def feed(r: int, seq, token: int, i: int, h) -> None:  # the next pair: (this token, this step's h)
            self._batch.add_tokens_h([token], h + r * row_bytes, h + r * row_bytes, seq.pos + i, seq.seq_id,
                                     self.n_embd, outputs=True)

        kept = self._keeping(seqs)
        made = draft_tokens(seqs, n, self.p_min, step, feed, kept=kept)
        self._kept(seqs, kept)
        self._batch.clear()
        for seq in seqs:
            self.draft.remove(seq.pos, seq.seq_id)  # the drafts' pairs; the committed ones stay
        return [model_draft(t, d, self.n_min) for t, d in made]

    def _write_pairs(self, seqs) -> None:
        """Each sequence's pending pairs (token k + 1, g_k) up to its last committed position, in
        calls without outputs (full batches), then the seeds — each sequence's last pair, whose
        output drafts — in one call of their own. Never together: the EAGLE3 graph does not prune
        its rows to the outputs, and llama.cpp copies the first rows of its logits and states
        (the seed would read a catch-up row's)."""
        todo = []
        for seq in seqs:
            start, end = self._written[seq.seq_id], seq.pos  # pairs at positions start..end-1
            first, g = self._g.get(seq.seq_id, (start, np.empty((0, self.n_embd), dtype=np.float32)))
            if end <= start or first != start or len(g) < end - start:
                raise LlamaError(f"sequence {seq.seq_id}: no encoded target features for positions {start}..{end - 1}")
            todo.append((seq, start, end, np.ascontiguousarray(g[:end - start])))
        batch, room = self._batch, self.draft.n_batch
        batch.clear()
        for seq, start, end, g in todo:  # the catch-up
            for off in range(0, end - 1 - start, room):
                rows = g[off:min(off + room, end - 1 - start)]
                if batch.n_tokens + len(rows) > room:
                    self.draft.decode(batch)
                    batch.clear()
                self._add_pairs(seq, start + off, rows, outputs=False)
        if batch.n_tokens:
            self.draft.decode(batch)
        batch.clear()
        for seq, start, end, g in todo:  # the seeds
            self._add_pairs(seq, end - 1, g[-1:], outputs=True)
        self.draft.decode(batch)
        for seq in seqs:
            self._written[seq.seq_id] = seq.pos
            self._g.pop(seq.seq_id, None)

    def _add_pairs(self, seq, start: int, g: np.ndarray, outputs: bool) -> None:
        tokens = seq.history[start + 1:start + 1 + len(g)]
        addr = g.ctypes.data
        self._batch.add_tokens_h(tokens, addr, addr + self.n_embd * 4, start, seq.seq_id, self.n_embd, outputs=outputs)


    # --- lifetime ---------------------------------------------------------------------------------

    def release(self, seq, keep: int = 0) -> int:
        """A sequence left: of the target's first `keep` positions, those whose pairs are written
        stay, and one more (the token the last kept pair was made with); its other pairs go."""
        sid = seq.seq_id
        written = self._written.get(sid, 0)
        for d in (self._rows, self._paths, self._g, self._written):
            d.pop(sid, None)
        kept = min(keep, written + 1)
        if kept <= 1:
            self.draft.drop_sequence(sid)
            return 0
        self.draft.remove(kept - 1, sid)
        return kept

    def reset(self) -> None:
        for d in (self._rows, self._paths, self._g, self._written):
            d.clear()
        self.draft.clear()

    def close(self) -> None:
        self._enc.close()
        self._batch.close()


# --- the registry entry ----------------------------------------------------------------------------

def _plan(cfg, target, draft, warnings: list[str]) -> DraftPlan:
    """draft-eagle3: the draft must be an EAGLE3 head that fits the target (llama.cpp needs
    --spec-type draft-eagle3 said; ggspec detects the architecture)."""
    draft = draft_of_kind("draft-eagle3", draft, is_eagle3,
                          "draft-eagle3 needs an EAGLE3 head (architecture 'eagle3'); the draft's is '{arch}'", "spec_type")
    info = eagle3_info(draft)
    check_eagle3(target, draft, info)
    return DraftPlan(DRAFT_EAGLE3, meta=info, reads_draft=True, grows_trees=True)


def _make(b: Build) -> Eagle3Proposer:
    # (the head borrows the target's token embeddings / output head through ctx_other)
    ctx = b.draft_context(b.models.draft, "EAGLE3 head", ctx_other=b.target)
    return Eagle3Proposer(b.target, ctx, b.plan.meta, b.cfg.p_min, b.cfg.n_min)


DRAFT_EAGLE3 = DraftType(
    name="draft-eagle3", priority=7, plan=_plan, make=_make,
    traits=Traits(draft_model="required", target_features=True, fixed_block=False, cheap=False, n_min=True,
                  confidence=True),
    detect=lambda target, draft: draft is not None and is_eagle3(draft), detect_rank=1)
TYPES = (DRAFT_EAGLE3,)
