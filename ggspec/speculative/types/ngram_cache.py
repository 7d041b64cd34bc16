"""llama.cpp's `ngram-cache` speculative type: drafts from counts of what followed each 1- to
4-token n-gram of the sequence so far (no draft model, no target features).

A port of common/ngram-cache.cpp (`common_ngram_cache_update`, `_draft`) as the pinned
`common_speculative_impl_ngram_cache` uses it (common/speculative.cpp:2024-2160), quirks kept:

- The context cache is updated once per draft call with the tokens committed since the last call
  (the whole prompt the first time, then the step's accepted tokens and id_last), and only n-grams
  lying wholly inside that chunk are counted: none spans two chunks.
- A draft grows one token at a time, up to 8 (llama.cpp's fixed n_draft, whatever
  --spec-draft-n-max says; the engine cuts it), from the longest of the last 4..1 tokens whose
  counts are convincing: at least 2, 2, 1, 1 occurrences (n-gram sizes 1..4) and the most frequent
  continuation holding at least 66, 50, 50, 50 % of them.
- llama.cpp's optional static and dynamic caches (-lcs / -lcd files of its lookup tools) are not
  read: every sequence drafts from its own context cache only, made fresh when it starts (a slot
  of llama-server keeps its previous request's cache; llama-speculative-simple starts afresh).

Ties: llama.cpp takes the first continuation, in `std::unordered_map` iteration order, among those
with the largest count. Its thresholds let a tie through only when an n-gram has exactly two
continuations with equal counts (each then holds 50 %), and a two-entry map iterates the entry
inserted second first (libstdc++: a new node goes to the front of the list; the copy llama.cpp
makes keeps that order): so the continuation seen first later wins. That rule is ported; it is the
standard library's behaviour, not a documented one (another library could order them otherwise).
`ties` counts the drafted tokens a tie decided.
"""

from __future__ import annotations

import numpy as np

from ggspec.speculative.proposer import Draft, Proposer
from ggspec.speculative.sequence import Sequence
from ggspec.speculative.types.draft_type import TEXT_TRAITS, DraftType

NGRAM_MIN, NGRAM_MAX = 1, 4  # LLAMA_NGRAM_MIN, LLAMA_NGRAM_MAX
N_DRAFT = 8  # create_state_ngram_cache: "uint16_t n_draft = 8; // TODO get from config?"
# draft_min_sample_size_lax / draft_min_percent_lax, by n-gram size 1..4
MIN_SAMPLES = (2, 2, 1, 1)
MIN_PERCENT = (66, 50, 50, 50)

_EMPTY = np.empty(0, dtype=np.int32)


class NgramCache:
    """One sequence's context cache: n-gram (1..4 tokens) -> {next token: count}, in the order
    each next token was first seen."""

    def __init__(self) -> None:
        self.parts: dict[tuple[int, ...], dict[int, int]] = {}
        self.size = 0  # tokens of the sequence counted so far
        self.ties = 0  # drafted tokens a tie between two continuations decided

    def update(self, chunk: list[int]) -> None:
        """common_ngram_cache_update over one chunk: the n-grams inside it and what follows them."""
        for n in range(NGRAM_MIN, NGRAM_MAX + 1):
            for i in range(n, len(chunk)):
                part = self.parts.setdefault(tuple(chunk[i - n:i]), {})
                part[chunk[i]] = part.get(chunk[i], 0) + 1

    def draft(self, inp: list[int], n_draft: int = N_DRAFT) -> list[int]:
        """common_ngram_cache_draft from `inp` (the sequence up to and with id_last)."""
        if len(inp) < 2:  # LLAMA_NGRAM_STATIC
            return []
        out: list[int] = []
        tail = list(inp[-NGRAM_MAX:])
        while len(out) < n_draft:
            token = self._next(tail)
            if token is None:
                break
            out.append(token)
            tail = tail[1:] + [token] if len(tail) == NGRAM_MAX else tail + [token]
        return out

    def _next(self, tail: list[int]) -> int | None:
        """The drafted token after `tail`, from the longest convincing n-gram."""
        for n in range(min(NGRAM_MAX, len(tail)), NGRAM_MIN - 1, -1):
            part = self.parts.get(tuple(tail[-n:]))
            if part is None:
                continue
            counts = list(part.values())
            best, total = max(counts), sum(counts)
            if total < MIN_SAMPLES[n - 1] or 100 * best < MIN_PERCENT[n - 1] * total:
                continue
            winners = [t for t, c in part.items() if c == best]
            if len(winners) > 1:
                self.ties += 1
            return winners[-1]  # (a tie: two continuations, the one seen first later; module docstring)
        return None


class NgramCacheProposer(Proposer):
    """Drafts from each sequence's own n-gram cache (llama.cpp's `ngram-cache`). Drafts are point
    masses and may be empty."""

    name = "ngram-cache"
    max_draft: int | None = N_DRAFT

    def __init__(self) -> None:
        self._caches: dict[Sequence, NgramCache] = {}
        self.ties = 0  # drafted tokens a tie decided, over the sequences that left

    def begin(self, seq: Sequence, cached: int = 0) -> None:
        self._caches[seq] = NgramCache()

    def propose(self, seqs: list[Sequence], n: int) -> list[Draft]:
        # nothing to draft from before a sequence's prompt is decoded
        return [Draft(self._draft_one(seq, n)) if seq.started else Draft.empty() for seq in seqs]

    def _draft_one(self, seq: Sequence, n: int) -> np.ndarray:
        cache = self._caches.get(seq)
        if cache is None:  # (a sequence added without begin)
            cache = self._caches[seq] = NgramCache()
        inp = seq.history[:seq.pos + 1]  # up to and with id_last
        if cache.size < len(inp):
            cache.update(inp[cache.size:])
            cache.size = len(inp)
        d = cache.draft(inp, min(n, N_DRAFT))
        return np.asarray(d, dtype=np.int32) if d else _EMPTY

    def release(self, seq: Sequence, keep: int = 0) -> int:
        cache = self._caches.pop(seq, None)
        if cache is not None:
            self.ties += cache.ties
        return keep  # it holds nothing of a sequence's positions

    def close(self) -> None:
        self._caches.clear()


# --- the registry entry ----------------------------------------------------------------------------

NGRAM_CACHE = DraftType(
    name="ngram-cache", priority=4, traits=TEXT_TRAITS, make=lambda b: NgramCacheProposer(),
    own_n_max=lambda o: N_DRAFT, fixed_length=N_DRAFT)  # llama.cpp's fixed n_draft
TYPES = (NGRAM_CACHE,)
