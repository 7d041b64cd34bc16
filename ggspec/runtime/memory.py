"""How much memory a context will take, estimated from the files' metadata before llama.cpp allocates it.

llama.cpp sizes the KV caches, the recurrent state planes and the attention buffers when a context
is made, and a context that does not fit dies of bad_alloc after a minute of allocating (or the
machine swaps). `check_memory` adds the estimates of every model that gets a context on the CPU,
with their weights, and refuses a context size above what is free in one line saying what would fit.
The estimates err upwards; they read the same metadata keys as ggspec.runtime.preflight's checks.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from ggspec.errors import InputError
from ggspec.runtime.gguf_meta import GGUFMeta
from ggspec.runtime.preflight import _NO_HEADS_ARCHS, GATED_DELTA_NET_ARCHS, _File
from ggspec.values import is_int

# Cache types (CACHE_TYPES in ggspec.runtime.context) -> bytes per element
CACHE_TYPE_BYTES: dict[str, float] = {
    "f32": 4.0, "f16": 2.0, "bf16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32, "q4_1": 20 / 32,
    "q5_0": 22 / 32, "q5_1": 24 / 32, "iq4_nl": 18 / 32,
}


def _layers_kv(meta: GGUFMeta) -> Iterable[tuple[int, int, bool]]:
    """(K width, V width, sliding-window?) of every layer that has a KV cache."""
    f = _File(meta, "model")
    n = meta.n_layer
    if not n or f.a in _NO_HEADS_ARCHS:
        return []
    try:
        _, heads = f.per_layer("attention.head_count", n)
        _, heads_kv = f.per_layer("attention.head_count_kv", n)
    except InputError:
        return []
    heads = heads or [0] * n
    heads_kv = heads_kv or heads
    n_head = max(heads) or 1
    _, head_k = f.uint("attention.key_length", meta.n_embd // n_head)
    _, head_v = f.uint("attention.value_length", meta.n_embd // n_head)
    _, head_k_swa = f.uint("attention.key_length_swa", head_k)
    _, head_v_swa = f.uint("attention.value_length_swa", head_v)
    rec = meta.arch_key("attention.recurrent_layers")
    interval = meta.arch_key("full_attention_interval")
    swa = meta.arch_key("attention.sliding_window_pattern")
    has_swa = is_int(meta.arch_key("attention.sliding_window")) and meta.arch_key("attention.sliding_window") > 0
    out = []
    for il in range(n):
        if isinstance(rec, list) and il < len(rec) and rec[il]:
            continue
        if meta.arch in GATED_DELTA_NET_ARCHS and not isinstance(rec, list):
            k = interval if is_int(interval) and interval > 0 else 4
            if il < meta.n_layer_main and (il + 1) % k:
                continue
        if isinstance(swa, list):
            is_swa = has_swa and il < len(swa) and bool(swa[il])
        else:  # a period: every n-th layer is global (llama_hparams::set_swa_pattern)
            period = swa if is_int(swa) else _SWA_PERIODS.get(meta.arch, 1)
            is_swa = has_swa and (period == 0 or il % period < period - 1)
        hk, hv = (head_k_swa, head_v_swa) if is_swa else (head_k, head_v)
        out.append(((hk or 0) * heads_kv[il], (hv or 0) * heads_kv[il], is_swa))
    return out


# load_swa_pattern defaults where a file gives no attention.sliding_window_pattern (1: no SWA layers)
# (the count of sliding-window layers is what matters here, so dense-first patterns count the same)
_SWA_PERIODS = {"gemma2": 2, "gemma3": 6, "gemma3n": 5, "gemma-embedding": 6, "gpt-oss": 2, "cohere2": 4,
                "cohere2moe": 4, "afmoe": 4, "exaone4": 4, "exaone-moe": 4, "llama4": 4, "mellum": 4,
                "muse-glimmer": 4, "olmo2": 4, "smallthinker": 4, "laguna": 4, "plamo3": 8}


def kv_cache_bytes(meta: GGUFMeta, n_ctx: int, type_k: str, type_v: str, n_ubatch: int = 512) -> int:
    """An estimate (from above) of the KV cache llama.cpp allocates for one sequence of n_ctx cells.
    Sliding-window layers keep at most the window plus one ubatch."""
    n_ctx = -(-n_ctx // 256) * 256  # llama.cpp pads the context to 256
    window = meta.arch_key("attention.sliding_window")
    bk, bv = CACHE_TYPE_BYTES.get(type_k, 4.0), CACHE_TYPE_BYTES.get(type_v, 4.0)
    total = 0.0
    for k, v, is_swa in _layers_kv(meta):
        cells = min(n_ctx, window + n_ubatch) if is_swa and is_int(window) else n_ctx
        total += cells * (k * bk + v * bv)
    return int(total)


def recurrent_bytes(meta: GGUFMeta, planes: int) -> int:
    """Recurrent state of one sequence with `planes` state planes (gated delta-net hybrids)."""
    if meta.arch not in GATED_DELTA_NET_ARCHS:
        return 0
    def g(suffix: str) -> int:
        v = meta.arch_key(suffix)
        return v if is_int(v) and v > 0 else 0

    d_conv, d_state, n_group, d_inner = g("ssm.conv_kernel"), g("ssm.state_size"), g("ssm.group_count"), g("ssm.inner_size")
    rec = meta.arch_key("attention.recurrent_layers")
    n_rec = sum(bool(x) for x in rec) if isinstance(rec, list) else meta.n_layer_main * 3 // 4
    per_layer = (max(d_conv - 1, 0) * (d_inner + 2 * n_group * d_state) + d_state * d_inner) * 4
    return n_rec * per_layer * max(planes, 1)


def attention_buffer_bytes(meta: GGUFMeta, n_ctx: int, n_ubatch: int) -> int:
    """The largest attention buffers of one ubatch against the whole cache, which the scheduler
    reserves up front: the KQ mask and (flash attention off, the CPU default) the KQ scores of
    every head, f32."""
    n_ctx = -(-n_ctx // 256) * 256
    f = _File(meta, "model")
    if not _layers_kv(meta):
        return 0
    try:
        _, heads = f.per_layer("attention.head_count", meta.n_layer)
    except InputError:
        return 0
    return n_ctx * n_ubatch * 4 * (1 + max(heads or [0]))


def mem_available() -> int | None:
    """MemAvailable from /proc/meminfo in bytes (None where there is no such file)."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def check_memory(models: list[tuple[GGUFMeta, int]], n_ctx: int, type_k: str, type_v: str, n_ubatch: int,
                 available: int | None = None) -> None:
    """Refuse a context size whose KV caches (+ recurrent state planes) cannot fit in the memory
    that is free, before llama.cpp spends a minute allocating it and dies of bad_alloc.
    `models`: (metadata, recurrent planes) of every model that gets a context on the CPU."""
    available = mem_available() if available is None else available
    if not available:
        return

    def need(c: int) -> int:
        return sum(kv_cache_bytes(m, c, type_k, type_v, n_ubatch) + recurrent_bytes(m, p)
                   + attention_buffer_bytes(m, c, n_ubatch) for m, p in models)

    total = need(n_ctx)
    weights = sum(os.path.getsize(m.path) for m, _ in models if m.path.is_file())
    if total + weights <= available:
        return
    per_cell = max(need(2 * 256) - need(256), 1) / 256
    fits = int((available - weights - need(256) + 256 * per_cell) // per_cell) // 256 * 256
    hint = f"a context of at most about {fits} fits" if fits >= 256 else "no context fits beside the weights"
    raise InputError(f"context size {n_ctx} needs {_gib(total)} for the KV cache, recurrent state and "
                     f"attention buffers (+ {_gib(weights)} of weights), but only {_gib(available)} of memory "
                     f"is available: {hint}", field="n_ctx")
