"""An owning wrapper over `llama_context *`: decode, logits, layer-input features, rollback."""

from __future__ import annotations

import ctypes

from dataclasses import dataclass

import numpy as np

from ggspec.errors import InputError, LlamaError
from ggspec.runtime import watchdog
from ggspec.runtime.handle import OwnedHandle
from ggspec.native.bindings import held_gil, last_log_error
from ggspec.runtime.model import Model
from ggspec.runtime.memory import check_memory
from ggspec.runtime.preflight import GGML_MAX_N_THREADS, MAX_CTX
from ggspec.values import is_int

# -ctk / -ctv names, as llama.cpp's common args spell them, to ggml_type ids.
CACHE_TYPES: dict[str, int] = {
    "f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8,
    "iq4_nl": 20, "bf16": 30,
}
FLASH_ATTN = {"auto": -1, "off": 0, "on": 1}
UNQUANTIZED = ("f32", "f16", "bf16")


def resolve_flash_attn(requested: str) -> str:
    """One attention setting for every context, plain or verifying: `auto` is llama.cpp's own
    (flash attention on wherever the backend has it, the CPU included), as llama-completion runs.

    Plain and speculative contexts must compute alike for speculative text to equal plain text,
    and with the CPU backend's batch invariance (patch 0021) flash attention is the faster of the
    two there for decodes and verifies alike (scripts/invariance_cost.py, 2-core Xeon, ms with it on
    vs off: Gemma 3 270M decode 10.9 vs 12.0, an 8-row verify 41.0 vs 44.5; Qwen2.5-Coder 1.5B
    decode 30.0 vs 34.9, 8 rows 158 vs 150)."""
    return requested


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
    n_seq_max: int = 1  # sequences decoded together (one per parallel slot)
    kv_unified: bool = False  # one cache shared by all sequences (else n_ctx / n_seq_max each)
    # sliding-window layers keep every position's cells (the C API's default; llama-server's
    # --swa-full); False, as llama.cpp's tools: a window-sized cache (cheaper attention deep into a
    # context), whose cells cannot be cut back past the window (the prompt cache checkpoints it).
    # A cache shared by all sequences (kv_unified: token trees, chained MTP) keeps every cell.
    swa_full: bool = False
    picks_per_seq: int = 1  # output rows of one sequence a decode may pick on the device (pick_on_device)
    # the memory fit (speculative/fit.py) measured this configuration as llama.cpp allocates it:
    # the metadata estimate (runtime.memory.check_memory) has nothing to add
    measured: bool = False

    def validate(self) -> None:
        for field, name in (("type_k", self.type_k), ("type_v", self.type_v)):
            if name not in CACHE_TYPES:
                raise InputError(f"{name}: unknown cache type (one of {', '.join(CACHE_TYPES)})", field=field)
        if self.flash_attn not in FLASH_ATTN:
            raise InputError(f"{self.flash_attn}: expected one of auto, on, off", field="flash_attn")
        if self.type_v not in UNQUANTIZED and self.flash_attn == "off":
            raise InputError(f"{self.type_v} (a quantized V cache) needs flash attention on or auto", field="type_v")
        for name in ("n_ctx", "n_batch", "n_ubatch", "n_threads", "n_rs_seq", "n_seq_max", "picks_per_seq"):
            if not is_int(getattr(self, name)):
                raise InputError(f"{name} must be an integer (got {getattr(self, name)!r})", field=name)
        for name in ("n_ctx", "n_batch", "n_ubatch", "n_threads", "picks_per_seq"):
            if getattr(self, name) < 1:
                raise InputError(f"{name} must be at least 1", field=name)
        if self.n_rs_seq < 0:
            raise InputError("n_rs_seq must be >= 0", field="n_rs_seq")
        # llama_context_params holds these as uint32 and positions are int32: a larger value
        # would wrap (-c 4294967296 became 0, i.e. the training context)
        for name, words in (("n_ctx", "context size"), ("n_batch", "batch size"), ("n_ubatch", "physical batch size")):
            if getattr(self, name) > MAX_CTX:
                raise InputError(f"{words} {getattr(self, name)} is too large (at most {MAX_CTX})", field=name)
        if self.n_threads > GGML_MAX_N_THREADS:  # ggml's thread pool holds at most 512 threads
            raise InputError(f"n_threads {self.n_threads} is too large (at most {GGML_MAX_N_THREADS})", field="n_threads")
        if not 1 <= self.n_seq_max <= 256:  # LLAMA_MAX_SEQ
            raise InputError(f"n_seq_max {self.n_seq_max} is out of range (1..256)", field="parallel")


