"""The exported draft inside llama.cpp against its PyTorch original, on the same target features.

Both sides get one captured sequence's features before an anchor and the block [x_a, MASK...]:
llama.cpp through the dflash graph (feature injection, then the noise block), PyTorch with the
weights rounded as they were written. Logits are compared on the draft vocabulary's columns.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from ggspec.distill.capture import Dataset
from ggspec.distill.export import exportable
from ggspec.distill.model import DFlashDraft

# of the logits' range: f32 cache and graph vs PyTorch f32 with the written weights; with q8_0
# weights llama.cpp also rounds the activations to 8 bits inside each matmul (~0.5 % seen)
REL_TOL = {"f32": 2e-3, "f16": 2e-3, "q8_0": 1.5e-2}


@dataclass
class Parity:
    max_diff: float
    scale: float
    drafts_llama: list[int]
    drafts_torch: list[int]
    near_ties: int  # rows whose torch top-2 gap is below the tolerance (argmax may differ there)
    tol: float  # relative to the logits' range

    @property
    def ok(self) -> bool:
        agree = sum(a != b for a, b in zip(self.drafts_llama, self.drafts_torch)) <= self.near_ties
        return self.max_diff <= self.tol * self.scale and agree

    def line(self) -> str:
        return (f"parity: draft logits max |diff| {self.max_diff:.2e} (logit range {self.scale:.1f}); "
                f"drafts llama.cpp {self.drafts_llama} torch {self.drafts_torch}")


def _anchor(ds: Dataset, block: int) -> tuple[int, int]:
    """(sequence, anchor): the last captured sequence with a whole block after its prompt."""
    for i in range(ds.n_done - 1, -1, -1):
        a = int(ds.prompt_lens[i]) + 8
        if a + block <= ds.lengths[i] and a <= 256:
            return i, a
    raise ValueError("no captured sequence is long enough for a parity check")


@torch.no_grad()
def _torch_logits(draft: DFlashDraft, outtype: str, feats, tokens, a: int, embed, head, d2t, mask_id: int) -> np.ndarray:
    rounded = exportable(draft, outtype)
    B = draft.cfg.block_size
    block = torch.full((1, B), 0, dtype=torch.long)
    block[0, 0] = int(tokens[a])
    block[0, 1:] = mask_id
    hidden = rounded(torch.from_numpy(feats[None, :a]), torch.arange(a), F.embedding(block, embed),
                     torch.arange(a, a + B)[None], torch.ones(1, B, a + B, dtype=torch.bool))
    logits = rounded.logits(hidden[0, 1:], None if rounded.head is not None else head).numpy()
    return logits if rounded.head is not None else logits[:, d2t]


def _llama_logits(target_path: Path, draft_path: Path, feats, tokens, a: int, B: int, mask_id: int, d2t) -> np.ndarray:
    from ggspec.runtime import Batch, Context, ContextParams, Model

    params = ContextParams(n_ctx=512, n_batch=512, n_ubatch=512, type_k="f32", type_v="f32", flash_attn="off")
    with Model(target_path, what="target") as tm, Context(tm, params, what="target") as tctx, \
            Model(draft_path, what="draft") as dm, Context(dm, params, ctx_other=tctx, what="draft") as dctx, \
            Batch(dctx) as batch:
        dctx.set_causal_attn(False)
        batch.add_embd_rows(feats[:a], 0)
        dctx.decode(batch)
        batch.clear()
        block = np.full(B, mask_id, np.int32)
        block[0] = tokens[a]
        batch.add_tokens(block, a, outputs="all")
        dctx.decode(batch)
        return dctx.logits()[1:, d2t]


def check(draft: DFlashDraft, draft_path: Path, target_path: Path, ds: Dataset, mask_id: int, d2t: np.ndarray,
          embed: np.ndarray, head: np.ndarray, outtype: str) -> Parity:
    """embed, head: the target's token embeddings and output head (a full-vocabulary draft reads both)."""
    B = draft.cfg.block_size
    i, a = _anchor(ds, B)
    feats = ds.rows(np.array([i]), a + 1)[0]
    tokens = np.asarray(ds.tokens[i])
    pt = _torch_logits(draft, outtype, feats, tokens, a, torch.from_numpy(embed), torch.from_numpy(head), d2t, mask_id)
    ll = _llama_logits(target_path, draft_path, feats, tokens, a, B, mask_id, d2t)
    scale = float(pt.max() - pt.min())
    top2 = np.sort(pt, axis=1)[:, -2:]
    near = int(np.sum(top2[:, 1] - top2[:, 0] < 2 * REL_TOL[outtype] * scale))
    return Parity(max_diff=float(np.abs(ll - pt).max()), scale=scale, drafts_llama=d2t[ll.argmax(1)].tolist(),
                  drafts_torch=d2t[pt.argmax(1)].tolist(), near_ties=near, tol=REL_TOL[outtype])
