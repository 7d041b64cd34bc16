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
    worked on (they are all that can be drawn), so a large vocabulary costs one partition."""
    x = np.asarray(logits, dtype=np.float64)
    if x.ndim == 1:
        return distribution(x[None], s)[0]
    rows, n = x.shape
    out = np.zeros_like(x)
    if s.greedy:
        out[np.arange(rows), x.argmax(axis=1)] = 1.0
        return out
    if 0 < s.top_k < n:
        cand = np.argpartition(-x, s.top_k - 1, axis=1)[:, :s.top_k]
    else:
        cand = np.broadcast_to(np.arange(n), (rows, n))
    v = np.take_along_axis(x, cand, axis=1)
    keep = np.ones(v.shape, dtype=bool)
    if s.top_p < 1.0:
        keep &= _top_p(v, s.top_p)
    if s.min_p > 0.0:
        keep &= v >= v.max(axis=1, keepdims=True) + np.log(s.min_p)  # p_i >= min_p * p_max among the kept
    z = np.where(keep, v / s.temp, -np.inf)
    p = np.exp(z - z.max(axis=1, keepdims=True))
    np.put_along_axis(out, cand, p / p.sum(axis=1, keepdims=True), axis=1)
    return out


def _top_p(v: np.ndarray, top_p: float) -> np.ndarray:
    """Of each row's candidates, the smallest set of the most probable whose probability reaches
    top_p (at least one), probabilities at temperature 1 over the candidates, as llama.cpp does."""
    order = np.argsort(-v, axis=1, kind="stable")
    vs = np.take_along_axis(v, order, axis=1)
    ps = np.exp(vs - vs[:, :1])
    cum = np.cumsum(ps / ps.sum(axis=1, keepdims=True), axis=1)
    n_keep = (cum < top_p).sum(axis=1) + 1  # through the first reaching top_p
    keep = np.zeros(v.shape, dtype=bool)
    np.put_along_axis(keep, order, np.arange(v.shape[1])[None] < n_keep[:, None], axis=1)
    return keep


def sample(p: np.ndarray, u: float) -> int:
    """The token at uniform draw u in [0, 1) by the inverse CDF of one distribution row."""
    c = np.cumsum(p)
    return int(min(np.searchsorted(c, u * c[-1], side="right"), len(p) - 1))
