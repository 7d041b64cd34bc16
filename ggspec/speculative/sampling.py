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
    inside. Greedy settings give a point mass on each row's argmax."""
    x = np.asarray(logits, dtype=np.float64)
    if x.ndim == 1:
        return distribution(x[None], s)[0]
    rows, n = x.shape
    if s.greedy:
        out = np.zeros_like(x)
        out[np.arange(rows), x.argmax(axis=1)] = 1.0
        return out
    keep = np.ones_like(x, dtype=bool)
    if 0 < s.top_k < n:
        drop = np.argpartition(-x, s.top_k - 1, axis=1)[:, s.top_k:]
        np.put_along_axis(keep, drop, False, axis=1)
    if s.top_p < 1.0:
        keep &= _top_p(x, keep, s.top_p)
    if s.min_p > 0.0:
        top = np.where(keep, x, -np.inf).max(axis=1, keepdims=True)
        keep &= x >= top + np.log(s.min_p)  # p_i >= min_p * p_max among the kept tokens
    z = np.where(keep, x / s.temp, -np.inf)
    z -= z.max(axis=1, keepdims=True)
    p = np.exp(z)
    return p / p.sum(axis=1, keepdims=True)


def _top_p(x: np.ndarray, keep: np.ndarray, top_p: float) -> np.ndarray:
    """The smallest set of most probable kept tokens whose probability reaches top_p (at least one),
    probabilities taken at temperature 1 over the kept tokens, as llama.cpp does."""
    z = np.where(keep, x, -np.inf)
    order = np.argsort(-z, axis=1, kind="stable")
    zs = np.take_along_axis(z, order, axis=1)
    ps = np.exp(zs - zs[:, :1])
    ps /= ps.sum(axis=1, keepdims=True)
    cum = np.cumsum(ps, axis=1)
    n_keep = np.minimum((cum < top_p).sum(axis=1) + 1, keep.sum(axis=1))  # through the first reaching p
    ranks = np.empty_like(order)
    np.put_along_axis(ranks, order, np.arange(x.shape[1])[None].repeat(len(x), axis=0), axis=1)
    return ranks < n_keep[:, None]


def sample(p: np.ndarray, u: float) -> int:
    """The token at uniform draw u in [0, 1) by the inverse CDF of one distribution row."""
    c = np.cumsum(p)
    return int(min(np.searchsorted(c, u * c[-1], side="right"), len(p) - 1))
