"""An owning wrapper over `llama_batch_ext *`, filled from numpy through the shim's bulk calls."""

from __future__ import annotations

import ctypes

import numpy as np

from ggspec.errors import LlamaError
from ggspec.runtime.handle import OwnedHandle

_ADD_ERRORS = {-1: "batch is full", -2: "invalid token or embedding row", -3: "invalid sequence id"}


class Batch(OwnedHandle):
    """Token rows or embedding rows (never both: llama.cpp rejects mixed batches)."""

    def __init__(self, ctx) -> None:
        self.lc = ctx.lc
        self.ptr = self.lc.llama_batch_ext_init(ctx.ptr)
        if not self.ptr:
            raise LlamaError("llama_batch_ext_init failed")
        self.capacity: int = ctx.n_batch
        self.n_tokens = 0
        self.n_outputs = 0

    def clear(self) -> "Batch":
        self.lc.llama_batch_ext_clear(self.ptr)
        self.n_tokens = 0
        self.n_outputs = 0
        return self

    def add_tokens(self, tokens, pos0: int, seq_id: int = 0, outputs: str | np.ndarray = "last") -> "Batch":
        """Append tokens at positions pos0, pos0+1, ...; outputs: "all", "last", "none" or flags."""
        ids = np.ascontiguousarray(tokens, dtype=np.int32)
        n = len(ids)
        if isinstance(outputs, str):
            flags = np.zeros(n, dtype=np.int8)
            if outputs == "all":
                flags[:] = 1
            elif outputs == "last" and n:
                flags[-1] = 1
        else:
            flags = np.ascontiguousarray(outputs, dtype=np.int8)
        self._check_room(n)
        rc = self.lc._lib.ggspec_batch_add_tokens(
            self.ptr, seq_id, ids.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)), n, pos0,
            flags.ctypes.data_as(ctypes.POINTER(ctypes.c_int8)),
        )
        self._added(rc, n, int(np.count_nonzero(flags)))
        return self

    def add_embd_rows(self, rows: np.ndarray, pos0: int, seq_id: int = 0) -> "Batch":
        """Append embedding rows (n_rows, width) at positions pos0, pos0+1, ...; no outputs."""
        data = np.ascontiguousarray(rows, dtype=np.float32)
        n, width = data.shape
        self._check_room(n)
        rc = self.lc._lib.ggspec_batch_add_embd_rows(
            self.ptr, seq_id, data.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), n, width, pos0
        )
        self._added(rc, n, 0)
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
