"""An owning wrapper over `llama_batch_ext *`, filled from numpy through the shim's bulk calls."""

from __future__ import annotations

import ctypes
import functools

import numpy as np

from ggspec.errors import LlamaError
from ggspec.runtime.handle import OwnedHandle

_ADD_ERRORS = {-1: "batch is full", -2: "invalid token or embedding row", -3: "invalid sequence id"}


@functools.cache
def _output_flags(which: str, n: int) -> tuple[np.ndarray, int, int]:
    """Read-only output flags for n rows: "all", "last" or "none", with their address and the
    number of outputs (cached: built once per size; this runs for every batch of every step)."""
    flags = np.zeros(n, dtype=np.int8)
    if which == "all":
        flags[:] = 1
    elif which == "last" and n:
        flags[-1] = 1
    elif which not in ("last", "none"):
        raise ValueError(f"outputs={which!r}: expected 'all', 'last', 'none' or flags")
    flags.flags.writeable = False
    return flags, flags.ctypes.data, int(flags.sum())


class Batch(OwnedHandle):
    """Token rows or embedding rows (never both: llama.cpp rejects mixed batches)."""

    def __init__(self, ctx) -> None:
        self.lc = ctx.lc
        # llama.cpp's batch keeps a pointer to the context's memory: held, so closing the context
        # closes this batch too (see OwnedHandle)
        self.ctx = ctx
        self.ptr = self.lc.llama_batch_ext_init(ctx.ptr)
        if not self.ptr:
            raise LlamaError("llama_batch_ext_init failed")
        self.capacity: int = ctx.n_batch
        self.quick = ctx.quick  # the short calls (see Context.quick)
        self._add_tokens = self.quick.ggspec_batch_add_tokens  # looked up once: it runs every step
        self.n_tokens = 0
        self.n_outputs = 0
        # token ids are staged here and its address passed (the shim copies them into the batch):
        # one numpy copy per call instead of a fresh ctypes view of every caller's array
        self._ids = np.empty(self.capacity, dtype=np.int32)
        self._ids_addr: int = self._ids.ctypes.data
        self._layer_ids: dict[tuple, ctypes.Array] = {}  # ctypes copies of layer id lists

    def clear(self) -> "Batch":
        self.quick.llama_batch_ext_clear(self.ptr)
        self.n_tokens = 0
        self.n_outputs = 0
        return self

    def add_tokens(self, tokens, pos0: int, seq_id: int = 0, outputs: str | np.ndarray = "last") -> "Batch":
        """Append tokens at positions pos0, pos0+1, ...; outputs: "all", "last", "none" or flags."""
        n = len(tokens)
        if isinstance(outputs, str):
            flags, flags_addr, n_out = _output_flags(outputs, n)
        else:
            flags = np.ascontiguousarray(outputs, dtype=np.int8)
            flags_addr, n_out = flags.ctypes.data, int(np.count_nonzero(flags))
        self._check_room(n)
        self._ids[:n] = tokens
        rc = self._add_tokens(self.ptr, seq_id, self._ids_addr, n, pos0, flags_addr)
        self._added(rc, n, n_out)
        return self

    def add_shared(self, token: int, pos: int, seq_ids, output: bool = True) -> "Batch":
        """Append one token that belongs to several sequences at once (a token tree's node, on
        every branch through it: llama.cpp lets a row see the cells of its first sequence id)."""
        lc = self.lc
        self._check_room(1)
        idx = lc.llama_batch_ext_add_token(self.ptr, int(seq_ids[0]), int(token))
        if idx < 0:
            raise LlamaError(f"could not fill the batch: {_ADD_ERRORS.get(idx, f'error {idx}')}")
        ok = all(lc.llama_batch_ext_add_seq(self.ptr, idx, int(s)) for s in seq_ids[1:])
        ok = ok and lc.llama_batch_ext_set_pos(self.ptr, idx, ctypes.byref(ctypes.c_int32(pos)))
        if not (ok and lc.llama_batch_ext_set_output_logits(self.ptr, idx, output)):
            raise LlamaError(f"could not fill the batch: row {idx} at position {pos} of sequences {list(seq_ids)}")
        self._added(1, 1, int(output))
        return self

    def add_embd_rows(self, rows: np.ndarray, pos0: int, seq_id: int = 0, outputs: bool = False) -> "Batch":
        """Append embedding rows (n_rows, width) at positions pos0, pos0+1, ...; `outputs`: every
        row an output (an encoder's: EAGLE3), else none."""
        data = np.ascontiguousarray(rows, dtype=np.float32)
        n, width = data.shape
        self._check_room(n)
        first = self.n_tokens
        rc = self.quick.ggspec_batch_add_embd_rows(self.ptr, seq_id, data.ctypes.data, n, width, pos0)
        self._added(rc, n, 0)
        if outputs:
            self._outputs_from(first)
        return self

    def _outputs_from(self, first: int) -> None:
        """Make rows first.. (the ones just added) outputs."""
        for idx in range(first, self.n_tokens):
            self.lc.llama_batch_ext_set_output_logits(self.ptr, idx, True)
        self.n_outputs += self.n_tokens - first

    def add_layer_inputs(self, src, layer_ids, row0: int, n_rows: int, pos0: int, seq_id: int = 0,
                         outputs: bool = False) -> "Batch":
        """Append rows made of `src` context's extracted inputs of `layer_ids` (concatenated per
        row) for rows row0.. of its last decode, at positions pos0, pos0+1, ...; `outputs`: every
        row an output (an EAGLE3 encoder's), else none. Copied inside llama.cpp, straight from
        src's buffers (see Context.layer_inputs)."""
        ids = self._layer_ids.get(tuple(layer_ids))
        if ids is None:
            ids = self._layer_ids[tuple(layer_ids)] = (ctypes.c_int32 * len(layer_ids))(*layer_ids)
        src.check_layer_inputs(layer_ids, row0, n_rows)
        self._check_room(n_rows)
        first = self.n_tokens
        rc = self.quick.ggspec_batch_add_layer_inputs(self.ptr, seq_id, src.ptr, ids, len(ids), src.model.n_embd,
                                                        row0, n_rows, pos0)
        self._added(rc, n_rows, 0)
        if outputs:
            self._outputs_from(first)
        return self

    def add_tokens_h(self, tokens, h_first: int, h_rest: int, pos0: int, seq_id: int, n_embd: int,
                     outputs: bool) -> "Batch":
        """Append tokens at positions pos0, pos0+1, ..., each carrying a hidden-state row (an MTP
        head's input: the token's embedding comes from its id, the row goes in as its "h"): token 0
        takes the n_embd floats at address h_first, token k >= 1 those at h_rest + (k-1) rows (the
        batch copies them). `outputs`: every row an output, or none (patch 0011's filler)."""
        n = len(tokens)
        self._check_room(n)
        self._ids[:n] = tokens
        rc = self.quick.ggspec_batch_add_tokens_h(self.ptr, seq_id, self._ids_addr, n, pos0, h_first, h_rest,
                                                   n_embd, outputs)
        self._added(rc, n, n if outputs else 0)
        return self

    def _check_room(self, n: int) -> None:
        if self.n_tokens + n > self.capacity:
            raise LlamaError(f"batch overflow: {self.n_tokens} + {n} rows > n_batch {self.capacity}")

    def _added(self, rc: int, n: int, n_out: int) -> None:
        if rc != n:
            raise LlamaError(f"could not fill the batch: {_ADD_ERRORS.get(rc, f'error {rc}')}")
        self.n_tokens += n
        self.n_outputs += n_out

    def _free(self, ptr) -> None:
        self.lc.llama_batch_ext_free(ptr)
