"""llama.cpp's `ngram-mod` speculative type: drafts by chaining lookups in one hashed table of
"n-gram -> next token" shared by every sequence (no draft model, no target features).

A port of common/ngram-mod.cpp and `common_speculative_impl_ngram_mod` (common/speculative.cpp)
of the pinned tree, rule for rule:

- The table has 4,194,304 entries (a token id, or -1); an n-gram's entry is
  `sum(t_i * 6364136223846793005^(n-1-i)) mod 2^64 mod 4194304` (the 64-bit polynomial hash; the
  table size is 2^22, so only the low 22 bits matter and they are computed exactly here). Adding an
  n-gram writes the token after it: the last writer wins, collisions included.
- A sequence's prompt (without its last token) is added when it starts, then its history in
  chunks: only once more than 32 tokens have been added since the last time.
- A draft starts from the last n tokens (id_last included) and looks up up to n_max tokens, each
  one appended to the window for the next lookup; an empty entry ends it, and a draft shorter than
  n_min is dropped (defaults n_match 24, n_max 64, n_min 48).
- After each verify of a draft, a sequence whose accepted share is below 1/4 five times in a row
  empties the table (for every sequence: it is shared); when a sequence starts, the table is
  emptied if more than a quarter of it is in use. A slot's low-acceptance streak outlives its
  request while others run (llama.cpp resets only the fill position and last draft length).

Across requests: llama-server keeps the table for the server's life, so a request drafts from what
earlier ones added (a repeated prompt is drafted almost whole). With `keep_table` (what `ggspec
serve` uses) so does this one. Without it (run, bench) the sequences that run together share the
table, but a sequence that starts while none is running starts from an empty table (and no
streaks): requests one after another draft as each would alone, which is what
llama-speculative-simple does for its one request (and what `bench --native` compares with).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ggspec.errors import InputError
from ggspec.speculative.proposer import Draft, Proposer
from ggspec.speculative.sequence import Sequence
from ggspec.speculative.types.draft_type import TEXT_TRAITS, DraftType, Options, option
from ggspec.speculative.types.ngram import SIZE_LIMIT, _History, split_history

TABLE_SIZE = 4 * 1024 * 1024  # entries (llama.cpp: 4*1024*1024); a power of two
HASH_FACTOR = 6364136223846793005
EMPTY = -1
DEFAULT_N_MATCH, DEFAULT_N_MAX, DEFAULT_N_MIN = 24, 64, 48  # common_params_speculative_ngram_mod
_MASK = TABLE_SIZE - 1
_EMPTY_DRAFT = np.empty(0, dtype=np.int32)


class NgramTable:
    """llama.cpp's `common_ngram_mod`: n-gram hash -> the token that followed it last."""

    def __init__(self, n: int, size: int = TABLE_SIZE) -> None:
        assert size & (size - 1) == 0, "the table size must be a power of two"
        self.n, self.size = n, size
        self.entries = np.full(size, EMPTY, dtype=np.int32)
        self.used = 0
        # factor^(n-1-i) modulo the table size: the hash of a window is its dot product with these
        mask = size - 1
        self._powers = np.array([pow(HASH_FACTOR, n - 1 - i, 1 << 64) & mask for i in range(n)], dtype=np.int64)

    def index(self, window) -> int:
        """The entry of one n-token window."""
        return int(sum(int(t) * int(p) for t, p in zip(window, self._powers)) & (self.size - 1))

    def indices(self, tokens: np.ndarray, starts: np.ndarray) -> np.ndarray:
        """The entries of the windows tokens[s : s + n] for every start s (vectorised)."""
        mask = self.size - 1
        acc = np.zeros(len(starts), dtype=np.int64)
        for i in range(self.n):  # products of two 22-bit values: exact in int64
            acc = (acc + tokens[starts + i].astype(np.int64) * self._powers[i]) & mask
        return acc

    def add_range(self, tokens: np.ndarray, lo: int, hi: int) -> None:
        """add() for the windows starting at lo..hi-1, in order (a later start overwrites)."""
        if hi <= lo:
            return
        starts = np.arange(lo, hi)
        idx = self.indices(tokens, starts)
        # in order, the last writer wins: keep each index's last occurrence
        last = len(idx) - 1 - np.unique(idx[::-1], return_index=True)[1]
        idx, values = idx[last], tokens[starts[last] + self.n]
        self.used += int(np.count_nonzero(self.entries[idx] == EMPTY))
        self.entries[idx] = values

    def get(self, window) -> int:
        return int(self.entries[self.index(window)])

    def reset(self) -> None:
        self.entries.fill(EMPTY)
        self.used = 0


class _SeqInfo:
    __slots__ = ("i_last", "n_draft_last", "n_low")

    def __init__(self) -> None:
        self.i_last = 0  # the history added to the table so far (windows starting before it)
        self.n_draft_last = 0  # the last draft's length (0: none)
        self.n_low = 0  # verifies in a row that accepted less than a quarter of the draft


