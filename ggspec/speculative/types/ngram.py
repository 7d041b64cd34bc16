"""The n-gram proposer: llama.cpp's `ngram-simple` speculative type, drafting from the sequence's
own history (no draft model, no target features).

The algorithm (common/ngram-map.cpp `common_ngram_simple_draft` of the pinned tree), on the
committed history H = [h0 .. hL-1, id_last] (llama.cpp passes `tokens` = H without id_last, and
`sampled` = id_last):
  1. nothing unless L > size_n + size_m + 1;
  2. the pattern is the last size_n tokens of H (the last size_n - 1 of `tokens`, then id_last);
  3. it is searched for in `tokens` at start positions j = L - size_n - 1 down to 1: the most
     recent occurrence wins; start 0 is never tried, nor start L - size_n (the occurrence that
     overlaps the pattern shifted by one token);
  4. only that first (most recent) occurrence counts: the draft is what follows it in `tokens`,
     `tokens[j + size_n : j + size_n + k]` with k = min(size_m, L - j - size_n), and nothing at all
     when k < size_n (an older, longer continuation is not looked for).
So in a stretch that repeats with a period of p tokens the draft is p - 1 tokens long (capped at
size_m), and nothing once p <= size_n. `min_hits` is not used by this type. llama.cpp's defaults
(common/common.h `common_params_speculative_ngram_map`): size_n 12, size_m 48; its loop then cuts a
draft to the remaining context/budget (speculative-simple: n_max = min(n_ctx - n_past - 2,
n_predict - n_generated - 1), applied only when it is > 0).

llama.cpp's search is a backward scan, O(L * size_n) per step in the worst case and O(size_n) when
the match is recent. Here the same scan runs on numpy windows of start positions, the most recent
window first (1024 starts, then 4x wider each time): a vectorised comparison with id_last, then
the surviving candidates are checked against the rest of the pattern. A recent match costs tens
of microseconds whatever the history's length; no match costs O(L). Each sequence's history is
kept in a growing int32 buffer, so a step only converts its newly committed tokens.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from dataclasses import dataclass, replace

import numpy as np

from ggspec.errors import InputError
from ggspec.speculative.proposer import Draft, Proposer
from ggspec.speculative.sequence import Sequence
from ggspec.speculative.types.draft_type import SIZE_LIMIT, TEXT_TRAITS, DraftType, Options, option

DEFAULT_SIZE_N = 12  # --spec-ngram-simple-size-n: the looked-up n-gram's length
DEFAULT_SIZE_M = 48  # --spec-ngram-simple-size-m: the most tokens one draft holds

_EMPTY = np.empty(0, dtype=np.int32)


def ngram_simple_draft(tokens: Seq[int] | np.ndarray, sampled: int,
                       size_n: int = DEFAULT_SIZE_N, size_m: int = DEFAULT_SIZE_M) -> np.ndarray:
    """llama.cpp's `common_ngram_simple_draft`: the draft (int32, possibly empty) that follows
    `sampled` (id_last), from `tokens` = the committed history *before* id_last (prompt + generated
    tokens, without id_last). See the module docstring for the rules."""
    t = np.asarray(tokens)
    if t.dtype != np.int32:
        t = t.astype(np.int32)
    n, m, L = int(size_n), int(size_m), len(t)
    if n < 1 or m < 1:
        raise ValueError(f"ngram sizes must be >= 1 (size_n {n}, size_m {m})")
    if L <= n + m + 1:
        return _EMPTY.copy()
    # candidate starts j in 1..L-n-1, searched from the most recent down in windows (an early
    # match ends the search, as llama.cpp's backward scan does)
    pat = t[L - n + 1:]  # pattern[:-1]; pattern[-1] = sampled
    hi = L - n  # window: starts [lo, hi)
    width = 1024
    while hi > 1:
        lo = max(1, hi - width)
        j = _matches(t, lo, hi, n, pat, sampled)
        if len(j):
            break
        hi, width = lo, width * 4
    else:
        return _EMPTY.copy()
    start = int(j[-1]) + n  # the most recent occurrence wins
    k = min(m, L - start)
    if k < n:
        return _EMPTY.copy()
    return t[start:start + k].copy()


def _matches(t: np.ndarray, lo: int, hi: int, n: int, pat: np.ndarray, sampled: int) -> np.ndarray:
    """The starts j in [lo, hi) where t[j : j + n] == pat + [sampled], ascending."""
    j = np.flatnonzero(t[lo + n - 1:hi + n - 1] == sampled) + lo  # the last token first
    k = n - 2
    while k >= 0 and len(j) > 32:  # many candidates: filter token by token
        j = j[t[j + k] == pat[k]]
        k -= 1
    if k >= 0 and len(j):  # few: the remaining tokens of all candidates in one gather
        ks = np.arange(k + 1)
        j = j[(t[j[:, None] + ks] == pat[:k + 1]).all(axis=1)]
    return j


class _History:
    """One sequence's committed history H (id_last included) in a growing int32 buffer."""

    __slots__ = ("buf", "n")

    def __init__(self) -> None:
        self.buf = np.empty(256, dtype=np.int32)
        self.n = 0

    def sync(self, hist: list[int], id_last: int | None) -> np.ndarray:
        """The buffer made equal to hist (+ id_last when given); hist is expected to only grow,
        anything else (a shorter or rewritten history) is copied again from the start."""
        want = len(hist) + (id_last is not None)
        n = self.n
        if n > want or (n and (n > len(hist) or self.buf[n - 1] != hist[n - 1])):
            n = 0
        if want > len(self.buf):
            grown = np.empty(max(want, 2 * len(self.buf)), dtype=np.int32)
            grown[:n] = self.buf[:n]
            self.buf = grown
        if len(hist) > n:
            self.buf[n:len(hist)] = hist[n:]
        if id_last is not None:
            self.buf[len(hist)] = id_last
        # id_last appended here is not part of `hist`: the next sync compares and overwrites it
        self.n = len(hist)
        return self.buf[:want]


