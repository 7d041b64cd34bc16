"""The DFlash proposer: a block-diffusion draft that reads the target's layer-input features.

The draft context keeps, in its KV cache, one entry per *committed* target position, built from
the target's layer-input features of that position (an embedding batch). To propose, it decodes
the noise block `[id_last, MASK x n]` at the next positions in one non-causal pass, reads the n
greedy tokens from rows 1..n, and removes the block again.

How the target's feature rows reach the draft cache (`inject`):
- "pruned" (default): rows are queued, the rejected ones dropped at acceptance, and the committed
  ones injected in one call just before the next draft: never more work than the others, and
  nothing has to be removed from the draft cache after a rejection;
- "deferred": seed 004's stash: every verify row is queued and injected before the next draft,
  then the rejected ones are removed;
- "immediate": upstream llama.cpp: every verify row is injected right away, and the rejected
  ones removed at acceptance.
Draft proposals are bit-identical in every mode (injection is a per-row transform). Calls are
chunked to the draft's n_ubatch because a larger non-causal call aborts llama.cpp.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ggspec.errors import InputError
from ggspec.runtime import Batch, Context
from ggspec.runtime.gguf_meta import GGUFMeta
from ggspec.speculative.archs import LAYER_INPUT_ARCHS

INJECT_MODES = ("pruned", "deferred", "immediate")


@dataclass(frozen=True)
class DFlashInfo:
    """What ggspec needs from a DFlash draft's metadata."""

    target_layers: tuple[int, ...]
    block_size: int
    mask_token: int
    causal: bool

    @property
    def n_max_limit(self) -> int:
        # The noise block is [id_last, MASK x (block_size - 1)]: at most block_size - 1 drafts.
        return self.block_size - 1


def is_dflash(meta: GGUFMeta) -> bool:
    return meta.arch == "dflash"


def dflash_info(draft: GGUFMeta) -> DFlashInfo:
    """The draft's DFlash keys; their values were checked by ggspec.runtime.preflight."""
    if not is_dflash(draft):
        raise InputError(f"--dflash: the draft is not a DFlash model (architecture '{draft.arch}'): {draft.path}")
    layers = draft.get("dflash.target_layers")
    if not layers:
        raise InputError(f"DFlash draft has no dflash.target_layers: {draft.path}")
    mask = draft.get("tokenizer.ggml.mask_token_id")
    if mask is None:
        raise InputError(f"DFlash draft has no mask token (tokenizer.ggml.mask_token_id): {draft.path}")
    causal = draft.get("dflash.attention.causal", False)
    return DFlashInfo(
        target_layers=tuple(int(x) for x in layers),
        block_size=int(draft.get("dflash.block_size", 16)),
        mask_token=int(mask),
        causal=bool(causal),
    )


def check_compatible(target: GGUFMeta, draft: GGUFMeta, info: DFlashInfo) -> None:
    """Refuse a draft that does not fit the target, before llama.cpp can abort on it."""
    if target.arch not in LAYER_INPUT_ARCHS:
        # enabling a layer input on any other graph aborts the process ("layer input tensor is null")
        raise InputError(f"the target's architecture '{target.arch}' does not expose its layer inputs in this "
                         "llama.cpp build, so a DFlash draft cannot read it")
    if draft.n_vocab != target.n_vocab:
        raise InputError(
            f"draft vocabulary ({draft.n_vocab} tokens) does not match the target's ({target.n_vocab})"
        )
    borrows_head = "token_embd.weight" not in draft.tensors
    if borrows_head and draft.n_embd != target.n_embd:
        raise InputError(
            f"draft hidden size {draft.n_embd} does not match the target's {target.n_embd} "
            "(the draft borrows the target's embeddings and output head)"
        )
    # Converter-made files count their multi-token-prediction blocks in block_count; those blocks
    # are not run by a normal decode, so their inputs are never extracted (llama.cpp asserts).
    n_main = target.n_layer_main
    bad = [il for il in info.target_layers if not 0 <= il < n_main]
    if bad:
        mtp = (f" (block_count {target.n_layer} includes {target.n_nextn} MTP block"
               f"{'s' if target.n_nextn != 1 else ''}, which a decode does not run)" if target.n_nextn else "")
        raise InputError(f"draft reads target layer(s) {bad}, but the target has layers 0..{n_main - 1}{mtp}")
    if not 0 <= info.mask_token < target.n_vocab:
        raise InputError(f"draft mask token {info.mask_token} is outside the vocabulary")
    if info.block_size < 2:
        raise InputError(f"draft block size {info.block_size} leaves no room for a draft token")


