"""An engine's sequence slots and, with the prompt cache, what their cells still hold.

Every parallel sequence has its own slot (its seq_id and its stream of cache cells). With the
prompt cache (llama-server's cache_prompt) a slot keeps the cells of its last sequence, and a new
prompt goes to the free slot whose cells hold the longest prefix of it: only the rest is decoded.
With host memory for the cache (llama-server's --cache-ram), cells a new prompt would overwrite
are copied to a `PromptStore` first, and a later prompt that starts the same way gets them back.

A hybrid target's recurrent state holds only its last position, and a window-sized cache of
sliding-window layers only the window before it: such cells cannot be cut back to any shorter
prefix (but a few tokens back: a rollback plane, or the cells still inside the window). So, as
llama-server does with its context checkpoints (`--ctx-checkpoints`), the engine saves that part
of the state (llama.cpp's PARTIAL_ONLY sequence state) at chosen positions while it decodes a
prompt (`checkpoint`), and a later prompt that leaves the cells before their end restores the
latest checkpoint at or before where it leaves them: only the rest is decoded.
"""

from __future__ import annotations

import numpy as np

from ggspec.errors import ContextOverflow, InputError, LlamaError
from ggspec.runtime import Context
from ggspec.speculative.prompt_store import Checkpoint, PromptStore, Saved, common_prefix


class CapacityError(InputError):
    """No free sequence slot for another sequence right now."""


