"""Sampling settings and the target distribution they define (llama.cpp's meanings and defaults).

llama.cpp's default chain (common/common.h) applies, in this order: top-k, top-p, min-p, then the
temperature, and draws from the softmax of what is left. `distribution` computes that final
distribution for rows of logits, so the acceptance rule of speculative sampling (verifier.py) can
compare the target's p with the draft's q after the same transforms. Temperature <= 0 is greedy.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ggspec.errors import InputError

DEFAULT_SEED = 0xFFFFFFFF  # llama.cpp's LLAMA_DEFAULT_SEED: "pick a random seed"


@dataclass(frozen=True)
class SamplerSettings:
    temp: float = 0.8
    top_k: int = 40  # <= 0: the whole vocabulary
    top_p: float = 0.95  # 1.0: off
    min_p: float = 0.05  # 0.0: off
    seed: int = DEFAULT_SEED

    @property
    def greedy(self) -> bool:
        return self.temp <= 0

    def validate(self) -> None:
        if not np.isfinite(self.temp):
            raise InputError(f"the temperature must be a finite number (got {self.temp})", field="temp")
        if not 0.0 <= self.top_p <= 1.0:
            raise InputError(f"top-p must be within 0..1 (got {self.top_p})", field="top_p")
        if not 0.0 <= self.min_p <= 1.0:
            raise InputError(f"min-p must be within 0..1 (got {self.min_p})", field="min_p")
        if not 0 <= self.seed <= 0xFFFFFFFF:
            raise InputError(f"the seed must be within 0..4294967295 (got {self.seed})", field="seed")


def distribution(logits: np.ndarray, s: SamplerSettings) -> np.ndarray:
    """The sampling distribution of every row: (rows, n_vocab) logits -> float64 probabilities,
    zero outside the tokens top-k, top-p and min-p keep (llama.cpp's order), softmax(logit / temp)
    inside. Greedy settings give a point mass on each row's argmax. Only the top-k candidates are
    worked on (they are all that can be drawn), so a large vocabulary costs one partition; rows are
    few (a verify span), so they are handled one by one with plain 1-D operations."""
    x = np.asarray(logits)
    if x.ndim == 1:
        return distribution(x[None], s)[0]
    out = np.zeros(x.shape, dtype=np.float64)
    if s.greedy:
        out[np.arange(len(x)), x.argmax(axis=1)] = 1.0
        return out
    n = x.shape[1]
    log_min_p = np.log(s.min_p) if s.min_p > 0.0 else None
    for r, row in enumerate(x):
        cand = np.argpartition(row, n - s.top_k)[n - s.top_k:] if 0 < s.top_k < n else np.arange(n)
        v = row[cand].astype(np.float64)
        if s.top_p < 1.0:
            order = np.argsort(-v, kind="stable")
            cand, v = cand[order], v[order]
            ps = np.exp(v - v[0])
            cum = np.cumsum(ps)
            n_keep = int(np.count_nonzero(cum < s.top_p * cum[-1])) + 1  # through the first reaching top_p
            cand, v = cand[:n_keep], v[:n_keep]
        if log_min_p is not None:  # p_i >= min_p * p_max among what is left
            ok = v >= v.max() + log_min_p
            cand, v = cand[ok], v[ok]
        p = np.exp((v - v.max()) / s.temp)
        out[r, cand] = p / p.sum()
    return out


def sample(p: np.ndarray, u: float) -> int:
    """The token at uniform draw u in [0, 1) by the inverse CDF of one distribution row."""
    c = np.cumsum(p)
    return int(min(np.searchsorted(c, u * c[-1], side="right"), len(p) - 1))
