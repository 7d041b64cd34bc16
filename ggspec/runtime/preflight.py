"""Metadata and option checks that run before llama.cpp sees a file or a context request.

llama.cpp validates many hyperparameters with ``GGML_ASSERT`` (an abort), divides by others
(SIGFPE) or sizes buffers from them, so a file that parses as GGUF can still kill the process
(`load_hparams` in src/llama-model.cpp, `load_arch_hparams` in src/models/*.cpp, the graph
constructors' asserts, the CPU rope / norm kernels). Everything here mirrors one of those
checks of the pinned tree and turns it into one `InputError` line naming the file's role, the
key and the bad value. Values llama.cpp refuses cleanly itself (it throws, the load returns NULL
and ggspec reports it) or tolerates (an out-of-range pad token id is disabled with a warning)
are left alone unless a clearer message costs nothing.

`check_model(meta, what)` checks one file. Whether a context size fits the memory that is free is
ggspec.runtime.memory's estimate, not an assert of llama.cpp's.
"""

from __future__ import annotations

import math
from typing import Any

from ggspec.errors import InputError
from ggspec.runtime.gguf_meta import GGUFArray, GGUFMeta
from ggspec.values import is_int, is_number

# src/llama-hparams.h
LLAMA_MAX_LAYERS = 512
LLAMA_MAX_EXPERTS = 1024
# ggml/include/ggml.h
GGML_MAX_N_THREADS = 512
# context sizes and batch sizes are uint32 in llama_context_params, token positions int32
MAX_CTX = 2**31 - 1

# architectures whose every block is an MTP block (separate MTP drafters)
WHOLE_MTP_ARCHS = frozenset({"gemma4-assistant"})

# Graphs that assert n_embd_head_k == n_embd_head_v (GGML_ASSERT(n_embd_head == hparams.n_embd_head_k())),
# read from the pinned tree's src/models/*.cpp graph constructors (scripted, see tests/test_hostile_models.py).
HEAD_KV_EQUAL_ARCHS: frozenset[str] = frozenset({
    "afmoe", "apertus", "arcee", "arctic", "baichuan", "bailingmoe2", "bert", "bitnet", "bloom", "chameleon",
    "chatglm", "codeshell", "cogvlm", "cohere2", "cohere2moe", "command-r", "dbrx", "deci", "deepseek", "dots1",
    "dream", "ernie4_5", "ernie4_5-moe", "eurobert", "exaone", "exaone-moe", "exaone4", "falcon", "glm4", "glm4moe",
    "gpt2", "gptneox", "granite", "granite_swa", "granitehybrid", "granitemoe", "graniteswitch", "grok", "grovemoe",
    "hunyuan-dense", "hunyuan-moe", "hunyuan_vl", "hy_v3", "internlm2", "jais", "jais2", "jina-bert-v2",
    "jina-bert-v3", "laguna", "llada", "llada-moe", "llama", "llama-embed", "llama4", "maincoder", "maple", "mellum",
    "minicpm", "minimax-01", "minimax-m2", "minimax-m3", "mistral3", "modern-bert", "mpt", "muse-glimmer",
    "nanbeige", "nemotron", "nemotron_h", "nemotron_h_moe", "neo-bert", "nomic-bert", "nomic-bert-moe", "olmo",
    "olmo2", "olmoe", "openelm", "orion", "paddleocr", "pangu-embedded", "phi2", "phi3", "phimoe", "plamo",
    "pockettts", "qwen", "qwen2", "qwen2moe", "qwen2vl", "qwen3", "qwen35", "qwen35moe", "qwen3moe", "qwen3tts",
    "qwen3vl", "qwen3vlmoe", "refact", "rnd1", "seed_oss", "smallthinker", "smollm3", "spark2_5", "stablelm",
    "starcoder", "starcoder2", "t5", "t5encoder", "talkie", "xverse",
})

