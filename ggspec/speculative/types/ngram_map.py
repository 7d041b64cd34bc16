"""llama.cpp's `ngram-map-k` and `ngram-map-k4v` speculative types: drafts from a per-sequence map
of the history's repeated n-grams (no draft model, no target features).

A port of common/ngram-map.cpp of the pinned tree (`common_ngram_map_begin`, `_draft`, `_accept`),
kept rule for rule, quirks included:

- The key is the last size_n tokens of the history H = [tokens..., id_last] (llama.cpp passes
  `inp` = H without id_last and `sampled` = id_last). It is looked up first through a 2^18-entry
  hash table (`h = h * 2654435761 + token`, 32 bits) of n-gram start indices, then by backward
  scans over the part of the history the table has not indexed yet. Start 0 never counts ("0 = no
  match"), and a start must leave size_m + 1 tokens after the key.
- The table is filled with each newly covered start, descending, and an occupied entry is never
  overwritten: a hash whose n-gram occurs several times keeps the start indexed first, which is
  the most recent start of the first range indexed, not the most recent one overall.
- ngram-map-k (key only): the draft is the min(size_m, n_accepted) tokens after the match, where
  n_accepted is what the key's last draft got accepted (size_m for a new key): a key whose draft
  was wholly rejected drafts nothing again.
- ngram-map-k4v: each key keeps up to 4 distinct continuations (m-grams) with their counts, counted
  over [stat_idx, match_pos] (stat_idx: the last match, so that occurrence is counted again next
  time); it drafts only after min_hits hits of the key and when the most frequent continuation
  occurs at least twice as often as all others together, and then (quirk) drafts the tokens after
  the *current* match, not that continuation.
- Counts saturate at 16380; a draft is cut to the budget by the caller.

One map per sequence, made fresh when the sequence starts (llama-speculative-simple runs one
request per map; a reused slot does not inherit the previous request's keys, so a request drafts
as it would alone).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from ggspec.errors import InputError
from ggspec.speculative.proposer import Draft, Proposer
from ggspec.speculative.sequence import Sequence
from ggspec.speculative.types.draft_type import TEXT_TRAITS, DraftType, Options, option
from ggspec.speculative.types.ngram import SIZE_LIMIT, _History, split_history

MAX_VALUES = 4  # COMMON_NGRAM_MAX_VALUES: continuations kept per key
MAX_VALUE_COUNT = 16380  # COMMON_NGRAM_MAX_VALUE_COUNT: counts saturate here
HASH_MAP_SIZE = 262144  # COMMON_NGRAM_HASH_MAP_SIZE
LCG_FACTOR = 2654435761
DEFAULT_SIZE_N, DEFAULT_SIZE_M, DEFAULT_MIN_HITS = 12, 48, 1  # common_params_speculative_ngram_map

_EMPTY = np.empty(0, dtype=np.int32)


def ngram_hash(tokens, start: int, n: int) -> int:
    """common_ngram_map_hash: the 32-bit LCG hash of tokens[start:start + n]."""
    h = 0
    for i in range(n):
        h = (h * LCG_FACTOR + int(tokens[start + i])) & 0xFFFFFFFF
    return h


@dataclass
class _Value:
    idx: int = 0  # start of the continuation in the history (0: an unused slot)
    num: int = 0  # its occurrences after the key
    n_accepted: int = -1  # accepted tokens of the key's last draft from this slot


@dataclass
class _Key:
    idx: int  # start of the key n-gram in the history
    stat_idx: int = 0  # where the continuation counts were last brought up to date
    num: int = 0  # the key's hits
    values: list[_Value] = field(default_factory=list)


class NgramMap:
    """One sequence's map (llama.cpp's `common_ngram_map`)."""

    def __init__(self, size_n: int, size_m: int, key_only: bool, min_hits: int) -> None:
        self.n, self.m, self.key_only, self.min_hits = size_n, size_m, key_only, min_hits
        self.keys: list[_Key] = []
        self.key_map = np.zeros(HASH_MAP_SIZE, dtype=np.uint32)
        self.key_map_last_idx = 0
        self.size_last_begin = 0
        self.idx_last_check = 0
        self.last_draft: tuple[int, int] | None = None  # (key offset, value slot) of the last draft

    def begin(self, tokens) -> None:
        """common_ngram_map_begin with `tokens` = the prompt without its last token, on a fresh map
        (each sequence gets its own): it only records where the prompt ends. (llama.cpp's clean-up
        of keys past a shorter new beginning applies to a map begun again, which never happens here.)"""
        assert not self.keys and self.idx_last_check == 0, "a map is begun once"
        self.idx_last_check = self.size_last_begin = len(tokens)

    # --- drafting ---------------------------------------------------------------------------------

    def draft(self, inp: np.ndarray, sampled: int) -> np.ndarray:
        """common_ngram_map_draft: the tokens to draft after `sampled`, from `inp` (the history
        before it)."""
        self.last_draft = None
        n, m, cur_len = self.n, self.m, len(inp)
        if cur_len < 2 * n + m:
            return _EMPTY
        self.idx_last_check = cur_len
        key = [int(t) for t in inp[cur_len - n + 1:]] + [int(sampled)]
        match_pos = self._lookup(inp, key, cur_len)
        self._index(inp, cur_len)
        if match_pos == 0:
            return _EMPTY
        offset = next((i for i, k in enumerate(self.keys) if self._at(inp, k.idx, key)), None)
        if offset is None:
            offset = len(self.keys)
            self.keys.append(_Key(match_pos, values=[_Value(0, 0, m) for _ in range(MAX_VALUES)]))
        cur = self.keys[offset]
        cur.num = min(cur.num + 1, MAX_VALUE_COUNT)
        if self.key_only:
            self.last_draft = (offset, 0)
            return inp[match_pos + n:match_pos + n + min(m, cur.values[0].n_accepted)].copy()
        if cur.num < self.min_hits:
            return _EMPTY
        self._count_values(inp, cur, key, match_pos)
        counts = [v.num for v in cur.values]
        best = max(range(MAX_VALUES), key=lambda v: (counts[v], -v))  # the first of the largest
        others = sum(counts) - counts[best]
        if others > 0 and counts[best] < 2 * others:
            return _EMPTY  # no clear winner among the continuations
        self.last_draft = (offset, best)
        # (quirk) the tokens after the current match, not the winning continuation's
        return inp[match_pos + n:match_pos + n + min(m, cur.values[best].n_accepted)].copy()

    def accept(self, n_accepted: int) -> None:
        """common_ngram_map_accept: the last draft's key (and slot) drafts at most this many next time."""
        if self.last_draft is not None:
            offset, slot = self.last_draft
            self.keys[offset].values[slot].n_accepted = n_accepted

    @staticmethod
    def _at(inp: np.ndarray, start: int, key: list[int]) -> bool:
        return all(int(inp[start + k]) == key[k] for k in range(len(key)))

    def _lookup(self, inp: np.ndarray, key: list[int], cur_len: int) -> int:
        """The key's start in the history through the hash table, else the backward scans over
        what the table has not indexed yet; 0 when not found."""
        n, m = self.n, self.m
        idx = int(self.key_map[ngram_hash(key, 0, n) % HASH_MAP_SIZE])
        if idx != 0 and idx < cur_len - n - m - 1 and self._at(inp, idx, key):
            return idx
        if self.size_last_begin > n + m + 1:
            for j in range(self.size_last_begin - n - m - 1, self.key_map_last_idx, -1):
                if self._at(inp, j, key):
                    return j
        for j in range(cur_len - n - m - 1, max(self.size_last_begin, self.key_map_last_idx), -1):
            if self._at(inp, j, key):
                return j
        return 0

    def _index(self, inp: np.ndarray, cur_len: int) -> None:
        """Add the newly covered n-gram starts to the hash table, in the lookup's order."""
        n, m = self.n, self.m
        ranges = []
        if self.size_last_begin > n + m + 1:
            ranges.append(range(self.size_last_begin - n - m - 1, self.key_map_last_idx, -1))
        ranges.append(range(cur_len - n - m - 1, max(self.size_last_begin, self.key_map_last_idx), -1))
        key_map = self.key_map
        for r in ranges:
            for j in r:
                h = ngram_hash(inp, j, n) % HASH_MAP_SIZE
                if key_map[h] == 0:
                    key_map[h] = j
        self.key_map_last_idx = max(cur_len - n - m - 1, self.key_map_last_idx)

    def _count_values(self, inp: np.ndarray, cur: _Key, key: list[int], match_pos: int) -> None:
        """Count the continuations after every occurrence of the key in [stat_idx, match_pos]."""
        n, m = self.n, self.m
        for i in range(cur.stat_idx, match_pos + 1):
            if not self._at(inp, i, key):
                continue
            start = i + n
            slot = -1
            for v, value in enumerate(cur.values):
                if value.idx == 0:  # a new continuation
                    cur.values[v] = _Value(start, 0, m)
                    slot = v
                    break
                if all(inp[start + j] == inp[value.idx + j] for j in range(m)):
                    slot = v
                    break
            if slot >= 0:
                cur.values[slot].num = min(cur.values[slot].num + 1, MAX_VALUE_COUNT)
        cur.stat_idx = match_pos


