"""How sure a draft model is of its drafts: llama.cpp's draft-sampler confidence, shared by the
model drafters (draft-simple, EAGLE3, MTP, the DFlash family), and the top logits a draft
context picks on the device."""

from __future__ import annotations

import numpy as np

CONFIDENCE_TOP_K = 10  # llama.cpp's draft sampler: top-10, confidence = softmax over those


def top_k_confidence(rows: np.ndarray, k: int = CONFIDENCE_TOP_K) -> np.ndarray:
    """llama.cpp's DFlash draft confidence of each row's argmax: its softmax probability among
    the row's k largest logits (the draft sampler keeps the top 10 before the softmax)."""
    k = min(k, rows.shape[1])
    top = np.partition(rows, -k, axis=1)[:, -k:]
    return 1.0 / np.exp(top - top.max(axis=1, keepdims=True)).sum(axis=1)


def pick_mode(seq, p_min: float) -> int | None:
    """What a draft context picks on the device for this sequence (Context.pick_on_device): a
    greedy one's argmax (0), or its top 10 where p_min needs their confidence; a sampled one's
    rows stay full (None: its draft distribution is needed)."""
    if not seq.sampling.greedy:
        return None
    return CONFIDENCE_TOP_K if p_min > 0 else 0


def best_picked(cols: np.ndarray, logits: np.ndarray) -> int:
    """The argmax column of a row's top logits picked on the device (Context.picked_top, in no
    order): a tie's lowest column, as numpy's argmax over the whole row."""
    return int(cols[logits == logits.max()].min())


def picked_ranked(cols: np.ndarray, logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """A row's top logits picked on the device (in no order): the k best columns, best first (a
    tie's lowest column first), and their log-probabilities among the picked ones."""
    order = np.lexsort((cols, -logits))[:k]
    top = logits.max()
    log_z = top + np.log(np.exp(logits - top).sum())
    return cols[order].astype(np.int32), (logits[order] - log_z).astype(np.float64)