# Graphs that assert the rotary dimension count equals the head size (GGML_ASSERT(n_embd_head == n_rot)).
ROT_EQUALS_HEAD_ARCHS: frozenset[str] = frozenset({
    "apertus", "arcee", "arctic", "baichuan", "chameleon", "codeshell", "cogvlm", "cohere2moe", "dbrx", "deci",
    "deepseek", "dots1", "dream", "ernie4_5", "ernie4_5-moe", "exaone", "exaone-moe", "exaone4", "falcon", "granite",
    "granite_swa", "granitemoe", "graniteswitch", "grok", "grovemoe", "hunyuan-dense", "hunyuan-moe", "hunyuan_vl",
    "hy_v3", "internlm2", "jais2", "llada", "llada-moe", "llama", "llama-embed", "llama4", "maincoder", "mellum",
    "minicpm", "mistral3", "olmo", "olmo2", "olmoe", "orion", "paddleocr", "pangu-embedded", "plamo", "pockettts",
    "qwen2", "qwen2moe", "qwen2vl", "qwen3", "qwen3moe", "qwen3tts", "qwen3vl", "qwen3vlmoe", "rnd1", "seed_oss",
    "smallthinker", "smollm3", "starcoder2", "talkie", "xverse",
})

# Gated delta-net hybrids: recurrent sizes from ssm.*, layer kinds from full_attention_interval.
GATED_DELTA_NET_ARCHS: frozenset[str] = frozenset({"qwen35", "qwen35moe", "qwen3next"})

# Architectures without attention heads (a head count of 0 is legal there).
_NO_HEADS_ARCHS: frozenset[str] = frozenset({"mamba", "mamba2", "rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7",
                                             "wavtokenizer-dec", "clip"})

class _File:
    """One file's metadata with error messages that name its role, the key and the value."""

    def __init__(self, meta: GGUFMeta, what: str) -> None:
        self.meta, self.what, self.a = meta, what, meta.arch

    def fail(self, key: str, value: Any, why: str) -> None:
        shown = "NaN" if isinstance(value, float) and math.isnan(value) else value
        label = "model" if self.what == "model" else f"{self.what} model"
        raise InputError(f"{label} {self.meta.path}: {key} = {shown} {why}")

    def raw(self, suffix: str) -> tuple[str, Any]:
        key = f"{self.a}.{suffix}"
        return key, self.meta.kv.get(key)

    def uint(self, suffix: str, default: int | None = None) -> tuple[str, int | None]:
        """A scalar integer key (None when absent or not an integer: llama.cpp refuses the type itself)."""
        key, v = self.raw(suffix)
        if v is None:
            return key, default
        if not is_int(v):
            return key, None
        if v < 0:
            self.fail(key, v, "is negative")
        return key, v

    def per_layer(self, suffix: str, n_layer: int) -> tuple[str, list[int] | None]:
        """A key that is either one integer or one integer per layer (llama.cpp's get_key_or_arr)."""
        key, v = self.raw(suffix)
        if v is None:
            return key, None
        if isinstance(v, GGUFArray):
            self.fail(key, f"<array of {v.count}>", f"must have one entry per layer ({n_layer})")
        if isinstance(v, list):
            if len(v) != n_layer:
                self.fail(key, v, f"has {len(v)} entries, but the model has {n_layer} layers (block_count)")
            if not all(is_int(x) for x in v):
                return key, None
            bad = [x for x in v if x < 0]
            if bad:
                self.fail(key, v, "has negative entries")
            return key, list(v)
        if not is_int(v):
            return key, None
        if v < 0:
            self.fail(key, v, "is negative")
        return key, [v] * n_layer


def check_model(meta: GGUFMeta, what: str = "model") -> None:
    """Refuse metadata that would make llama.cpp abort, divide by zero or hang while loading the
    file or running it. `what` names the file ("target", "draft") in the message."""
    f = _File(meta, what)
    n_layer = _check_layers(f)
    _check_norms(f)
    _check_experts(f, n_layer)
    heads = _check_attention(f, n_layer)
    if heads is not None:
        _check_rope(f, *heads)
    if f.a in GATED_DELTA_NET_ARCHS:
        _check_gated_delta_net(f, n_layer)
    _check_tokenizer(f)
    if f.a == "dflash":
        _check_dflash(f, n_layer)


