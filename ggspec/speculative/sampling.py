"""Sampling settings and the target distribution they define (llama.cpp's meanings and defaults).

llama.cpp's default chain (common/common.h) applies, in this order: top-k, top-p, min-p, then the
temperature, and draws from the softmax of what is left. `distribution` computes that final
distribution for rows of logits, so the acceptance rule of speculative sampling (verifier.py) can
compare the target's p with the draft's q after the same transforms. Temperature <= 0 is greedy.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

import numpy as np

from ggspec.errors import InputError

DEFAULT_SEED = 0xFFFFFFFF  # llama.cpp's LLAMA_DEFAULT_SEED: "pick a random seed"


def concrete_seed(seed: int) -> int:
    """llama.cpp's default seed means a random one: drawn here, once, so it can be reported and reused."""
    return secrets.randbelow(DEFAULT_SEED) if seed == DEFAULT_SEED else seed


@dataclass(frozen=True)
class SamplerSettings:
    temp: float = 0.8
    top_k: int = 40  # <= 0: the whole vocabulary
    top_p: float = 0.95  # 1.0: off
    min_p: float = 0.05  # 0.0: off
    seed: int = DEFAULT_SEED
    # llama.cpp's samplers before top-k, which change logits by what came before (see `adjust`)
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token, bias); -inf: never that token
    penalty_last_n: int = 64  # the last n tokens (prompt included) penalties count; -1: all, 0: off
    penalty_repeat: float = 1.0  # 1.0: off
    penalty_freq: float = 0.0
    penalty_present: float = 0.0

    @property
    def greedy(self) -> bool:
        return self.temp <= 0

    @property
    def penalizes(self) -> bool:
        return self.penalty_last_n != 0 and (self.penalty_repeat != 1.0 or self.penalty_freq != 0.0
                                             or self.penalty_present != 0.0)

    @property
    def adjusts(self) -> bool:
        """Whether a row's logits depend on more than the row (bias, penalties): then each verify
        row is adjusted at its own position (`adjust`)."""
        return bool(self.logit_bias) or self.penalizes

    def validate(self) -> None:
        if not np.isfinite(self.temp):
            raise InputError(f"the temperature must be a finite number (got {self.temp})", field="temp")
        if not 0.0 <= self.top_p <= 1.0:
            raise InputError(f"top-p must be within 0..1 (got {self.top_p})", field="top_p")
        if not 0.0 <= self.min_p <= 1.0:
            raise InputError(f"min-p must be within 0..1 (got {self.min_p})", field="min_p")
        if not 0 <= self.seed <= 0xFFFFFFFF:
            raise InputError(f"the seed must be within 0..4294967295 (got {self.seed})", field="seed")
        if self.penalty_last_n < -1:
            raise InputError(f"the penalties' window must be -1 (everything), 0 (off) or more (got "
                             f"{self.penalty_last_n})", field="penalty_last_n")
        for name in ("penalty_repeat", "penalty_freq", "penalty_present"):
            if not np.isfinite(getattr(self, name)):
                raise InputError(f"{name} must be a finite number (got {getattr(self, name)})", field=name)


def adjust(row: np.ndarray, s: SamplerSettings, history: list[int]) -> np.ndarray:
    """A row of logits after llama.cpp's logit-bias and penalties samplers, in its order and its
    float32 arithmetic: each bias is added to its token's logit; then every token among the last
    `penalty_last_n` of `history` (the prompt and the tokens before this row) has its logit divided
    by the repeat penalty (multiplied where it is <= 0), then less count x frequency penalty and
    the presence penalty. A copy; the row itself is left alone."""
    x = np.array(row, dtype=np.float32)
    if s.logit_bias:
        ids, bias = zip(*s.logit_bias)
        np.add.at(x, np.asarray(ids), np.asarray(bias, dtype=np.float32))
    if s.penalizes:
        recent = history if s.penalty_last_n < 0 else history[-s.penalty_last_n:]
        ids, counts = np.unique(np.asarray(recent, dtype=np.int64), return_counts=True)
        v = x[ids]
        repeat = np.float32(s.penalty_repeat)
        v = np.where(v <= 0, v * repeat, v / repeat)
        c = counts.astype(np.float32)
        v -= c * np.float32(s.penalty_freq) + np.float32(s.penalty_present)
        x[ids] = v
    return x