class NgramModProposer(Proposer):
    """Drafts from one table shared by all sequences (llama.cpp's `ngram-mod`). Drafts are point
    masses and may be empty."""

    name = "ngram-mod"

    def __init__(self, n_match: int = DEFAULT_N_MATCH, n_max: int = DEFAULT_N_MAX, n_min: int = DEFAULT_N_MIN,
                 keep_table: bool = False) -> None:
        """`keep_table`: the table outlives the requests, as llama-server's (module docstring)."""
        for what, v in (("n_match", n_match), ("n_max", n_max), ("n_min", n_min)):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not 1 <= v <= SIZE_LIMIT:
                raise InputError(f"ngram-mod {what} must be an integer in 1..{SIZE_LIMIT}, got {v!r}",
                                 field=f"ngram_mod_{what}")
        if n_min > n_max:
            raise InputError(f"ngram-mod n_min {n_min} is above n_max {n_max}: it would never draft",
                             field="ngram_mod_n_min")
        self.n, self.n_max, self.n_min = int(n_match), int(n_max), int(n_min)
        self.max_draft: int | None = self.n_max
        self.table = NgramTable(self.n)
        self.keep_table = keep_table
        self._info: dict[int, _SeqInfo] = {}  # per slot: its streak outlives the request (see the module)
        self._hist: dict[Sequence, _History] = {}
        self._drafted: set[Sequence] = set()

    def begin(self, seq: Sequence, cached: int = 0) -> None:
        if not self._hist and not self.keep_table:  # nothing running: start afresh (module docstring)
            self.table.reset()
            self._info.clear()
        info = self._info.setdefault(seq.seq_id, _SeqInfo())
        info.i_last = info.n_draft_last = 0
        self._hist[seq] = _History()
        prompt = np.asarray(seq.prompt[:-1], dtype=np.int32)
        if len(prompt) < self.n:
            return
        self.table.add_range(prompt, 0, len(prompt) - self.n)
        info.i_last = len(prompt) - self.n
        if self.table.used / self.table.size > 0.25:
            self.table.reset()

    def commit(self, seq: Sequence, pos0: int, n_committed: int, other: bool = False) -> None:
        if seq not in self._drafted:
            return
        self._drafted.discard(seq)
        if other:  # another type's draft (llama.cpp's is_other): not counted
            return
        info = self._info[seq.seq_id]
        if info.n_draft_last == 0:
            return
        if (n_committed - 1) / info.n_draft_last < 0.25:
            info.n_low += 1
            if info.n_low >= 5:
                self.table.reset()
                info.n_low = 0
                info.i_last = 0
        else:
            info.n_low = 0

    def _draft_one(self, seq: Sequence) -> np.ndarray:
        if seq not in self._hist:  # (a sequence added without begin)
            self.begin(seq)
        self._drafted.add(seq)
        info = self._info[seq.seq_id]
        info.n_draft_last = 0
        hist, extra = split_history(seq)
        full = self._hist[seq].sync(hist, extra)
        prompt, id_last, n = full[:-1], int(full[-1]), self.n
        cur_len = len(prompt)
        if cur_len < n:
            return _EMPTY_DRAFT
        if info.i_last + 32 < cur_len:  # new n-grams in chunks
            self.table.add_range(prompt, info.i_last, cur_len - n)
            info.i_last = cur_len - n
        window = [int(t) for t in prompt[cur_len - n + 1:]] + [id_last]
        out: list[int] = []
        for i in range(self.n_max):
            token = self.table.get(window[i:i + n])
            if token == EMPTY:
                if i < self.n_min:
                    return _EMPTY_DRAFT
                break
            out.append(token)
            window.append(token)
        info.n_draft_last = len(out)
        return np.asarray(out, dtype=np.int32)

    def propose(self, seqs: list[Sequence], n: int) -> list[Draft]:
        # nothing to draft from before a sequence's prompt is decoded
        return [Draft(self._draft_one(seq)[:n]) if seq.started else Draft.empty() for seq in seqs]

    def release(self, seq: Sequence, keep: int = 0) -> int:
        self._hist.pop(seq, None)
        self._drafted.discard(seq)
        return keep  # the table keeps what it learnt; no positions are held

    def reset(self) -> None:
        """Forget everything, the table included (Engine.reset)."""
        self.table.reset()
        self._info.clear()
        self._hist.clear()
        self._drafted.clear()

    def close(self) -> None:
        self._hist.clear()


# --- the registry entry ----------------------------------------------------------------------------

@dataclass(frozen=True)
class NgramModOptions(Options):
    n_match: int = option(DEFAULT_N_MATCH, "ngram_mod_n_match", ("--spec-ngram-mod-n-match",),
                          "ngram-mod: the length of the hashed n-gram each lookup uses.")
    n_max: int = option(DEFAULT_N_MAX, "ngram_mod_n_max", ("--spec-ngram-mod-n-max",),
                        "ngram-mod: the most tokens one draft chains (then cut to --spec-draft-n-max).")
    n_min: int = option(DEFAULT_N_MIN, "ngram_mod_n_min", ("--spec-ngram-mod-n-min",),
                        "ngram-mod: a draft shorter than this is dropped.")

    def validate(self) -> None:
        super().validate()
        if self.n_min > self.n_max:
            raise InputError(f"ngram-mod's shortest draft ({self.n_min}) is above its longest "
                             f"({self.n_max}): it would never draft", field="ngram_mod_n_min")

    def with_length(self, n_max: int) -> "NgramModOptions":
        """The draft length is its n_max, and the shortest kept draft is capped by it alike."""
        return replace(self, n_max=n_max, n_min=min(self.n_min, n_max))


def _llama_args(o: NgramModOptions | None, n_max: int) -> list[str]:
    """Its draft length is its n_max (the row's n_max when no options are given)."""
    if o is None:
        return ["--spec-ngram-mod-n-max", str(n_max)]
    return ["--spec-ngram-mod-n-max", str(o.n_max), "--spec-ngram-mod-n-match", str(o.n_match),
            "--spec-ngram-mod-n-min", str(o.n_min)]


NGRAM_MOD = DraftType(
    name="ngram-mod", priority=3, traits=TEXT_TRAITS, options=NgramModOptions,
    # the table outlives the requests where the engine keeps drafter state (the server)
    make=lambda b: NgramModProposer(b.options.n_match, b.options.n_max, b.options.n_min, keep_table=b.keep_state),
    own_n_max=lambda o: o.n_max, llama_args=_llama_args)
TYPES = (NGRAM_MOD,)