class Context(OwnedHandle):
    """A llama.cpp context. Logits and feature rows returned by its methods are copies."""

    def __init__(self, model: Model, params: ContextParams, ctx_other: "Context | None" = None,
                 what: str = "model", mtp: bool = False, eval_callback=None) -> None:
        """`mtp`: a context of type MTP on a target loaded with its MTP blocks: its cache holds
        only those blocks' layers, and a decode runs the MTP head (token + hidden-state rows).
        `eval_callback`: llama.cpp's `cb_eval` (a `ggml_backend_sched_eval_callback`), called for
        every graph node as it is computed (the batch-variance probe reads nodes with it)."""
        params.validate()
        # (an MTP context's cache holds one layer: the target's check covers it)
        if (model.n_gpu_layers == 0 and not model.placement.multi_device and not mtp and not model.dry
                and not params.measured):
            check_memory([(model.meta, (1 + params.n_rs_seq) * params.n_seq_max)], params.n_ctx, params.type_k, params.type_v,
                         min(params.n_ubatch, params.n_batch))
        self.model = model  # held so the model outlives this context
        self.other = ctx_other  # likewise: a draft reads the target's tensors through ctx_other
        self.lc = model.lc
        self.params = params
        cp = self.lc.llama_context_default_params()
        cp.n_ctx = params.n_ctx
        cp.n_batch = params.n_batch
        cp.n_ubatch = min(params.n_ubatch, params.n_batch)
        cp.n_seq_max = params.n_seq_max
        cp.n_outputs_max_per_seq = params.picks_per_seq
        cp.n_rs_seq = params.n_rs_seq
        cp.kv_unified = params.kv_unified
        cp.swa_full = params.swa_full or params.kv_unified
        cp.n_threads = params.n_threads
        cp.n_threads_batch = params.n_threads
        cp.type_k = CACHE_TYPES[params.type_k]
        cp.type_v = CACHE_TYPES[params.type_v]
        self.flash_attn = resolve_flash_attn(params.flash_attn)
        cp.flash_attn_type = FLASH_ATTN[self.flash_attn]
        cp.no_perf = True
        self._eval_callback = eval_callback  # held: llama.cpp calls it as long as the context lives
        if eval_callback is not None:
            cp.cb_eval = eval_callback
        if ctx_other is not None:
            cp.ctx_other = ctx_other.ptr
        if mtp:
            cp.ctx_type = self.lc.LLAMA_CONTEXT_TYPE_MTP
        ptr = self.lc.llama_init_from_model(model.ptr, cp)
        if not ptr:
            raise LlamaError(f"llama.cpp could not create the {what} context: {last_log_error()}")
        self.ptr = ptr
        self.memory = self.lc.llama_get_memory(ptr)
        # the sliding window of a window-sized cache (0: every cell kept, or no sliding layers)
        self.n_swa: int = 0 if cp.swa_full else max(0, int(self.lc.llama_model_n_swa(model.ptr)))
        self.n_ctx: int = self.lc.llama_n_ctx(ptr)
        self.n_batch: int = self.lc.llama_n_batch(ptr)
        self.n_ubatch: int = self.lc.llama_n_ubatch(ptr)
        self.n_rs_seq: int = self.lc.llama_n_rs_seq(ptr)
        self.n_ctx_seq: int = self.lc.llama_n_ctx_seq(ptr)  # positions one sequence may hold
        self.n_seq_max: int = params.n_seq_max
        self.kv_unified: bool = params.kv_unified  # one cache for every sequence (cells can be shared)
        self.n_decodes = 0  # llama_process calls so far (the engine counts calls per step)
        self.n_vocab = model.n_vocab
        # a logits row's columns: every token, or a reduced head's (set_head_rows): column j is
        # token logit_ids[j]
        self.n_logits = model.n_vocab
        self.logit_ids: np.ndarray | None = None
        self._n_outputs = 0
        self._n_rows = 0  # rows of the last decode
        # the short calls of every step keep the GIL (bindings.held_gil), except while RPC workers
        # are watched: a call blocked on one must leave the GIL to the watchdog's thread
        lib = self.lc._lib
        self.quick = lib if watchdog.armed() else held_gil()
        # llama_get_logits returning the bare address (its own function object: the bindings'
        # keeps its float-pointer result type); it runs every step
        self._get_logits = type(self.quick.llama_get_logits)(("llama_get_logits", self.quick))
        self._get_logits.argtypes, self._get_logits.restype = [ctypes.c_void_p], ctypes.c_void_p
        self._logits_key: tuple[int | None, int] = (None, -1)  # (buffer address, rows) of _logits
        self._logits = np.empty((0, model.n_vocab), dtype=np.float32)
        self._layer_id_arrays: dict[tuple, ctypes.Array] = {}  # layer ids as C arrays (layer_inputs)
        self._layer_inputs_on: frozenset[int] = frozenset()  # layers whose inputs decodes extract
        self._layer_inputs_enabled: frozenset[int] = frozenset()  # ... when not paused
        self._extracted: frozenset[int] = frozenset()  # ... and which the last decode did extract
        self._pickers: dict[int, tuple[int, int]] = {}  # seq_id -> (top_k, sampler chain): pick_on_device
        self.plan_pool = (0, 0)  # (prepared plans kept, largest ubatch they hold): set_plan_pool

    # --- decoding --------------------------------------------------------------------------------

    def decode(self, batch) -> None:
        """Run one `llama_process` over the batch; raises LlamaError on any failure code."""
        self._process(batch, self.lc.LLAMA_PROCESS_TYPE_DECODE, "llama_process")
        self._extracted = self._layer_inputs_on

    def encode(self, batch) -> None:
        """Run one `llama_process` of type ENCODE (an EAGLE3 head's feature encoder)."""
        self._process(batch, self.lc.LLAMA_PROCESS_TYPE_ENCODE, "llama_process (encode)")
        self._extracted = frozenset()

    def _process(self, batch, process_type: int, what: str) -> None:
        """One `llama_process` call of `process_type` (counted in n_decodes); LlamaError on a failure code."""
        watchdog.begin()  # watched only while RPC workers are in use
        try:
            rc = self.lc.llama_process(self.ptr, process_type, batch.ptr)
            self.n_decodes += 1
        finally:
            watchdog.end()
        if rc != 0:
            raise LlamaError(f"{what} failed (rc={rc}): {last_log_error()}")
        self._n_outputs = batch.n_outputs
        self._n_rows = batch.n_tokens

    def logits(self) -> np.ndarray:
        """Logits of the last decode's output rows, shape (n_outputs, n_logits), copied."""
        return self.logits_view().copy()

    def logits_view(self) -> np.ndarray:
        """Like `logits()` but a view into llama.cpp's buffer: valid until the next decode."""
        # np.ctypeslib.as_array costs ~10 us a call; the buffer rarely moves, so keep the view of
        # the current (address, rows) and rebuild it only when llama.cpp hands out another one
        addr = self._get_logits(self.ptr)
        key = (addr, self._n_outputs)
        if self._logits_key != key:
            n = self._n_outputs * self.n_logits
            self._logits = np.frombuffer((ctypes.c_float * n).from_address(addr), dtype=np.float32).reshape(
                self._n_outputs, self.n_logits) if n else np.empty((0, self.n_logits), dtype=np.float32)
            self._logits_key = key
        return self._logits

    def argmax_rows(self) -> np.ndarray:
        """Greedy token of every output row of the last decode."""
        best = self.logits_view().argmax(axis=1)
        return (best if self.logit_ids is None else self.logit_ids[best]).astype(np.int32)

    # --- the draft's pick on the device (llama.cpp's backend sampling) -------------------------------

    def pick_on_device(self, seq_id: int, top_k: int | None) -> bool:
        """Have this sequence's output rows picked in the decode's own graph, as llama.cpp's draft
        loops do (its backend sampling): their argmax (top_k 0) or their top_k largest logits with
        their columns. Only those come back, not a vocabulary-wide row per output, and when every
        row of a decode is picked so, llama.cpp copies no logits at all. None: full rows again.
        Returns whether the backend took it (False: this sequence's rows stay full)."""
        old = self._pickers.get(seq_id)
        if old is not None and old[0] == top_k:
            return True
        if old is None and top_k is None:
            return True
        lc = self.lc
        chain = None
        if top_k is not None:
            chain = lc.llama_sampler_chain_init(lc.llama_sampler_chain_default_params())
            lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_top_k(top_k) if top_k else lc.llama_sampler_init_greedy())
        taken = bool(lc.llama_set_sampler(self.ptr, seq_id, chain))  # (None: the sequence's is removed)
        if old is not None:
            lc.llama_sampler_free(old[1])
            del self._pickers[seq_id]
        if chain is not None and taken:
            self._pickers[seq_id] = (top_k, chain)
        elif chain is not None:
            lc.llama_sampler_free(chain)
        return taken or chain is None

    def picked_on_device(self, seq_id: int) -> int | None:
        """What pick_on_device set for this sequence (its top_k; 0: the argmax), None: full rows."""
        got = self._pickers.get(seq_id)
        return None if got is None else got[0]

    def picked_argmax(self, row: int) -> int:
        """The argmax column of output row `row` of the last decode, picked on the device (a
        sequence picked with top_k 0)."""
        col = self.quick.llama_get_sampled_token_ith(self.ptr, row - self._n_outputs)
        if col < 0:
            raise LlamaError(f"output row {row} of the last decode has no argmax picked on the device")
        return col

    def picked_top(self, row: int) -> tuple[np.ndarray, np.ndarray]:
        """The columns and logits of output row `row`'s top_k largest logits, picked on the device
        (a sequence picked with top_k > 0), in no particular order."""
        i = row - self._n_outputs
        n = self.quick.llama_get_sampled_logits_count_ith(self.ptr, i)
        logits = self.quick.llama_get_sampled_logits_ith(self.ptr, i)
        cols = self.quick.llama_get_sampled_candidates_ith(self.ptr, i)
        if not n or not logits:
            raise LlamaError(f"output row {row} of the last decode has no top logits picked on the device")
        return (np.ctypeslib.as_array(cols, shape=(n,)).copy(), np.ctypeslib.as_array(logits, shape=(n,)).copy())

    # --- target layer-input features (DFlash) ----------------------------------------------------

    def enable_layer_inputs(self, layer_ids) -> None:
        for il in layer_ids:
            self.lc._lib.ggspec_set_embeddings_layer_inp(self.ptr, int(il), True)
        self._layer_inputs_enabled = self._layer_inputs_enabled | {int(il) for il in layer_ids}
        self._layer_inputs_on = self._layer_inputs_enabled

    def pause_layer_inputs(self, paused: bool) -> None:
        """Stop (True) or resume extracting the enabled layers' inputs: a decode whose rows no
        draft reads (every sequence in it decodes plainly) then skips their copies."""
        if paused == (self._layer_inputs_on != self._layer_inputs_enabled) or not self._layer_inputs_enabled:
            return
        for il in self._layer_inputs_enabled:
            self.lc._lib.ggspec_set_embeddings_layer_inp(self.ptr, il, not paused)
        self._layer_inputs_on = frozenset() if paused else self._layer_inputs_enabled

    def check_layer_inputs(self, layer_ids, row0: int, n_rows: int) -> None:
        """Raise unless the last decode extracted these layers' inputs for rows row0..row0+n_rows-1
        (llama.cpp aborts the process on a read of anything else)."""
        if not self._extracted.issuperset(layer_ids):
            missing = [il for il in layer_ids if il not in self._extracted]
            raise LlamaError(f"the inputs of layer(s) {missing} were not extracted by the last decode "
                             f"(enable_layer_inputs before decoding)")
        if row0 < 0 or row0 + n_rows > self._n_rows:
            raise LlamaError(f"rows {row0}..{row0 + n_rows - 1} requested, the last decode had {self._n_rows}")

    def layer_inputs(self, layer_ids, n_rows: int, row0: int = 0) -> np.ndarray:
        """Inputs of the given layers for the last decode's batch rows row0..row0+n_rows-1,
        concatenated per row: shape (n_rows, len(layer_ids) * n_embd), float32, copied."""
        self.check_layer_inputs(layer_ids, row0, n_rows)
        n_embd = self.model.n_embd
        out = np.empty((n_rows, len(layer_ids) * n_embd), dtype=np.float32)
        if n_rows == 0:
            return out
        ids = tuple(layer_ids)
        arr = self._layer_id_arrays.get(ids)
        if arr is None:
            arr = self._layer_id_arrays[ids] = (ctypes.c_int32 * len(ids))(*ids)
        if self.lc._lib.ggspec_copy_layer_inputs(self.ptr, arr, len(ids), n_embd, row0, n_rows, out.ctypes.data):
            raise LlamaError(f"the inputs of target layers {list(ids)} were not extracted")
        return out

    # --- the draft's "nextn" output rows (DFlash2 selector lattice, DSpark confidence) ------------

    def enable_nextn(self, masked: bool) -> None:
        """Extract the graph's nextn rows on every decode: all batch rows (masked False) or only
        the output rows (masked True)."""
        self.lc._lib.ggspec_set_embeddings_nextn(self.ptr, True, masked)

    def nextn_ptr(self) -> int:
        """The address of the last decode's nextn rows (n_embd floats each), for batch fillers."""
        ptr = self.lc._lib.ggspec_get_embeddings_nextn(self.ptr)
        if not ptr:
            raise LlamaError("the last decode produced no nextn rows (enable_nextn before decoding)")
        return ctypes.addressof(ptr.contents)

    def nextn_view(self, n_rows: int) -> np.ndarray:
        """The last decode's nextn rows, shape (n_rows, n_embd): a view valid until the next decode."""
        if n_rows > self._n_rows:
            raise LlamaError(f"{n_rows} nextn rows requested, the last decode had {self._n_rows}")
        ptr = self.lc._lib.ggspec_get_embeddings_nextn(self.ptr)
        if not ptr:
            raise LlamaError("the last decode produced no nextn rows (enable_nextn before decoding)")
        return np.ctypeslib.as_array(ptr, shape=(n_rows, self.model.n_embd))

    # --- a reduced output head (patch 0014) -------------------------------------------------------

    def set_head_rows(self, head_model) -> None:
        """Score only `head_model`'s reduced draft vocabulary (Model.set_draft_vocab) wherever this
        context's graphs multiply by that model's output head (its own model's, or the target's
        a DFlash draft borrows); logits rows are then that many wide, column j token
        `logit_ids[j]`. None: the full head again."""
        rc = self.lc._lib.ggspec_set_head_rows(self.ptr, head_model.ptr if head_model is not None else None)
        if rc < 0:
            why = {-1: "no reduced draft vocabulary is set on the model",
                   -2: "its output head has a bias or a scale (their rows are not compacted)"}
            raise InputError(f"cannot score a reduced draft vocabulary with {self.model.path}: "
                             f"{why.get(rc, f'error {rc}')}", field="spec_draft_vocab")
        self.n_logits = rc
        self.logit_ids = head_model.draft_vocab if head_model is not None else None
        self._logits_key = (None, -1)

    # --- chained MTP drafting (patch 0011) ---------------------------------------------------------

    def set_mtp_chain(self, n_steps: int, confidence: bool = False, draft_vocab: bool = False) -> None:
        """Run n_steps draft steps per decode of this MTP context (0: one step per decode, as
        llama.cpp's loop): a decode then takes n_steps rows per sequence, step-major."""
        rc = self.lc._lib.ggspec_set_mtp_chain(self.ptr, n_steps, confidence, draft_vocab)
        if rc != 0:
            why = {-1: "not an MTP context", -2: f"the '{self.model.arch}' MTP graph has no chained mode "
                   "in this build (qwen35, qwen35moe and gemma4-assistant have)", -3: "no reduced draft vocabulary is set on the model",
                   -4: f"{n_steps} chained steps is out of range (0..64)"}
            raise InputError(f"cannot chain the MTP head's draft steps: {why.get(rc, f'error {rc}')}",
                             field="draft_chain")

    def chain_result(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """The last chained decode's n results, step-major: token ids and each argmax's top-10
        softmax probability (1.0 where confidence was not asked for)."""
        ids = np.empty(n, dtype=np.int32)
        norm = np.empty(n, dtype=np.float32)
        have = self.lc._lib.ggspec_mtp_chain_result(self.ptr, ids.ctypes.data, norm.ctypes.data, n)
        if have < n:
            raise LlamaError(f"the last MTP decode returned {have} chained results, {n} expected")
        return ids, 1.0 / norm

    def set_causal_attn(self, causal: bool) -> None:
        self.lc.llama_set_causal_attn(self.ptr, causal)

    # --- memory ----------------------------------------------------------------------------------

    def pos_max(self, seq_id: int = 0) -> int:
        return self.quick.llama_memory_seq_pos_max(self.memory, seq_id)

    def pos_min(self, seq_id: int = 0) -> int:
        """The first position a sequence's cells still hold (-1: none): past 0 where a window-sized
        sliding cache has dropped the cells behind its window."""
        return int(self.lc.llama_memory_seq_pos_min(self.memory, seq_id))

    def clear(self) -> None:
        self.lc.llama_memory_clear(self.memory, True)

    def can_truncate(self, p0: int, seq_id: int = 0) -> bool:
        """Whether `truncate(p0)` would be exact now. Always for attention caches; for recurrent
        models only when a state plane holds the state after position p0 - 1 (patch 0002)."""
        if not self.model.is_recurrent or p0 > self.pos_max(seq_id):
            return True
        return self.quick.ggspec_rs_can_rollback(self.ptr, seq_id, p0) == 1

    def truncate(self, p0: int, seq_id: int = 0) -> None:
        """Drop positions >= p0 of a sequence (roll back rejected tokens).

        Recurrent/hybrid models restore the state from a saved plane. The patched llama.cpp
        (0002) refuses, changing nothing, any rollback whose state no plane holds, including the
        old trap of rolling back a whole last batch without a kept input state; we check first so
        the refusal is a clear error.
        """
        if not self.model.is_recurrent:  # an attention cache: removing nothing is a no-op
            self.remove(p0, seq_id)
            return
        if p0 > self.pos_max(seq_id):
            return
        if not self.can_truncate(p0, seq_id):
            raise LlamaError(f"no recurrent state plane holds the state before position {p0}")
        if not self.quick.llama_memory_seq_rm(self.memory, seq_id, p0, -1):
            raise LlamaError(f"llama.cpp refused to remove positions >= {p0} of sequence {seq_id}")

    # --- prepared plans (patch 0012) ----------------------------------------------------------------

    def set_plan_pool(self, plans: int, max_tokens: int = 64) -> None:
        """Keep up to `plans` prepared graphs and scheduler plans for ubatches of at most
        `max_tokens` tokens (0: off, llama.cpp's one plan), so alternating shapes (draft, verify,
        inject) stop re-planning each other away."""
        self.lc._lib.ggspec_set_plan_pool(self.ptr, int(plans), int(max_tokens))
        self.plan_pool = (int(plans), int(max_tokens))

    def plan_stats(self) -> tuple[int, int, int]:
        """(graphs reused, of which from a parked plan, graphs built) since the context was made."""
        out = [ctypes.c_int32() for _ in range(3)]
        self.lc._lib.ggspec_get_plan_stats(self.ptr, *(ctypes.byref(x) for x in out))
        return tuple(int(x.value) for x in out)

    # --- recurrent state planes (patch 0002) -----------------------------------------------------

    def set_rs_layout(self, planes: int, lead: int) -> None:
        """Keep `planes` recurrent-state planes per sequence, `lead` of them holding the states
        after the first 1..lead tokens of a batch (plus one newest and one input plane);
        lead -1 is llama.cpp's default trailing layout. See ggspec.speculative.planes."""
        rc = self.lc._lib.ggspec_set_rs_planes(self.ptr, planes, lead)
        if rc != 0:
            why = {-1: "the context has no recurrent state planes", -2: "this model only supports the default layout",
                   -3: f"{planes} planes is out of range (2..{1 + self.n_rs_seq})",
                   -4: f"lead {lead} is out of range (0..{planes - 2})"}
            raise InputError(f"cannot set the recurrent plane layout: {why.get(rc, f'error {rc}')}")

    def rs_kept_counts(self, n_tokens: int) -> tuple[int, ...]:
        """After a batch of n_tokens, the token counts k whose state a plane keeps
        (0 = the input state, n_tokens = the newest)."""
        buf = (ctypes.c_int32 * (n_tokens + 1))()
        n = self.lc._lib.ggspec_rs_kept_counts(self.ptr, n_tokens, buf, n_tokens + 1)
        return tuple(buf[:n]) if n > 0 else ()

    def recurrent_state_bytes(self, seq_id: int = 0) -> int:
        """Bytes of one recurrent state (one plane) of a sequence."""
        return int(self.lc.llama_state_seq_get_size_ext(self.ptr, seq_id, self.lc.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY))

    def save_sequence(self, seq_id: int, partial: bool = False) -> bytearray:
        """A copy of one sequence's cache cells (llama_state_seq_get_data), which load_sequence
        puts back into any sequence of a context like this one (a server's host-memory prompt
        cache). `partial`: only the state that cannot be cut back to a prefix (a hybrid model's
        recurrent state, llama.cpp's PARTIAL_ONLY): a checkpoint of that state at the sequence's
        current position (llama-server's context checkpoints)."""
        flags = self.lc.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY if partial else 0
        size = int(self.lc.llama_state_seq_get_size_ext(self.ptr, seq_id, flags))
        data = bytearray(size)
        got = int(self.lc.llama_state_seq_get_data_ext(self.ptr, (ctypes.c_uint8 * size).from_buffer(data), size,
                                                        seq_id, flags)) if size else 0
        if got == 0:
            raise LlamaError(f"llama.cpp could not copy the cells of sequence {seq_id}: {last_log_error()}")
        del data[got:]
        return data

    def load_sequence(self, data: bytearray, seq_id: int, partial: bool = False) -> None:
        """Put cells saved by save_sequence into a sequence that holds none (`partial`: a
        checkpoint's state, which replaces the sequence's recurrent state and leaves its
        attention cells as they are)."""
        flags = self.lc.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY if partial else 0
        got = self.lc.llama_state_seq_set_data_ext(self.ptr, (ctypes.c_uint8 * len(data)).from_buffer(data),
                                                   len(data), seq_id, flags)
        if got == 0:
            raise LlamaError(f"llama.cpp could not load saved cells into sequence {seq_id}: {last_log_error()}")

    def share_cells(self, src: int, dst: int, p0: int = 0, p1: int = -1) -> None:
        """Make sequence `dst` hold the cells of `src` at positions [p0, p1) too (p1 -1: to the
        end). On a unified cache the cells gain a sequence id and nothing is copied: a token tree's
        branches share the prefix so, and the accepted branch gives its path to the sequence."""
        if not self.kv_unified:
            raise LlamaError("sharing cells between sequences needs a unified cache (kv_unified)")
        self.lc.llama_memory_seq_cp(self.memory, src, dst, p0, p1)

    def drop_sequence(self, seq_id: int) -> None:
        """Free every cell of a sequence (it finished or was cancelled)."""
        self.quick.llama_memory_seq_rm(self.memory, seq_id, -1, -1)

    def remove(self, p0: int, seq_id: int = 0) -> None:
        """Drop positions >= p0 from a non-recurrent cache (e.g. the draft's noise block)."""
        if not self.quick.llama_memory_seq_rm(self.memory, seq_id, p0, -1):
            raise LlamaError(f"llama.cpp refused to remove positions >= {p0} of sequence {seq_id}")

    # --- lifetime --------------------------------------------------------------------------------

    def _free(self, ptr) -> None:
        self.lc.llama_free(ptr)
        for _k, chain in self._pickers.values():  # the context held them; it is gone
            self.lc.llama_sampler_free(chain)
        self._pickers.clear()
