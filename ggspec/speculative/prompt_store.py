"""Sequences' cache cells kept in host memory, for prompts that start like an earlier one.

The engine's prompt cache reuses a free slot's cells when a new prompt starts the way the slot's
last sequence did. With more distinct prompts in turn than slots, those cells are overwritten
before they come back. The store keeps a copy (llama_state_seq data of the target and of the draft)
of cells a new prompt is about to overwrite, and gives them back to a later prompt that shares a
longer beginning with them than with any free slot: only the rest of that prompt is decoded.
This is llama-server's host-memory prompt cache (`--cache-ram`), with the same budget semantics.
Loading copies exact bytes, so the cells, and the output, are those a fresh decode makes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """The number of leading tokens two token arrays share."""
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if len(differ) else n


@dataclass(eq=False)
class Checkpoint:
    """A hybrid target's recurrent state after the first `n_tokens` tokens of a slot's cells
    (llama.cpp's PARTIAL_ONLY sequence state: the part a cache cannot cut back to a prefix).
    Restored, with the attention cells cut at the same place, the cells hold those tokens exactly."""

    n_tokens: int
    state: bytearray


@dataclass(eq=False)  # entries are told apart by identity (their arrays do not compare as bools)
class Saved:
    """One sequence's cells: the tokens at positions 0..n-1 and each context's copy of them (and,
    for a hybrid target, its checkpoints at earlier positions of those tokens)."""

    tokens: np.ndarray
    states: tuple[bytearray, ...]  # the target's, then the draft's (if the engine has one)
    checkpoints: tuple[Checkpoint, ...] = ()

    @property
    def nbytes(self) -> int:
        return sum(len(s) for s in self.states) + sum(len(c.state) for c in self.checkpoints)


class PromptStore:
    """Saved cells within a byte budget (None: no limit); the least recently used go first."""

    def __init__(self, budget: int | None) -> None:
        self.budget = budget
        self._entries: list[Saved] = []  # least recently used first
        self.nbytes = 0
        self.hits = 0  # prompts that got cells from here
        self.tokens_loaded = 0  # prompt tokens those cells held (not decoded again)

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, saved: Saved) -> None:
        """Keep a copy; an entry whose tokens begin the new one's holds nothing more and goes."""
        for old in [e for e in self._entries if common_prefix(e.tokens, saved.tokens) == len(e.tokens)]:
            self._drop(old)
        if self.budget is not None and saved.nbytes > self.budget:
            return
        self._entries.append(saved)
        self.nbytes += saved.nbytes
        while self.budget is not None and self.nbytes > self.budget:
            self._drop(self._entries[0])

    def covers(self, tokens: np.ndarray) -> bool:
        """Whether an entry holds these tokens already (they begin its own)."""
        return any(common_prefix(e.tokens, tokens) == len(tokens) for e in self._entries)

    def find(self, body: np.ndarray, better_than: int,
             usable: Callable[[Saved, int], int] = lambda entry, n: n) -> tuple[Saved, int] | None:
        """The entry whose cells can hold the longest beginning of `body`, if longer than
        `better_than` tokens, and that length; it stays (now the most recently used). `usable`:
        how many of the tokens an entry shares with `body` its cells can be cut back to (all of
        them, but for a hybrid target's: Slots.reusable)."""
        best, n_best = None, better_than
        for entry in self._entries:
            n = usable(entry, common_prefix(entry.tokens, body))
            if n > n_best:
                best, n_best = entry, n
        if best is None:
            return None
        self._entries.remove(best)
        self._entries.append(best)
        self.hits += 1
        self.tokens_loaded += n_best
        return best, n_best

    def clear(self) -> None:
        self._entries.clear()
        self.nbytes = 0

    def _drop(self, entry: Saved) -> None:
        self._entries.remove(entry)
        self.nbytes -= entry.nbytes