class Slots:
    """The free slots, and the tokens each free slot's cells still hold (positions 0..)."""

    def __init__(self, target: Context, cell_contexts: list[Context], parallel: int, prompt_cache: bool,
                 cache_ram: int | None, block_cells: int, max_checkpoints: int = 0) -> None:
        """`cell_contexts`: the contexts whose cells hold a sequence's positions (the target's and
        a draft model's); `cache_ram`: bytes for the host-memory store (0: none, None: no limit);
        `block_cells`: the cells one verify block needs past a sequence's prompt and budget;
        `max_checkpoints`: checkpoints kept per slot of a hybrid or window-sized target (0: none)."""
        self.target = target
        # a hybrid target's cells, or a window-sized sliding cache's, are cut back through
        # checkpoints of the state that cannot be cut back (the recurrent state, the window)
        self.recurrent = target.model.is_recurrent
        self.windowed = target.n_swa > 0
        self.limited = self.recurrent or self.windowed  # (cells not cut back to any prefix as they are)
        self.max_checkpoints = max_checkpoints if prompt_cache and self.limited else 0
        self.checkpoints: dict[int, list[Checkpoint]] = {}  # slot -> its checkpoints, oldest first
        self.lag = 0  # positions before a shared prefix's end decoded again all the same (Proposer.cache_lag)
        self.block_cells = block_cells
        self.cell_contexts = cell_contexts
        self.prompt_cache = prompt_cache
        self.parallel = parallel
        self.free = list(range(parallel))
        self.cached: dict[int, np.ndarray] = {}  # free slot -> its cells' tokens, in the order slots were freed
        self.store = PromptStore(cache_ram) if prompt_cache and cache_ram != 0 else None

    @property
    def capacity(self) -> int:
        """Cache cells of one sequence: every parallel slot gets its own n_ctx / parallel (llama.cpp
        pads it to a multiple of 256). Separate streams keep each sequence's attention to its own
        cells: with one cache shared by all, every verify row attends over every sequence's
        cells, which cost 22 % of the aggregate speed at -np 4 on the tiny pair (measured). Where
        one cache is shared (token trees, chained MTP), each slot gets its share of it."""
        if self.target.kv_unified:
            return self.target.n_ctx_seq // self.parallel
        return self.target.n_ctx_seq

    def check_prompt(self, prompt: np.ndarray) -> None:
        """Reject prompts llama.cpp cannot take, before anything is decoded."""
        if len(prompt) == 0:
            raise InputError("the prompt is empty (it tokenized to zero tokens)", field="prompt")
        need = len(prompt) + self.block_cells  # prompt, then one verify block [id_last, d1..dn]
        if need > self.capacity:
            room = "a draft block" if self.block_cells > 1 else "one generated token"
            raise ContextOverflow(f"the prompt has {len(prompt)} tokens: with {room} it needs {need} positions, "
                                  f"but the context holds {self.capacity} (raise the context size or shorten the "
                                  "prompt)", "prompt", len(prompt), self.capacity)

    def limit(self, n_prompt: int, n_predict: int) -> int:
        """Positions a sequence may use: its prompt, its budget and one verify block past it."""
        return min(n_prompt + n_predict + self.block_cells, self.capacity)

    def take(self, prompt: np.ndarray, reuse: bool = True) -> tuple[int, int]:
        """A free slot for a prompt, and how many of the prompt's first tokens its cells hold (the
        rest of its cells is dropped); `reuse` False: none (the whole prompt is decoded)."""
        slot, cached = self._pick(prompt) if reuse else (self.free[0], 0)
        if self.store is not None and reuse:
            cached = self._swap_in(slot, prompt, cached)
        self.free.remove(slot)
        self.cached.pop(slot, None)
        self._cut_back(slot, cached)  # the previous sequence's cells past the common prefix
        return slot, cached

    def reusable(self, end: int, common: int, checkpoints: list[Checkpoint] | tuple[Checkpoint, ...],
                 slot: int | None = None) -> int:
        """How many of the first `common` tokens of cells holding `end` positions a new prompt may
        keep: all of them on a full attention cache; on a hybrid target's or a window-sized one,
        all where they are all the cells hold (the state is at their end), else as far as the
        live cells of `slot` can be cut back (`_cuts_to`) or the latest checkpoint at or before
        `common` reaches (0: none)."""
        if not self.limited or common >= end:
            return min(common, end)
        if slot is not None and common > 0 and self._cuts_to(slot, common):
            return common
        return max((c.n_tokens for c in checkpoints if c.n_tokens <= common), default=0)

    def _cuts_to(self, slot: int, n: int) -> bool:
        """Whether the slot's live cells can be cut back to their first n positions as they are: a
        hybrid target's through a rollback plane, a window-sized cache's where every cell the
        window before n needs is still there."""
        if self.recurrent and not self.target.can_truncate(n, slot):
            return False
        return not self.windowed or self.target.pos_min(slot) <= max(0, n - self.target.n_swa + 1)

    def checkpoint(self, slot: int, n_tokens: int) -> None:
        """Keep the part of `slot`'s state that cannot be cut back (a hybrid target's recurrent
        state, a window-sized cache's window), which holds its first `n_tokens` positions now (the
        engine calls it while decoding a prompt); the oldest go past the limit."""
        if self.max_checkpoints <= 0 or n_tokens <= 0:
            return
        kept = [c for c in self.checkpoints.get(slot, []) if c.n_tokens < n_tokens]
        kept.append(Checkpoint(n_tokens, self.target.save_sequence(slot, partial=True)))
        self.checkpoints[slot] = kept[-self.max_checkpoints:]

    def _cut_back(self, slot: int, n: int) -> None:
        """The slot's cells cut to their first `n` positions (n was found `reusable`): an attention
        cache drops the rest; a hybrid or window-sized one cuts its live cells where `_cuts_to`
        allows, else restores the checkpoint at `n` and drops the cells past it. Checkpoints past
        `n` go."""
        self.checkpoints[slot] = [c for c in self.checkpoints.get(slot, []) if c.n_tokens <= n]
        if not self.limited:
            self.target.truncate(n, slot)
        elif n <= 0:
            self.target.drop_sequence(slot)
        elif n <= self.target.pos_max(slot) and not self._cuts_to(slot, n):
            point = next(c for c in self.checkpoints[slot] if c.n_tokens == n)
            self.target.load_sequence(point.state, slot, partial=True)
            self.target.remove(n, slot)
        else:
            self.target.truncate(n, slot)

    def give_back(self, slot: int, kept: np.ndarray | None) -> None:
        """A slot's sequence left: the cells of `kept` (its first tokens) stay for a later prompt;
        None or empty: every cell goes."""
        n = 0 if kept is None else len(kept)
        if n > 0 and self.limited:  # (the state may be past the last kept
            # token: the live cells or a checkpoint take it back there, or to the latest before it)
            n = self.reusable(self.target.pos_max(slot) + 1, n, self.checkpoints.get(slot, ()), slot)
        if n > 0:
            self._cut_back(slot, n)
            self.cached[slot] = kept[:n]
        else:
            self.target.drop_sequence(slot)
            self.checkpoints.pop(slot, None)
        self.free.append(slot)
        self.free.sort()

    def clear(self) -> None:
        self.cached.clear()
        self.checkpoints.clear()
        if self.store is not None:
            self.store.clear()

    def _pick(self, prompt: np.ndarray) -> tuple[int, int]:
        """The free slot whose cells hold the longest prefix of the prompt (at most all but its
        last token, which is always decoded: as the first step's id_last, or for the prefill's
        output row)."""
        slot, best = self.free[0], 0
        if not self.prompt_cache:
            return slot, 0
        body = prompt[:-1]
        for sid in self.free:
            cached = self.cached.get(sid)
            if cached is None:
                continue
            shared = max(0, common_prefix(cached, body) - self.lag)
            common = self.reusable(len(cached), shared, self.checkpoints.get(sid, ()), sid)
            if common > best:
                slot, best = sid, common
        if best == 0:  # no prefix to reuse: a slot holding nothing, else the one that waited longest
            empty = [sid for sid in self.free if sid not in self.cached]
            slot = empty[0] if empty else next(sid for sid in self.cached if sid in self.free)
        return slot, best

    def _swap_in(self, slot: int, prompt: np.ndarray, cached: int) -> int:
        """The host-memory store, when a prompt takes `slot` reusing `cached` of its cells: the
        slot's cells go to the store if the prompt overwrites some of them, and saved cells that
        share a longer beginning with the prompt are loaded into the slot instead. Returns how
        many of the prompt's first tokens the slot's cells now hold."""
        held = self.cached.get(slot)
        found = self.store.find(prompt[:-1], better_than=cached,
                                usable=lambda entry, n: self.reusable(len(entry.tokens), max(0, n - self.lag),
                                                                      entry.checkpoints))
        if held is not None and (found is not None or len(held) > cached) and not self.store.covers(held):
            self.store.put(Saved(held, tuple(ctx.save_sequence(slot) for ctx in self.cell_contexts),
                                 tuple(self.checkpoints.get(slot, ()))))
        if found is None:
            return cached
        saved, n = found
        self.cached.pop(slot, None)
        try:
            for ctx, state in zip(self.cell_contexts, saved.states):
                ctx.drop_sequence(slot)
                ctx.load_sequence(state, slot)
        except LlamaError:  # (not seen) the slot starts empty instead: the prompt is decoded whole
            for ctx in self.cell_contexts:
                ctx.drop_sequence(slot)
            self.checkpoints.pop(slot, None)
            return 0
        self.cached[slot] = saved.tokens
        self.checkpoints[slot] = list(saved.checkpoints)
        return n