@dataclass(frozen=True)
class Candidates:
    """Sampling distributions of several rows, kept sparse: row r draws token ids[r, j] with
    probability probs[r, j]; every token not listed has probability 0. Top-k keeps k columns, so a
    262k-entry vocabulary never becomes a dense row; entries the later samplers (top-p, min-p) cut
    stay listed with probability 0."""

    ids: np.ndarray  # (rows, k) token ids
    probs: np.ndarray  # (rows, k) float64, each row sums to 1

    def __len__(self) -> int:
        return len(self.ids)

    @classmethod
    def stack(cls, parts: list["Candidates"]) -> "Candidates":
        """The rows of several Candidates in order; narrower ones padded with id -1 (no token)
        at probability 0 (one-row top-p cuts differ in width)."""
        width = max(q.ids.shape[1] for q in parts)
        ids = np.full((sum(len(q) for q in parts), width), -1, dtype=parts[0].ids.dtype)
        probs = np.zeros(ids.shape, dtype=np.float64)
        r = 0
        for q in parts:
            ids[r:r + len(q), :q.ids.shape[1]], probs[r:r + len(q), :q.ids.shape[1]] = q.ids, q.probs
            r += len(q)
        return cls(ids, probs)

    def __getitem__(self, rows: int | slice) -> "Candidates":
        """Some rows (an int gives a one-row Candidates)."""
        if isinstance(rows, int):
            rows = slice(rows, rows + 1)
        return Candidates(self.ids[rows], self.probs[rows])

    def of_tokens(self, ids: np.ndarray) -> "Candidates":
        """These rows with column indices turned into token ids (a reduced head's columns,
        Context.logit_ids)."""
        return Candidates(ids[self.ids], self.probs)

    def prob(self, r: int, token: int) -> float:
        hit = np.flatnonzero(self.ids[r] == token)
        return float(self.probs[r, hit[0]]) if hit.size else 0.0

    def lookup(self, r: int, tokens: np.ndarray) -> np.ndarray:
        """Row r's probabilities of `tokens` (0 where not listed)."""
        order = np.argsort(self.ids[r])
        ids = self.ids[r][order]
        at = np.searchsorted(ids, tokens).clip(max=len(ids) - 1)
        return np.where(ids[at] == tokens, self.probs[r][order][at], 0.0)

    def sample(self, u: np.ndarray) -> np.ndarray:
        """One token per row by the inverse CDF at uniform draws u in [0, 1) (one per row)."""
        if len(self.ids) == 1:  # the common case (a verify row, a plain step): fewer numpy calls
            c = np.cumsum(self.probs[0])
            return self.ids[0, min(int(np.searchsorted(c, u[0] * c[-1], side="right")), len(c) - 1)][None]
        c = np.cumsum(self.probs, axis=1)
        at = np.count_nonzero(c <= (np.asarray(u, dtype=np.float64) * c[:, -1])[:, None], axis=1)
        return self.ids[np.arange(len(self.ids)), at.clip(max=self.ids.shape[1] - 1)]

    def residual(self, q: "Candidates | None", x: int) -> "Candidates":
        """norm(max(0, p - q)) of a one-row p (this) and q, on p's support (the only place it can
        be positive); q None is a point mass on token x. Where p <= q everywhere (p == q up to
        round-off) the draft cannot have been rejected: p itself."""
        ids, p = self.ids[0], self.probs[0]
        r = np.where(ids == x, 0.0, p) if q is None else np.maximum(p - q.lookup(0, ids), 0.0)
        return Candidates(self.ids, (r if r.sum() > 0 else p)[None])

    def dense(self, n_vocab: int) -> np.ndarray:
        out = np.zeros((len(self.ids), n_vocab + 1), dtype=np.float64)  # the padding (-1) lands in the last column
        np.put_along_axis(out, self.ids, self.probs, axis=1)
        return out[:, :n_vocab]