def _check_layers(f: _File) -> int:
    key, n = f.uint("block_count")
    if n is None:  # absent or not an integer: llama.cpp throws "key not found" / "wrong type"
        return 0
    if not 1 <= n <= LLAMA_MAX_LAYERS:
        f.fail(key, n, f"is out of range (llama.cpp takes 1..{LLAMA_MAX_LAYERS} layers)")
    key_nextn, nextn = f.uint("nextn_predict_layers", 0)
    # a Gemma 4 assistant is nothing but MTP layers (nextn_predict_layers = block_count)
    if nextn is not None and (nextn > n if f.a in WHOLE_MTP_ARCHS else nextn >= n):
        f.fail(key_nextn, nextn, f"leaves no layers to run (block_count is {n})")
    key_e, n_embd = f.uint("embedding_length")
    if n_embd == 0:
        f.fail(key_e, n_embd, "must be at least 1")
    key_c, n_ctx_train = f.raw("context_length")
    if is_int(n_ctx_train) and n_ctx_train < 0:
        f.fail(key_c, n_ctx_train, "is negative")
    return n


def _check_norms(f: _File) -> None:
    # the CPU norm kernels assert eps >= 0 (NaN fails it too); an infinite eps zeroes every row
    for key, v in f.meta.kv.items():
        if key.startswith(f"{f.a}.") and key.endswith("epsilon") and is_number(v) and not (math.isfinite(v) and v >= 0):
            f.fail(key, v, "must be a finite number >= 0")


def _check_experts(f: _File, n_layer: int) -> None:
    # load_hparams: GGML_ASSERTs on the expert counts
    key_n, n_expert = f.uint("expert_count", 0)
    key_u, used = f.per_layer("expert_used_count", n_layer)
    key_g, groups = f.uint("expert_group_count", 0)
    key_gu, group_used = f.uint("expert_group_used_count", 0)
    if n_expert is None or groups is None or group_used is None:
        return
    used_max = max(used) if used else 0
    if n_expert > LLAMA_MAX_EXPERTS:
        f.fail(key_n, n_expert, f"is above llama.cpp's maximum of {LLAMA_MAX_EXPERTS} experts")
    if n_expert == 0:
        if used_max:
            f.fail(key_u, used_max, "needs experts, but the model has none (expert_count 0)")
        if groups:
            f.fail(key_g, groups, "needs experts, but the model has none (expert_count 0)")
        return
    if used_max == 0:
        f.fail(key_u, used_max, f"must be at least 1 with {n_expert} experts")
    if used_max > n_expert:
        f.fail(key_u, used_max, f"is more than the {n_expert} experts (expert_count)")
    if groups >= n_expert:
        f.fail(key_g, groups, f"must be below expert_count ({n_expert})")
    if groups > 1:
        if n_expert % groups:
            f.fail(key_g, groups, f"does not divide expert_count ({n_expert})")
        if not 0 < group_used < groups:
            f.fail(key_gu, group_used, f"must be in 1..{groups - 1} (expert_group_count {groups})")


