"""The DFlash family of proposers: block-diffusion drafts that read the target's layer inputs.

The draft context keeps, in its KV cache, one entry per *committed* target position of each
sequence, built from the target's layer-input features of that position (an embedding batch). To
propose, it decodes every drafting sequence's noise block `[id_last, MASK x n]` in one
non-causal call, reads the drafts, and removes the blocks again. The members differ only in how
the drafts are read from that call:
- DFlash: the argmax of output rows 1..n;
- DFlash2: a walk over the selector lattice the draft's graph packs into its "nextn" rows
  (per block position: top-k candidate ids and the transition scores from each candidate of the
  previous position; position 1's predecessor is the anchor), as llama.cpp's own loop does;
- DSpark: an anchor-first block `[id_last, MASK x (n-1)]` whose rows 0..n-1 are the drafts (the
  graph adds a Markov bias chained over the block), with a per-row confidence in its nextn rows.
Every sequence's block has the same length: the DFlash2 and DSpark graphs require equal blocks.

How the target's feature rows reach the draft cache (`inject`):
- "pruned" (default): rows are queued, the rejected ones dropped at commit, and the committed
  ones injected in one call just before the target's next decode or the next draft: never more
  work than the others, and nothing has to be removed from the draft cache after a rejection;
- "deferred": the stash of the deferred-injection design (docs/concepts/injection.md): every verify row is queued and injected at the next flush, then
  the rejected ones are removed;
- "immediate": upstream llama.cpp: every verify row is injected right away, and the rejected
  ones removed at commit.
Draft proposals are bit-identical in every mode (injection is a per-row transform). Calls are
chunked to the draft's n_ubatch because a larger non-causal call aborts llama.cpp.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ggspec.errors import InputError
from ggspec.runtime import Batch, Context
from ggspec.runtime.gguf_meta import GGUFMeta
from ggspec.speculative.proposer import Draft, Proposer, Span, capture_rows, row_runs
from ggspec.speculative.sampling import candidates
from ggspec.speculative.tree import top_k
from ggspec.speculative.types.archs import LAYER_INPUT_ARCHS, is_dflash
from ggspec.speculative.types.confidence import CONFIDENCE_TOP_K, best_picked, pick_mode, picked_ranked, top_k_confidence
from ggspec.speculative.types.draft_type import Build, DraftPlan, DraftType, Traits, draft_of_kind
from ggspec.speculative.types.draft_vocab import DraftVocabOptions, set_draft_head
from ggspec.speculative.verifier import DRAFT


@dataclass(frozen=True)
class DFlashInfo:
    """What ggspec needs from a DFlash-family draft's metadata."""

    target_layers: tuple[int, ...]
    block_size: int
    mask_token: int
    causal: bool
    selector_top_k: int = 0  # DFlash2: candidates per block position (0: not a DFlash2 draft)
    dspark: bool = False  # a DSpark draft (Markov head)
    sample_from_anchor: bool = True  # DSpark: row 0 of the block is the first draft
    has_confidence: bool = False  # DSpark: a confidence head writes the nextn rows

    @property
    def variant(self) -> str:
        """dflash, dflash2 (a selector walk over candidates) or dspark (a Markov head)."""
        return "dspark" if self.dspark else "dflash2" if self.selector_top_k > 0 else "dflash"

    @property
    def anchor_first(self) -> bool:
        """The block is [id_last, MASK x (n-1)] and its rows 0..n-1 are the drafts."""
        return self.dspark and self.sample_from_anchor

    @property
    def max_draft(self) -> int:
        # in-place denoising yields block_size - 1 drafts; an anchor-first DSpark block, block_size
        return self.block_size if self.anchor_first else self.block_size - 1



def is_dspark(meta: GGUFMeta) -> bool:
    """A DFlash draft with a Markov head (read from its tensor list only: no key is parsed)."""
    return is_dflash(meta) and "markov_w1.weight" in meta.tensors


def _flag(value, default: bool) -> bool:
    """A boolean key as llama.cpp reads it (a bool, or the text "true")."""
    if value is None:
        return default
    return value is True or value == "true"