def candidates(logits: np.ndarray, s: SamplerSettings) -> Candidates:
    """The sampling distribution of every row of (rows, n_vocab) logits as Candidates: zero outside
    the tokens top-k, top-p and min-p keep (llama.cpp's order), softmax(logit / temp) inside. Greedy
    settings give a point mass on each row's argmax. All rows at once: one partition of the
    vocabulary, then work on the k candidates."""
    x = np.asarray(logits)
    x = x[None] if x.ndim == 1 else x
    rows, n = x.shape
    if rows == 1 and not s.greedy:
        return _candidates_row(x[0], s)
    if s.greedy:
        return Candidates(x.argmax(axis=1)[:, None], np.ones((rows, 1)))
    r = np.arange(rows)[:, None]  # row index for fancy indexing (take_along_axis is slower on small arrays)
    if 0 < s.top_k < n:
        ids = np.argpartition(x, n - s.top_k, axis=1)[:, n - s.top_k:]
        v = x[r, ids].astype(np.float64)
    else:
        ids = np.broadcast_to(np.arange(n), (rows, n))
        v = x.astype(np.float64)
    keep = np.ones(v.shape, dtype=bool)
    if s.top_p < 1.0:  # the most likely first, through the first whose cumulative mass reaches top_p
        order = np.argsort(-v, axis=1, kind="stable")
        ids, v = ids[r, order], v[r, order]
        cum = np.cumsum(np.exp(v - v[:, :1]), axis=1)
        keep = np.arange(v.shape[1]) <= np.count_nonzero(cum < s.top_p * cum[:, -1:], axis=1)[:, None]
    v_max = v.max(axis=1, keepdims=True)  # what top-p keeps always includes the maximum
    if s.min_p > 0.0:  # p_i >= min_p * p_max among what is left
        keep &= v >= v_max + np.log(s.min_p)
    p = np.where(keep, np.exp((v - v_max) / s.temp), 0.0)
    return Candidates(ids, p / p.sum(axis=1, keepdims=True))


def _candidates_row(x: np.ndarray, s: SamplerSettings) -> Candidates:
    """`candidates` of one row with as few numpy calls as it takes (every plain sampled token and
    every verify row goes through here): only the kept tokens are listed."""
    n = x.size
    if 0 < s.top_k < n:
        ids = np.argpartition(x, n - s.top_k)[n - s.top_k:]
        v = x[ids].astype(np.float64)
    else:
        ids, v = np.arange(n), x.astype(np.float64)
    if s.top_p < 1.0:
        order = np.argsort(-v, kind="stable")
        ids, v = ids[order], v[order]
        cum = np.cumsum(np.exp(v - v[0]))
        n_keep = int(np.searchsorted(cum, s.top_p * cum[-1])) + 1  # the first reaching top_p is kept
        ids, v = ids[:n_keep], v[:n_keep]
    v_max = v.max()
    if s.min_p > 0.0:
        keep = v >= v_max + np.log(s.min_p)
        ids, v = ids[keep], v[keep]
    p = np.exp((v - v_max) / s.temp)
    return Candidates(ids[None], (p / p.sum())[None])


def distribution(logits: np.ndarray, s: SamplerSettings) -> np.ndarray:
    """`candidates` as dense (rows, n_vocab) float64 rows (one row for 1-D logits): for checks
    and small vocabularies; the engine works on Candidates."""
    x = np.asarray(logits)
    dense = candidates(x, s).dense(x.shape[-1])
    return dense[0] if x.ndim == 1 else dense


def sample(p: np.ndarray, u: float) -> int:
    """The token at uniform draw u in [0, 1) by the inverse CDF of one dense distribution row."""
    c = np.cumsum(p)
    return int(min(np.searchsorted(c, u * c[-1], side="right"), len(p) - 1))