def _check_attention(f: _File, n_layer: int) -> tuple[int, int, int] | None:
    """Head counts and sizes; returns (n_head of layer 0, key length, value length) or None."""
    if not n_layer or f.a in _NO_HEADS_ARCHS:
        return None
    key_h, heads = f.per_layer("attention.head_count", n_layer)
    key_kv, heads_kv = f.per_layer("attention.head_count_kv", n_layer)
    if heads is None:
        return None
    if heads_kv is None:
        heads_kv = heads
    if max(heads) == 0:
        f.fail(key_h, heads[0] if len(set(heads)) == 1 else heads, "must be at least 1")
    if max(heads_kv) == 0:
        f.fail(key_kv, heads_kv[0] if len(set(heads_kv)) == 1 else heads_kv, "must be at least 1")
    uniform = len(set(heads)) == 1 and len(set(heads_kv)) == 1
    for il, (h, hkv) in enumerate(zip(heads, heads_kv)):
        if hkv == 0:
            continue  # a layer without KV heads (recurrent layers of some hybrids); llama.cpp guards it
        if hkv > h or h % hkv:  # grouped-query attention needs whole groups
            f.fail(key_kv, hkv, f"must divide attention.head_count ({h}){'' if uniform else f' in layer {il}'}")
    n_head = heads[0] or max(heads)
    _, n_embd = f.uint("embedding_length")
    key_k, head_k = f.uint("attention.key_length")
    key_v, head_v = f.uint("attention.value_length")
    for key, val in ((key_k, head_k), (key_v, head_v)):
        if val == 0:
            f.fail(key, val, "must be at least 1")
    if (head_k is None or head_v is None) and n_embd:
        # the head size defaults to embedding_length / head_count
        if n_embd % n_head:
            f.fail(key_h, n_head, f"does not divide embedding_length ({n_embd}) and the file gives no "
                                  "attention.key_length / value_length")
        head_k = head_k if head_k is not None else n_embd // n_head
        head_v = head_v if head_v is not None else n_embd // n_head
    if head_k is None or head_v is None:
        return None
    if f.a in HEAD_KV_EQUAL_ARCHS and head_k != head_v:
        f.fail(key_v, head_v, f"must equal attention.key_length ({head_k}) for architecture '{f.a}'")
    for suffix in ("attention.key_length_swa", "attention.value_length_swa"):
        key, val = f.uint(suffix)
        if val == 0:
            f.fail(key, val, "must be at least 1")
    return n_head, head_k, head_v


def _check_rope(f: _File, n_head: int, head_k: int, head_v: int) -> None:
    # the CPU rope kernel asserts n_dims <= head size and n_dims even; 0 hangs qwen35's M-RoPE
    key, n_rot = f.uint("rope.dimension_count")
    if n_rot is not None:
        if n_rot == 0 or n_rot % 2 or n_rot > head_k:
            f.fail(key, n_rot, f"must be an even number in 2..{head_k} (the key head size)")
        if f.a in ROT_EQUALS_HEAD_ARCHS and n_rot != head_v:
            f.fail(key, n_rot, f"must equal the head size ({head_v}) for architecture '{f.a}'")
    key_s, n_rot_swa = f.uint("rope.dimension_count_swa")
    _, head_k_swa = f.uint("attention.key_length_swa", head_k)
    if n_rot_swa is not None and (n_rot_swa == 0 or n_rot_swa % 2 or n_rot_swa > (head_k_swa or head_k)):
        f.fail(key_s, n_rot_swa, f"must be an even number in 2..{head_k_swa or head_k}")
    for base in ("rope.freq_base", "rope.freq_base_swa"):  # NaN, 0 or negative: no abort, only garbage
        key_b, freq = f.raw(base)
        if is_number(freq) and not (math.isfinite(freq) and freq > 0):
            f.fail(key_b, freq, "must be a finite number > 0")
    key_sec, sections = f.raw("rope.dimension_sections")
    if isinstance(sections, list) and all(is_int(x) for x in sections):
        rot = n_rot if n_rot is not None else head_k
        if any(x < 0 for x in sections):
            f.fail(key_sec, sections, "has negative entries")
        if sum(sections) > rot:
            f.fail(key_sec, sections, f"add up to more than the rotary dimensions ({rot})")