class NgramMapProposer(Proposer):
    """Drafts from each sequence's own n-gram map (llama.cpp's `ngram-map-k`, `ngram-map-k4v`).
    Drafts are point masses and may be empty."""

    def __init__(self, key_only: bool, size_n: int = DEFAULT_SIZE_N, size_m: int = DEFAULT_SIZE_M,
                 min_hits: int = DEFAULT_MIN_HITS) -> None:
        self.name = "ngram-map-k" if key_only else "ngram-map-k4v"
        for what, v, hi in (("size_n", size_n, SIZE_LIMIT), ("size_m", size_m, SIZE_LIMIT), ("min_hits", min_hits, None)):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1 or (hi is not None and v > hi):
                bound = f"1..{hi}" if hi else "at least 1"
                raise InputError(f"{self.name} {what} must be an integer {bound}, got {v!r}", field=f"ngram_{what}")
        self.key_only, self.size_n, self.size_m, self.min_hits = key_only, int(size_n), int(size_m), int(min_hits)
        self.max_draft: int | None = self.size_m
        self._maps: dict[Sequence, NgramMap] = {}
        self._hist: dict[Sequence, _History] = {}
        self._drafted: set[Sequence] = set()  # sequences whose map drafted this step

    def begin(self, seq: Sequence, cached: int = 0) -> None:
        m = self._maps[seq] = NgramMap(self.size_n, self.size_m, self.key_only, self.min_hits)
        m.begin(seq.prompt[:-1])
        self._hist[seq] = _History()

    def commit(self, seq: Sequence, pos0: int, n_committed: int, other: bool = False) -> None:
        if seq in self._drafted:  # llama.cpp's accept after every verify of a drafting step
            self._drafted.discard(seq)
            if not other:  # (another type's draft: llama.cpp's is_other, ignored)
                self._maps[seq].accept(n_committed - 1)

    def propose(self, seqs: list[Sequence], n: int) -> list[Draft]:
        # nothing to draft from before a sequence's prompt is decoded
        return [Draft(self._draft_one(seq)[:n]) if seq.started else Draft.empty() for seq in seqs]

    def _draft_one(self, seq: Sequence) -> np.ndarray:
        if seq not in self._maps:  # (a sequence added without begin: start its map now)
            self.begin(seq)
        hist, extra = split_history(seq)
        full = self._hist[seq].sync(hist, extra)
        self._drafted.add(seq)
        return self._maps[seq].draft(full[:-1], int(full[-1])) if len(full) else _EMPTY

    def release(self, seq: Sequence, keep: int = 0) -> int:
        self._maps.pop(seq, None)
        self._hist.pop(seq, None)
        self._drafted.discard(seq)
        return keep  # it holds nothing of a sequence's positions

    def close(self) -> None:
        self._maps.clear()
        self._hist.clear()


