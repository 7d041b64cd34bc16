"""An owning wrapper over `llama_context *`: decode, logits, layer-input features, rollback."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ggspec.errors import InputError, LlamaError
from ggspec.runtime.handle import OwnedHandle
from ggspec.native.bindings import last_log_error
from ggspec.runtime.model import Model

# -ctk / -ctv names, as llama.cpp's common args spell them, to ggml_type ids.
CACHE_TYPES: dict[str, int] = {
    "f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8,
    "iq4_nl": 20, "bf16": 30,
}
FLASH_ATTN = {"auto": -1, "off": 0, "on": 1}
UNQUANTIZED = ("f32", "f16", "bf16")


def resolve_flash_attn(requested: str, n_gpu_layers: int, type_v: str) -> str:
    """`auto` means off for a model that runs on the CPU (unless a quantized V cache needs it).

    llama.cpp's `auto` turns flash attention on for the CPU too, where its multi-token path is
    slow: on the tiny dense pair a verify batch of 8 tokens costs 4.1x a single-token decode
    with it and 1.35x without it, which decides whether speculation can pay off at all.
    """
    if requested != "auto":
        return requested
    if n_gpu_layers == 0 and type_v in UNQUANTIZED:
        return "off"
    return "auto"


@dataclass
class ContextParams:
    n_ctx: int = 4096
    n_batch: int = 512
    n_ubatch: int = 512
    n_threads: int = 1
    type_k: str = "f16"
    type_v: str = "f16"
    flash_attn: str = "auto"  # auto | on | off
    n_rs_seq: int = 0  # recurrent-state planes per sequence kept for rollback
    n_seq_max: int = 1

    def validate(self) -> None:
        for flag, name in (("-ctk", self.type_k), ("-ctv", self.type_v)):
            if name not in CACHE_TYPES:
                raise InputError(f"{flag} {name}: unknown cache type (one of {', '.join(CACHE_TYPES)})")
        if self.flash_attn not in FLASH_ATTN:
            raise InputError(f"-fa {self.flash_attn}: expected one of auto, on, off")
        if self.type_v not in UNQUANTIZED and self.flash_attn == "off":
            raise InputError(f"-ctv {self.type_v} (a quantized V cache) needs flash attention: use -fa on or auto")
        for name in ("n_ctx", "n_batch", "n_ubatch", "n_threads"):
            if getattr(self, name) < 1:
                raise InputError(f"{name} must be at least 1")
        if self.n_rs_seq < 0:
            raise InputError("n_rs_seq must be >= 0")


class Context(OwnedHandle):
    """A llama.cpp context. Logits and feature rows returned by its methods are copies."""

    def __init__(self, model: Model, params: ContextParams, ctx_other: "Context | None" = None,
                 what: str = "model") -> None:
        params.validate()
        self.model = model  # held so the model outlives this context
        self.other = ctx_other  # likewise: a draft reads the target's tensors through ctx_other
        self.lc = model.lc
        self.params = params
        cp = self.lc.llama_context_default_params()
        cp.n_ctx = params.n_ctx
        cp.n_batch = params.n_batch
        cp.n_ubatch = min(params.n_ubatch, params.n_batch)
        cp.n_seq_max = params.n_seq_max
        cp.n_rs_seq = params.n_rs_seq
        cp.n_threads = params.n_threads
        cp.n_threads_batch = params.n_threads
        cp.type_k = CACHE_TYPES[params.type_k]
        cp.type_v = CACHE_TYPES[params.type_v]
        self.flash_attn = resolve_flash_attn(params.flash_attn, model.n_gpu_layers, params.type_v)
        cp.flash_attn_type = FLASH_ATTN[self.flash_attn]
        cp.no_perf = True
        if ctx_other is not None:
            cp.ctx_other = ctx_other.ptr
        ptr = self.lc.llama_init_from_model(model.ptr, cp)
        if not ptr:
            raise LlamaError(f"llama.cpp could not create the {what} context: {last_log_error()}")
        self.ptr = ptr
        self.memory = self.lc.llama_get_memory(ptr)
        self.n_ctx: int = self.lc.llama_n_ctx(ptr)
        self.n_batch: int = self.lc.llama_n_batch(ptr)
        self.n_ubatch: int = self.lc.llama_n_ubatch(ptr)
        self.n_rs_seq: int = self.lc.llama_n_rs_seq(ptr)
        self.n_vocab = model.n_vocab
        self._last_batch_rows: dict[int, int] = {}  # per sequence, for the rollback guard
        self._rolled_back = False
        self._n_outputs = 0

    # --- decoding --------------------------------------------------------------------------------

    def decode(self, batch) -> None:
        """Run one `llama_process` over the batch; raises LlamaError on any failure code."""
        rc = self.lc.llama_process(self.ptr, self.lc.LLAMA_PROCESS_TYPE_DECODE, batch.ptr)
        if rc != 0:
            raise LlamaError(f"llama_process failed (rc={rc}): {last_log_error()}")
        for seq_id, n in batch.rows_per_seq().items():
            self._last_batch_rows[seq_id] = n
        self._n_outputs = batch.n_outputs
        self._rolled_back = False

    def logits(self) -> np.ndarray:
        """Logits of the last decode's output rows, shape (n_outputs, n_vocab), copied."""
        return self.logits_view().copy()

    def logits_view(self) -> np.ndarray:
        """Like `logits()` but a view into llama.cpp's buffer: valid until the next decode."""
        ptr = self.lc.llama_get_logits(self.ptr)
        return np.ctypeslib.as_array(ptr, shape=(self._n_outputs, self.n_vocab))

    def argmax_rows(self) -> np.ndarray:
        """Greedy token of every output row of the last decode."""
        return self.logits_view().argmax(axis=1).astype(np.int32)

    # --- target layer-input features (DFlash) ----------------------------------------------------

    def enable_layer_inputs(self, layer_ids) -> None:
        for il in layer_ids:
            self.lc._lib.ggspec_set_embeddings_layer_inp(self.ptr, int(il), True)

    def layer_inputs(self, layer_ids, n_rows: int) -> np.ndarray:
        """Inputs of the given layers for the last decode's first `n_rows` batch rows,
        concatenated per row: shape (n_rows, len(layer_ids) * n_embd), float32, copied."""
        n_embd = self.model.n_embd
        out = np.empty((n_rows, len(layer_ids) * n_embd), dtype=np.float32)
        for k, il in enumerate(layer_ids):
            ptr = self.lc._lib.ggspec_get_embeddings_layer_inp(self.ptr, int(il))
            if not ptr:
                raise LlamaError(f"target layer {il} input was not extracted")
            src = np.ctypeslib.as_array(ptr, shape=(n_rows, n_embd))
            out[:, k * n_embd:(k + 1) * n_embd] = src
        return out

    def set_causal_attn(self, causal: bool) -> None:
        self.lc.llama_set_causal_attn(self.ptr, causal)

    # --- memory ----------------------------------------------------------------------------------

    def pos_max(self, seq_id: int = 0) -> int:
        return self.lc.llama_memory_seq_pos_max(self.memory, seq_id)

    def clear(self) -> None:
        self.lc.llama_memory_clear(self.memory, True)
        self._last_batch_rows.clear()

    def truncate(self, p0: int, seq_id: int = 0) -> None:
        """Drop positions >= p0 of a sequence (roll back rejected tokens).

        For recurrent/hybrid models the state comes from a saved plane, and llama.cpp has a trap:
        rolling back the *whole* last batch returns success with a wrong state (the pre-batch
        state is never stored). This method refuses every rollback the planes cannot serve
        exactly, so the trap cannot be reached through it.
        """
        pos_max = self.pos_max(seq_id)
        if p0 > pos_max:
            return
        if self.model.is_recurrent:
            r = pos_max - (p0 - 1)
            last_rows = self._last_batch_rows.get(seq_id, 0)
            if self._rolled_back:
                raise LlamaError("only one recurrent rollback is possible per decode")
            if r >= last_rows:
                raise LlamaError(
                    f"cannot roll back {r} tokens: the last batch had {last_rows} rows and the "
                    "recurrent state before a batch is not kept"
                )
            if r > self.n_rs_seq:
                raise LlamaError(f"cannot roll back {r} tokens with {self.n_rs_seq} recurrent planes")
        ok = self.lc.llama_memory_seq_rm(self.memory, seq_id, p0, -1)
        if not ok:
            raise LlamaError(f"llama.cpp refused to remove positions >= {p0} of sequence {seq_id}")
        if self.model.is_recurrent:
            self._rolled_back = True

    def remove(self, p0: int, seq_id: int = 0) -> None:
        """Drop positions >= p0 from a non-recurrent cache (e.g. the draft's noise block)."""
        if not self.lc.llama_memory_seq_rm(self.memory, seq_id, p0, -1):
            raise LlamaError(f"llama.cpp refused to remove positions >= {p0} of sequence {seq_id}")

    # --- lifetime --------------------------------------------------------------------------------

    def _free(self, ptr) -> None:
        self.lc.llama_free(ptr)