def _check_gated_delta_net(f: _File, n_layer: int) -> None:
    sizes = {}
    for suffix in ("ssm.conv_kernel", "ssm.state_size", "ssm.group_count", "ssm.time_step_rank", "ssm.inner_size"):
        key, v = f.uint(suffix)
        if v == 0:
            f.fail(key, v, "must be at least 1")
        sizes[suffix] = (key, v)
    (_, d_state), (_, n_group), (key_dt, dt_rank), (key_in, d_inner) = (
        sizes["ssm.state_size"], sizes["ssm.group_count"], sizes["ssm.time_step_rank"], sizes["ssm.inner_size"])
    if None not in (d_state, dt_rank, d_inner) and d_inner != d_state * dt_rank:
        # head_v_dim = inner_size / time_step_rank must equal state_size (the delta-net op asserts S_k == S_v)
        f.fail(key_in, d_inner, f"must be ssm.state_size x ssm.time_step_rank ({d_state} x {dt_rank})")
    if n_group and dt_rank and dt_rank % n_group:
        f.fail(key_dt, dt_rank, f"must be a multiple of ssm.group_count ({n_group})")
    key_r, rec = f.raw("attention.recurrent_layers")
    if isinstance(rec, list) and len(rec) != n_layer:
        f.fail(key_r, rec, f"has {len(rec)} entries, but the model has {n_layer} layers (block_count)")
    key_i, interval = f.uint("full_attention_interval")
    if interval == 0 and rec is None:
        f.fail(key_i, interval, "must be at least 1")  # llama.cpp divides by it


def _check_tokenizer(f: _File) -> None:
    kv, n_vocab = f.meta.kv, f.meta.n_vocab
    model = kv.get("tokenizer.ggml.model")
    if model is None:
        return  # llama.cpp refuses the file itself ("key not found")
    if model == "none":  # llama.cpp loads it, then asserts at the first tokenize (and a draft has no mask token)
        f.fail("tokenizer.ggml.model", model, "means the file has no tokenizer, and ggspec needs one")
    if n_vocab == 0:
        f.fail("tokenizer.ggml.tokens", "[]", "is empty (the model has no vocabulary)")
    # tokenize() asserts these ids exist when the file asks to add them (an id outside the
    # vocabulary is disabled with only a warning at load time)
    for flag, name in (("add_bos_token", "bos_token_id"), ("add_eos_token", "eos_token_id"),
                       ("add_sep_token", "seperator_token_id")):
        key = f"tokenizer.ggml.{name}"
        tid = kv.get(key)
        if kv.get(f"tokenizer.ggml.{flag}") is True and is_int(tid) and not 0 <= tid < n_vocab:
            f.fail(key, tid, f"is outside the vocabulary (0..{n_vocab - 1}) and tokenizer.ggml.{flag} is set")
    key = "tokenizer.ggml.mask_token_id"
    tid = kv.get(key)
    if f.a == "dflash" and tid is not None and not is_int(tid):
        f.fail(key, repr(tid), "must be a token id")
    if f.a == "dflash" and is_int(tid) and not 0 <= tid < n_vocab:
        f.fail(key, tid, f"is outside the vocabulary (0..{n_vocab - 1})")


def _check_dflash(f: _File, n_layer: int) -> None:
    key, bs = f.raw("block_size")
    if bs is not None and not is_int(bs):
        f.fail(key, repr(bs), "must be an integer")
    if is_int(bs) and bs < 2:
        f.fail(key, bs, "must be at least 2 (the noise block is [last token, MASK x (block_size - 1)])")
    key, layers = f.raw("target_layers")
    if isinstance(layers, GGUFArray) or (layers is not None and not isinstance(layers, list)):
        shown = f"<{len(layers)} entries>" if isinstance(layers, GGUFArray) else repr(layers)
        f.fail(key, shown, "must be a short list of layer ids")
    if isinstance(layers, list):
        if not layers:
            f.fail(key, "[]", "is empty")
        if any(not is_int(x) or x < 0 for x in layers):
            f.fail(key, layers, "must be layer ids >= 0")
    _, hc = f.uint("hyper_connection.count", 0)
    if hc:  # DSpark (DeepSeek-V4) backbone: load_arch_hparams asserts both
        for suffix in ("attention.output_group_count", "attention.sliding_window"):
            key, v = f.uint(suffix)
            if v == 0:
                f.fail(key, v, "must be at least 1 for a DSpark draft")