# --- the registry entries --------------------------------------------------------------------------

@dataclass(frozen=True)
class NgramMapOptions(Options):
    """llama.cpp has one set per map type; ggspec runs one map type at a time, so both share these."""

    size_n: int = option(DEFAULT_SIZE_N, "ngram_map_size_n", ("--spec-ngram-map-k-size-n", "--spec-ngram-map-k4v-size-n"),
                         "ngram-map-k / ngram-map-k4v: the length of the key n-gram looked up in the text.")
    size_m: int = option(DEFAULT_SIZE_M, "ngram_map_size_m", ("--spec-ngram-map-k-size-m", "--spec-ngram-map-k4v-size-m"),
                         "ngram-map-k / ngram-map-k4v: the most tokens one lookup drafts (then cut to --spec-draft-n-max).")
    min_hits: int = option(DEFAULT_MIN_HITS, "ngram_map_min_hits",
                           ("--spec-ngram-map-k4v-min-hits", "--spec-ngram-map-k-min-hits"),
                           "ngram-map-k4v: hits of a key before it drafts (ngram-map-k drafts from the first, as "
                           "llama.cpp's).", high=None)

    def validate(self) -> None:
        super().validate()
        if self.min_hits < 1:
            raise InputError(f"the n-gram map's minimum hits must be at least 1 (got {self.min_hits})",
                             field="ngram_map_min_hits")

    def with_length(self, n_max: int) -> "NgramMapOptions":
        return replace(self, size_m=n_max)


def _llama_args(name: str):
    flag = f"--spec-{name}"  # --spec-ngram-map-k, --spec-ngram-map-k4v

    def args(o: NgramMapOptions | None, n_max: int) -> list[str]:
        """llama.cpp's m-gram size is its draft length (n_max when no options are given)."""
        if o is None:
            return [f"{flag}-size-m", str(n_max)]
        return [f"{flag}-size-m", str(o.size_m), f"{flag}-size-n", str(o.size_n), f"{flag}-min-hits", str(o.min_hits)]
    return args


def _entry(name: str, priority: int, key_only: bool) -> DraftType:
    return DraftType(
        name=name, priority=priority, traits=TEXT_TRAITS, options=NgramMapOptions,
        make=lambda b: NgramMapProposer(key_only, b.options.size_n, b.options.size_m, b.options.min_hits),
        own_n_max=lambda o: o.size_m, llama_args=_llama_args(name))


TYPES = (_entry("ngram-map-k", 1, True), _entry("ngram-map-k4v", 2, False))