class DFlashProposer:
    """Proposes up to block_size - 1 tokens per step from the draft context."""

    def __init__(self, target: Context, draft: Context, info: DFlashInfo, inject: str = "pruned") -> None:
        if inject not in INJECT_MODES:
            raise InputError(f"--spec-dflash-inject {inject}: expected one of {', '.join(INJECT_MODES)}")
        self.target = target
        self.draft = draft
        self.info = info
        self.inject = inject
        target.enable_layer_inputs(info.target_layers)
        draft.set_causal_attn(info.causal)
        self._batch = Batch(draft)
        # Feature rows captured but not injected yet: (first position, row count). They are never
        # copied out: they stay in the target's extraction buffer and go straight into the draft's
        # batch (shim), so they must be injected before the target's next decode overwrites them.
        self._rows: tuple[int, int] | None = None
        self._drop_from: int | None = None  # deferred mode: rejected rows to remove after a flush

    # --- feature rows of target positions ---------------------------------------------------------

    def capture(self, n_rows: int, pos0: int) -> None:
        """The target's last decode computed the features of positions pos0.. in its first n_rows
        rows. The caller must `flush()` before the target decodes again (loop.py does)."""
        if not n_rows:
            return
        if self._rows is not None:
            raise RuntimeError(f"feature rows of positions {self._rows[0]}.. were never injected "
                               f"and the target has decoded again since (flush before every target decode)")
        self._rows = (pos0, n_rows)
        if self.inject == "immediate":
            self.flush()

    def accept(self, n_committed: int, pos0: int) -> None:
        """The verify batch captured at pos0 keeps only its first n_committed rows."""
        drop_from = pos0 + n_committed
        if self.inject == "pruned":
            if self._rows is not None:
                first, n = self._rows
                self._rows = (first, min(n, drop_from - first))
        elif self.inject == "deferred":
            self._drop_from = drop_from
        elif self.draft.pos_max() >= drop_from:  # immediate: the rows are in the cache already
            self.draft.remove(drop_from)

    def reset(self) -> None:
        """Forget captured rows (the caller clears the draft cache)."""
        self._rows = None
        self._drop_from = None

    def flush(self) -> int:
        """Inject the captured rows into the draft cache; returns the number of rows injected."""
        if self._rows is None:
            return 0
        pos0, n = self._rows
        self._rows = None
        chunk = self.draft.n_ubatch  # a non-causal call with more rows than n_ubatch aborts llama.cpp
        for off in range(0, n, chunk):
            self._batch.clear().add_layer_inputs(self.target, self.info.target_layers, off, min(chunk, n - off), pos0 + off)
            self.draft.decode(self._batch)
        if self._drop_from is not None:
            self.draft.remove(self._drop_from)
            self._drop_from = None
        return n

    # --- drafting --------------------------------------------------------------------------------

    def propose(self, id_last: int, pos: int, n: int) -> np.ndarray:
        """Draft n tokens following `id_last` (at position `pos`). The draft cache must hold
        exactly the positions before `pos`: call `flush()` first."""
        if n + 1 > self.draft.n_ubatch:  # a non-causal batch larger than one ubatch aborts llama.cpp
            raise InputError(f"a noise block of {n + 1} rows does not fit the draft's physical batch size "
                             f"{self.draft.n_ubatch} (-ub)")
        block = np.full(n + 1, self.info.mask_token, dtype=np.int32)
        block[0] = id_last
        # Every row is an output, as in llama.cpp's own loop: the DFlash graph returns logits for
        # all block rows whatever the flags say, so asking for rows 1..n only would misalign them.
        self._batch.clear().add_tokens(block, pos, outputs="all")
        self.draft.decode(self._batch)
        tokens = self.draft.argmax_rows()[1:]  # row i predicts the token at position pos + i
        self.draft.remove(pos)  # the noise block must not stay in the draft cache
        return tokens

    def close(self) -> None:
        self._batch.close()