def dflash_info(draft: GGUFMeta) -> DFlashInfo:
    """The draft's DFlash keys; their values were checked by ggspec.runtime.preflight."""
    if not is_dflash(draft):
        raise InputError(f"the draft is not a DFlash model (architecture '{draft.arch}'): {draft.path}", field="draft")
    layers = draft.get("dflash.target_layers")
    if not layers:
        raise InputError(f"DFlash draft has no dflash.target_layers: {draft.path}", field="draft")
    mask = draft.get("tokenizer.ggml.mask_token_id")
    if mask is None:
        raise InputError(f"DFlash draft has no mask token (tokenizer.ggml.mask_token_id): {draft.path}", field="draft")
    dspark = is_dspark(draft)
    return DFlashInfo(
        target_layers=tuple(int(x) for x in layers),
        block_size=int(draft.get("dflash.block_size", 16)),
        mask_token=int(mask),
        causal=_flag(draft.get("dflash.attention.causal"), False),
        selector_top_k=int(draft.get("dflash.selector_top_k", 0) or 0) if "selector_hidden.weight" in draft.tensors else 0,
        dspark=dspark,
        sample_from_anchor=_flag(draft.get("dflash.sample_from_anchor"), True),
        has_confidence=dspark and "conf_proj.weight" in draft.tensors
        and _flag(draft.get("dflash.has_confidence_head"), True),
    )


def check_compatible(target: GGUFMeta, draft: GGUFMeta, info: DFlashInfo) -> None:
    """Refuse a draft that does not fit the target, before llama.cpp can abort on it."""
    if target.arch not in LAYER_INPUT_ARCHS:
        # enabling a layer input on any other graph aborts the process ("layer input tensor is null")
        raise InputError(f"the target's architecture '{target.arch}' does not expose its layer inputs in this "
                         "llama.cpp build, so a DFlash draft cannot read it", field="draft")
    if draft.n_vocab != target.n_vocab:
        raise InputError(
            f"draft vocabulary ({draft.n_vocab} tokens) does not match the target's ({target.n_vocab})", field="draft")
    borrows_head = "token_embd.weight" not in draft.tensors
    if borrows_head and draft.n_embd != target.n_embd:
        raise InputError(
            f"draft hidden size {draft.n_embd} does not match the target's {target.n_embd} "
            "(the draft borrows the target's embeddings and output head)", field="draft")
    # Converter-made files count their multi-token-prediction blocks in block_count; those blocks
    # are not run by a normal decode, so their inputs are never extracted (llama.cpp asserts).
    n_main = target.n_layer_main
    bad = [il for il in info.target_layers if not 0 <= il < n_main]
    if bad:
        mtp = (f" (block_count {target.n_layer} includes {target.n_nextn} MTP block"
               f"{'s' if target.n_nextn != 1 else ''}, which a decode does not run)" if target.n_nextn else "")
        raise InputError(f"draft reads target layer(s) {bad}, but the target has layers 0..{n_main - 1}{mtp}", field="draft")
    if not 0 <= info.mask_token < target.n_vocab:
        raise InputError(f"draft mask token {info.mask_token} is outside the vocabulary", field="draft")
    if info.block_size < 2:
        raise InputError(f"draft block size {info.block_size} leaves no room for a draft token", field="draft")