def split_history(seq: Sequence) -> tuple[list[int], int | None]:
    """(history, id_last to append or None) for a started sequence.

    `Sequence.history` holds the prompt and the committed tokens; id_last is the last committed
    token. When history already ends with it (len(history) == len(prompt) + len(tokens), the
    invariant of sequence.py) nothing is appended; when the engine has not appended it yet
    (one short), id_last is appended. Otherwise, id_last is appended unless history ends with it."""
    hist = seq.history
    n_full = len(seq.prompt) + len(seq.tokens)
    if len(hist) == n_full and seq.tokens:
        return hist, None
    if len(hist) == n_full - 1:
        return hist, seq.id_last
    return hist, (None if hist and hist[-1] == seq.id_last else seq.id_last)


class NgramProposer(Proposer):
    """Drafts from each sequence's own history (llama.cpp's `ngram-simple`): no model, no target
    features, so begin/observe/commit/flush/close do nothing. Drafts are point masses (probs None)
    and may be empty (no usable match)."""

    name = "ngram-simple"

    def __init__(self, size_n: int = DEFAULT_SIZE_N, size_m: int = DEFAULT_SIZE_M) -> None:
        for field, v in (("size_n", size_n), ("size_m", size_m)):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not 1 <= v <= SIZE_LIMIT:
                raise InputError(f"ngram-simple {field} must be an integer in 1..{SIZE_LIMIT}, got {v!r}",
                                 field=f"ngram_{field}")
        self.size_n = int(size_n)
        self.size_m = int(size_m)
        self.max_draft: int | None = self.size_m  # llama.cpp's n_max for this type
        self._hist: dict[Sequence, _History] = {}

    def draft_one(self, seq: Sequence, n: int) -> np.ndarray:
        """One sequence's draft, at most n tokens (n <= 0: none). llama.cpp's loop differs at the
        budget's end: there its n_max reaches 0 and a 0 means "no cut", so it verifies a whole
        draft and overshoots -n; the engine that calls this decides which to follow."""
        if n <= 0 or not seq.started:
            return _EMPTY.copy()
        hist, extra = split_history(seq)
        h = self._hist.get(seq)
        if h is None:
            h = self._hist[seq] = _History()
        full = h.sync(hist, extra)
        if len(full) == 0:
            return _EMPTY.copy()
        d = ngram_simple_draft(full[:-1], int(full[-1]), self.size_n, self.size_m)
        return d[:n] if len(d) > n else d

    def propose(self, seqs: list[Sequence], n: int) -> list[Draft]:
        return [Draft(self.draft_one(s, n)) for s in seqs]

    def release(self, seq: Sequence, keep: int = 0) -> int:
        self._hist.pop(seq, None)
        return keep  # it holds nothing of a sequence's positions: the target's cells decide

    def close(self) -> None:
        self._hist.clear()


# --- the registry entry ----------------------------------------------------------------------------

@dataclass(frozen=True)
class NgramSimpleOptions(Options):
    size_n: int = option(DEFAULT_SIZE_N, "ngram_size_n", ("--spec-ngram-simple-size-n",),
                         "ngram-simple: the length of the n-gram looked up in the text.")
    size_m: int = option(DEFAULT_SIZE_M, "ngram_size_m", ("--spec-ngram-simple-size-m",),
                         "ngram-simple: the most tokens one lookup drafts (then cut to --spec-draft-n-max).")

    def with_length(self, n_max: int) -> "NgramSimpleOptions":
        return replace(self, size_m=n_max)


def _llama_args(o: NgramSimpleOptions | None, n_max: int) -> list[str]:
    """llama.cpp's m-gram size is its draft length (n_max when no options are given)."""
    if o is None:
        return ["--spec-ngram-simple-size-m", str(n_max)]
    return ["--spec-ngram-simple-size-m", str(o.size_m), "--spec-ngram-simple-size-n", str(o.size_n)]


NGRAM_SIMPLE = DraftType(
    name="ngram-simple", priority=0, traits=TEXT_TRAITS, options=NgramSimpleOptions,
    make=lambda b: NgramProposer(b.options.size_n, b.options.size_m),
    own_n_max=lambda o: o.size_m, llama_args=_llama_args)
TYPES = (NGRAM_SIMPLE,)