class DFlashProposer(Proposer):
    """DFlash: drafts are the argmax of the noise block's rows 1..n (see the module docstring)."""

    name = "draft-dflash"
    holds = True  # hold(): the captured rows wait in host memory (see hold)
    picks = True  # a greedy block's tokens may be picked on the device (DFlash2 and DSpark read more)

    def __init__(self, target: Context, draft: Context, info: DFlashInfo, inject: str = "pruned",
                 p_min: float = 0.0, pick_on_device: bool = False) -> None:
        """`pick_on_device`: greedy sequences' block rows are picked in the draft's graph (their
        argmax, or their 10 largest logits for p_min), so no vocabulary-wide rows cross to the host
        for them: where the head runs on a GPU (see draft_model's docstring for the CPU)."""
        self.target = target  # (the inject mode was checked with the other options: PairConfig.validate)
        self.draft = draft
        self.info = info
        self.inject = inject
        self.p_min = p_min
        self.max_draft: int | None = info.max_draft
        self.pick_on_device = pick_on_device and self.picks
        target.enable_layer_inputs(info.target_layers)
        draft.set_causal_attn(info.causal)
        self._setup_draft()
        self._batch = Batch(draft)
        # Feature rows captured but not injected yet, per sequence: (first row, first position, row
        # count). They are never copied out: they stay in the target's extraction buffer and go
        # straight into the draft's batch (shim), so they must be injected before the target's next
        # decode overwrites them: the engine calls flush() right before every target decode.
        self._rows: dict[int, tuple[int, int, int]] = {}
        # a token tree's commit: the captured span's rows (offsets) that hold its committed positions
        self._paths: dict[int, list[int]] = {}
        self._drop_from: dict[int, int] = {}  # deferred mode: rejected rows to remove after a flush
        # rows copied to host memory by hold(), per sequence: (first position, rows), oldest first
        self._held: dict[int, list[tuple[int, np.ndarray]]] = {}

    def _setup_draft(self) -> None:
        """Extra outputs the variant reads (DFlash needs none)."""

    # --- feature rows of target positions ---------------------------------------------------------

    def begin(self, seq, cached: int = 0) -> None:
        self._held.pop(seq.seq_id, None)
        self.draft.remove(cached, seq.seq_id)  # the previous sequence's positions past the shared prefix
        if self.pick_on_device:
            mode = pick_mode(seq, seq.p_min(self.p_min))
            self.draft.pick_on_device(seq.seq_id, CONFIDENCE_TOP_K if mode == 0 and self.trees else mode)

    def observe(self, spans: list[Span]) -> None:
        capture_rows(self._rows, spans, "feature rows", "injected")
        if self.inject == "immediate":
            self.flush()

    def commit(self, seq, pos0: int, n_committed: int, other: bool = False, rows: list[int] | None = None) -> None:
        drop_from = pos0 + n_committed
        if self.inject == "pruned":
            if seq.seq_id in self._rows:
                row0, first, n = self._rows[seq.seq_id]
                self._rows[seq.seq_id] = (row0, first, min(n, drop_from - first))
                if rows is not None:  # a tree's path (trees are verified with pruned injection only)
                    self._paths[seq.seq_id] = rows[:n_committed]
        elif self.inject == "deferred":
            self._drop_from[seq.seq_id] = drop_from
        elif self.draft.pos_max(seq.seq_id) >= drop_from:  # immediate: the rows are in the cache already
            self.draft.remove(drop_from, seq.seq_id)

    def hold(self) -> None:
        """No draft comes before the next target decode: copy the captured rows to host memory,
        where the next flush finds them, instead of calling the draft now (the adaptive length's
        steps that verify no draft)."""
        for seq_id, (row0, pos0, n) in self._rows.items():
            drop = self._drop_from.pop(seq_id, None)  # deferred mode: the rejected rows go now
            n = n if drop is None else min(n, drop - pos0)
            for first, pos, count in self._runs(seq_id, row0, pos0, n):
                rows = self.target.layer_inputs(self.info.target_layers, count, first)
                self._held.setdefault(seq_id, []).append((pos, rows))
        self._rows.clear()
        self._paths.clear()

    def _runs(self, seq_id: int, row0: int, pos0: int, n: int) -> list[tuple[int, int, int]]:
        """The captured rows that hold a sequence's positions pos0..pos0 + n - 1 (row_runs)."""
        return row_runs(row0, pos0, n, self._paths.pop(seq_id, None))

    def flush(self) -> None:
        """Inject every captured row (and every held one) into the draft cache: one call for all
        sequences (more only when the rows exceed the draft's n_ubatch)."""
        if not self._rows and not self._held:
            return
        held, self._held = self._held, {}
        live = [run for seq_id, (row0, pos0, n) in self._rows.items() for run in
                [(seq_id, *r) for r in self._runs(seq_id, row0, pos0, n)]]
        self._rows.clear()
        self._paths.clear()
        self._batch.clear()
        for seq_id, parts in held.items():
            for pos0, rows in parts:
                self._put(len(rows), lambda off, take: self._batch.add_embd_rows(rows[off:off + take], pos0 + off,
                                                                                 seq_id))
        layers = self.info.target_layers
        for seq_id, row0, pos0, n in live:
            self._put(n, lambda off, take: self._batch.add_layer_inputs(self.target, layers, row0 + off, take,
                                                                        pos0 + off, seq_id))
        if self._batch.n_tokens:
            self.draft.decode(self._batch)
        for seq_id, drop_from in self._drop_from.items():
            self.draft.remove(drop_from, seq_id)
        self._drop_from.clear()

    def _put(self, n: int, add) -> None:
        """Add n rows to the injection batch through add(offset, count), decoding whenever it is
        full: a non-causal call with more rows than n_ubatch aborts llama.cpp."""
        room, off = self.draft.n_ubatch, 0
        while off < n:
            take = min(n - off, room - self._batch.n_tokens)
            add(off, take)
            off += take
            if self._batch.n_tokens == room:
                self.draft.decode(self._batch)
                self._batch.clear()

    # --- drafting --------------------------------------------------------------------------------

    def _blocks(self, seqs, n: int) -> np.ndarray:
        """The noise blocks of these sequences for n drafts, one row each: [id_last, MASK, ...]."""
        rows = n if self.info.anchor_first else n + 1
        blocks = np.full((len(seqs), rows), self.info.mask_token, dtype=np.int32)
        blocks[:, 0] = [seq.id_last for seq in seqs]
        return blocks

    def propose(self, seqs, n: int) -> list[Draft]:
        """Draft n tokens after each sequence's last token (at its position), all blocks in one
        decode. The draft cache must hold exactly each sequence's positions before it (the
        engine flushes first)."""
        if not seqs:
            return []
        blocks = self._blocks(seqs, n)
        rows = blocks.shape[1]
        if rows * len(seqs) > self.draft.n_ubatch:  # a non-causal batch larger than one ubatch aborts llama.cpp
            raise InputError(f"{len(seqs)} noise blocks of {rows} rows do not fit the draft's physical batch size "
                             f"{self.draft.n_ubatch}", field="n_ubatch")
        self._batch.clear()
        self._proposed = [seq.seq_id for seq in seqs]  # the order of the blocks' rows (marginals)
        for seq, block in zip(seqs, blocks):
            self._batch.add_tokens(block, seq.pos, seq.seq_id, outputs=self._outputs)
        self.draft.decode(self._batch)
        sampled = self.samples_drafts and not all(seq.sampling.greedy for seq in seqs)
        if sampled:
            drafts = self._sample(seqs, rows, n)
        elif all(self.draft.picked_on_device(seq.seq_id) is not None for seq in seqs):
            drafts = self._picked(seqs, rows, n)
        else:
            drafts = self._read(seqs, rows, n)
        for seq in seqs:
            self.draft.remove(seq.pos, seq.seq_id)  # the noise block must not stay in the draft cache
        return drafts

    # Every row is an output, as in llama.cpp's own loop: the DFlash graph returns logits for all
    # block rows whatever the flags say, so asking for rows 1..n only would misalign them.
    _outputs = "all"
    # a sequence that samples (temperature > 0) gets drafts drawn from the draft's own distribution q
    # after its sampler's transforms, which the rejection rule needs; the DFlash2 and DSpark
    # variants keep their walks (point masses, exact too)
    samples_drafts = True

    def _read(self, seqs, rows: int, n: int) -> list[Draft]:
        """Drafts from the last draft decode: a block of `rows` rows per sequence, in batch order."""
        n_seqs = len(seqs)
        logits = self.draft.logits_view().reshape(n_seqs, rows, -1)[:, 1:]  # row i predicts position pos + i
        tokens = self._tokens(logits.argmax(axis=2))
        cuts = [seq.p_min(self.p_min) for seq in seqs]
        if max(cuts) > 0:
            conf = top_k_confidence(logits.reshape(n_seqs * n, -1)).reshape(n_seqs, n)
            return [Draft(_cut(t, c < cut)) for t, c, cut in zip(tokens, conf, cuts)]
        return [Draft(t) for t in tokens]

    def _picked(self, seqs, rows: int, n: int) -> list[Draft]:
        """_read's drafts from what the device picked of each block row (pick_on_device)."""
        drafts = []
        for s, seq in enumerate(seqs):
            out = range(s * rows + rows - n, (s + 1) * rows)  # the block's output rows 1..n
            cut = seq.p_min(self.p_min)
            if cut <= 0 and self.draft.picked_on_device(seq.seq_id) == 0:
                drafts.append(Draft(self._tokens(np.array([self.draft.picked_argmax(r) for r in out]))))
                continue
            tops = [self.draft.picked_top(r) for r in out]
            best = np.array([best_picked(cols, logits) for cols, logits in tops])
            conf = top_k_confidence(np.stack([logits for _, logits in tops]))
            drafts.append(Draft(_cut(self._tokens(best), conf < cut)))
        return drafts

    def _sample(self, seqs, rows: int, n: int) -> list[Draft]:
        """Drafts of a batch where some sequences sample: each of those draws its block's tokens from
        the draft's distribution under its own sampler settings and draws, and the distributions
        travel with the drafts; greedy sequences take the argmax."""
        logits = self.draft.logits_view().reshape(len(seqs), rows, -1)[:, rows - n:]
        drafts = []
        for seq, block in zip(seqs, logits):
            if seq.sampling.greedy:
                tokens, q = self._tokens(block.argmax(axis=1)), None
            else:
                q = candidates(block, seq.sampling)  # every row of the block at once
                if self.draft.logit_ids is not None:  # a reduced head: its columns' tokens
                    q = q.of_tokens(self.draft.logit_ids)
                draws = seq.rng(DRAFT)
                tokens = q.sample([draws.random() for _ in range(n)]).astype(np.int32)
            cut = seq.p_min(self.p_min)
            if cut > 0:  # the greedy path's cut; a draft-only stop rule keeps the distribution
                tokens = _cut(tokens, top_k_confidence(block) < cut)
            drafts.append(Draft(tokens, None if q is None else q[:len(tokens)]))
        return drafts

    # plain DFlash's block rows are the draft's distribution at each position: a tree grows from them
    grows_trees = True
    trees = False  # keep_candidates() was called: a device that picks a row keeps its top logits

    def keep_candidates(self) -> None:
        self.trees = True

    def marginals(self, seqs, n: int, k: int) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per sequence (any of the last propose(seqs, n)'s): each block position's k likeliest tokens and
        their log-probabilities: from the full rows, or where the device picked a row's top
        logits (pick_on_device with a top-k), from those, normalised among themselves."""
        rows = len(self._blocks(seqs[:1], n)[0])
        out = []
        for seq in seqs:
            s = self._proposed.index(seq.seq_id)  # its block in the last draft call
            if self.draft.picked_on_device(seq.seq_id):
                tops = [self.draft.picked_top(r) for r in range(s * rows + rows - n, (s + 1) * rows)]
                cols, logprobs = zip(*(picked_ranked(c, v, k) for c, v in tops))
                out.append((self._tokens(np.stack(cols)), np.stack(logprobs)))
                continue
            block = self.draft.logits_view()[s * rows + rows - n:(s + 1) * rows]
            cols, logprobs = top_k(block, k)
            out.append((self._tokens(cols), logprobs))
        return out

    def _tokens(self, columns: np.ndarray) -> np.ndarray:
        """The tokens of logits columns: the same, or a reduced head's (Context.logit_ids)."""
        ids = self.draft.logit_ids
        return (columns if ids is None else ids[columns]).astype(np.int32)

    def release(self, seq, keep: int = 0) -> int:
        """Rows not injected yet are dropped: the draft's cells hold the positions up to the last
        flush, which may be fewer than `keep`."""
        self._rows.pop(seq.seq_id, None)
        self._paths.pop(seq.seq_id, None)
        self._drop_from.pop(seq.seq_id, None)
        self._held.pop(seq.seq_id, None)
        if keep <= 0:
            self.draft.drop_sequence(seq.seq_id)
            return 0
        self.draft.remove(keep, seq.seq_id)
        return min(keep, self.draft.pos_max(seq.seq_id) + 1)

    def reset(self) -> None:
        """Forget captured rows and empty the draft cache."""
        self._rows.clear()
        self._paths.clear()
        self._drop_from.clear()
        self._held.clear()
        self.draft.clear()

    def close(self) -> None:
        self._batch.close()


class DFlash2Proposer(DFlashProposer):
    """DFlash2: the draft's graph packs a selector lattice into its nextn rows; each block
    position row holds top_k candidate ids, then top_k x top_k transition scores (the scores of
    every candidate given predecessor p start at top_k + p * top_k). The walk starts from
    predecessor 0 (position 1's scores depend only on the anchor token) and follows the best
    score; with a confidence cut-off it stops where the softmax of the scores at the chosen
    candidate falls below p_min. This is the walk of the pinned common/speculative.cpp."""

    # no logits: the lattice is all that is read (llama.cpp asks for no outputs either)
    _outputs = "none"
    samples_drafts = False
    picks = False
    grows_trees = False  # (its walk reads a lattice of candidates, not one distribution per position)

    def _setup_draft(self) -> None:
        self.draft.enable_nextn(masked=False)  # every row of the block, not just output rows

    def _read(self, seqs, rows: int, n: int) -> list[Draft]:
        k = self.info.selector_top_k
        lattice = self.draft.nextn_view(len(seqs) * rows).reshape(len(seqs), rows, -1)
        drafts = []
        for seq, blk in zip(seqs, lattice):
            cut = seq.p_min(self.p_min)
            cand = blk[1:, :k]  # (n, k) candidate ids as floats
            scores = blk[1:, k:k + k * k].reshape(n, k, k)  # [position, predecessor, candidate]
            out: list[int] = []
            pred = 0
            for i in range(n):
                row = scores[i, pred]
                best = int(row.argmax())
                if cut > 0 and 1.0 / np.exp(row - row[best]).sum() < cut:
                    break
                out.append(int(cand[i, best]))
                pred = best
            drafts.append(Draft(np.asarray(out, dtype=np.int32)))
        return drafts


class DSparkProposer(DFlashProposer):
    """DSpark: an anchor-first block (rows 0..n-1 are the drafts, the graph chains a Markov bias
    over them), or with `sample_from_anchor` false a DFlash-shaped block; an optional confidence
    head writes each row's confidence (broadcast over the nextn row; element 0 is read)."""

    name = "draft-dspark"
    samples_drafts = False
    picks = False
    grows_trees = False  # (its rows are chained by the Markov head: not yet grown into trees)

    def _setup_draft(self) -> None:
        if self.info.has_confidence:  # (read where a sequence has a cut-off: its own or the engine's)
            self.draft.enable_nextn(masked=False)

    def _read(self, seqs, rows: int, n: int) -> list[Draft]:
        n_seqs = len(seqs)
        first = 0 if self.info.anchor_first else 1
        logits = self.draft.logits_view().reshape(n_seqs, rows, -1)[:, first:first + n]
        tokens = logits.argmax(axis=2).astype(np.int32)
        cuts = [seq.p_min(self.p_min) if self.info.has_confidence else 0.0 for seq in seqs]
        if max(cuts) <= 0:
            return [Draft(t) for t in tokens]
        conf = self.draft.nextn_view(n_seqs * rows).reshape(n_seqs, rows, -1)[:, first:first + n, 0]
        return [Draft(_cut(t, c < cut)) for t, c, cut in zip(tokens, conf, cuts)]




def _cut(tokens: np.ndarray, low: np.ndarray) -> np.ndarray:
    """The drafts before the first low-confidence position."""
    stop = np.flatnonzero(low)
    return tokens[:stop[0]] if len(stop) else tokens


def make_dflash_proposer(target: Context, draft: Context, info: DFlashInfo, inject: str, p_min: float,
                         pick_on_device: bool = False):
    """The family member the draft's metadata calls for. Only plain DFlash samples its drafts for
    sequences at temperature > 0; a DFlash2 walk and a DSpark block are point masses (llama.cpp's
    choices)."""
    cls = DSparkProposer if info.dspark else DFlash2Proposer if info.selector_top_k > 0 else DFlashProposer
    return cls(target, draft, info, inject, p_min, pick_on_device)


# --- the registry entries --------------------------------------------------------------------------

def _plan(name: str, dspark: bool):
    def plan(cfg, target: GGUFMeta, draft: GGUFMeta | None, warnings: list[str]) -> DraftPlan:
        """A DFlash-family draft that fits the target (its layers, vocabulary, block), of this
        type (a Markov head makes a DSpark draft), and its head placeable on the devices."""
        draft = draft_of_kind(name, draft, is_dflash, "the draft is not a DFlash model (architecture '{arch}'): {path}",
                              "draft")
        info = dflash_info(draft)
        check_compatible(target, draft, info)
        if dspark and not info.dspark:
            raise InputError("draft-dspark needs a DSpark draft (one with a Markov head, markov_w1.weight); "
                             "this one is a plain DFlash draft", field="spec_type")
        if not dspark and info.dspark:
            raise InputError("the draft has a DSpark Markov head: its spec type is draft-dspark", field="spec_type")
        if info.dspark and cfg.p_min > 0 and not info.has_confidence:
            raise InputError("the DSpark draft has no confidence head, so a confidence cut-off cannot apply "
                             "(set it to 0)", field="p_min")
        own_head = {"d2t", "output.weight"} & draft.tensors
        if own_head and cfg.placement.split_mode == "tensor" and not cfg.placement.mirror_output:
            raise InputError(f"the draft has its own output head ({', '.join(sorted(own_head))}): under a tensor split "
                             "the head is split by vocabulary rows and llama.cpp aborts on it; mirror the output head",
                             field="mirror_output")
        return DraftPlan(DRAFT_DSPARK if dspark else DRAFT_DFLASH, meta=info, max_draft=info.max_draft,
                         reads_draft=True, grows_trees=info.variant == "dflash")
    return plan


def _make(b: Build) -> DFlashProposer:
    # the draft borrows the target's embeddings / output head through ctx_other
    info, draft = b.plan.meta, b.models.draft
    ctx = b.draft_context(draft, "draft", ctx_other=b.target, picks_per_seq=info.block_size)
    if b.options.vocab:
        _reduce_head(ctx, b)
    head = draft if "output.weight" in draft.meta.tensors else b.models.target
    return make_dflash_proposer(b.target, ctx, info, b.cfg.inject, b.cfg.p_min, pick_on_device=head.head_on_device)


def _reduce_head(ctx: Context, b: Build) -> None:
    """A reduced draft vocabulary for plain DFlash: the head it multiplies by (its own output
    matrix, or the target's it borrows) scores only the most common tokens. DFlash2's selector and
    DSpark's Markov head read whole-vocabulary rows, and a draft that maps its own reduced
    vocabulary (d2t) has one already: those are refused."""
    info, draft = b.plan.meta, b.models.draft
    if info.dspark or info.selector_top_k > 0:
        raise InputError(f"a reduced draft vocabulary applies to plain DFlash drafts: this is a "
                         f"{'DSpark' if info.dspark else 'DFlash2'} draft, whose walk reads every token's logit",
                         field="spec_draft_vocab")
    if "d2t" in draft.meta.tensors:
        raise InputError("the draft has a reduced vocabulary of its own (d2t): --spec-draft-vocab does not apply",
                         field="spec_draft_vocab")
    head = draft if "output.weight" in draft.meta.tensors else b.models.target
    set_draft_head(ctx, head, b.options.vocab, counted=b.models.target)


_TRAITS = Traits(draft_model="required", target_features=True, fixed_block=True, cheap=False, confidence=True,
                 injection=True)
DRAFT_DFLASH = DraftType(name="draft-dflash", priority=9, traits=_TRAITS, plan=_plan("draft-dflash", False), make=_make,
                         options=DraftVocabOptions,
                         detect=lambda target, draft: draft is not None and is_dflash(draft), detect_rank=3)
DRAFT_DSPARK = DraftType(name="draft-dspark", priority=10, traits=_TRAITS, plan=_plan("draft-dspark", True), make=_make,
                         options=DraftVocabOptions,
                         detect=lambda target, draft: draft is not None and is_dspark(draft),
                         detect_rank=2)
TYPES = (DRAFT_DFLASH, DRAFT_DSPARK)
