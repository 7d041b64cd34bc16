"""Hostile model files and options: metadata and settings that llama.cpp asserts on, divides by
or allocates from must end in one `error:` line and exit 1 before llama.cpp sees them; legal
edge values must still run.

Every bad file is a tiny fixture with one or two metadata keys rewritten (tensors and data
copied byte for byte), run through the real CLI in a subprocess: an abort, SIGFPE or segfault
shows up as a negative return code, a hang as a timeout.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import run_cli
from helpers.gguf_edit import rewrite_gguf
from llama_tree import graph_sources

from ggspec.catalogue.tiny import ensure_tiny_pair

TIMEOUT = 60


def test_rewrite_without_changes_is_byte_identical(dense_pair, tmp_path):
    for src in (dense_pair.target, dense_pair.draft):
        assert rewrite_gguf(src, tmp_path / "same.gguf", {}).read_bytes() == src.read_bytes()


# --- the sweep -----------------------------------------------------------------------------------

def _assert_one_line_error(proc, needle: str) -> None:
    assert proc.returncode == 1, f"rc={proc.returncode}\n{proc.stderr[-2000:]}"
    assert "Traceback" not in proc.stderr, proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1, proc.stderr
    assert needle in errors[0], errors[0]


@pytest.fixture(scope="module")
def pairs(dense_pair, hybrid_pair, fixture_dir):
    return {"dense": dense_pair, "hybrid": hybrid_pair, "hybrid-mtp": ensure_tiny_pair(fixture_dir, "hybrid-mtp")}


NAN, INF = float("nan"), float("inf")
Q3, Q35, DF = "qwen3.", "qwen35.", "dflash."
ALL_RECURRENT_KEYS_GONE = {Q35 + "attention.recurrent_layers": None}

# (id, pair kind, file role, metadata changes, what llama.cpp did with it, needle)
BAD_FILES = [
    ("block_count_0", "dense", "target", {Q3 + "block_count": ("u32", 0)}, "abort", "block_count = 0"),
    ("block_count_513", "dense", "target", {Q3 + "block_count": ("u32", 513)}, "abort: > LLAMA_MAX_LAYERS",
     "block_count = 513"),
    ("nextn_over_block_count", "dense", "target", {Q3 + "nextn_predict_layers": ("u32", 5)}, "abort",
     "nextn_predict_layers = 5"),
    ("rms_eps_nan", "dense", "target", {Q3 + "attention.layer_norm_rms_epsilon": ("f32", NAN)}, "abort: eps >= 0",
     "layer_norm_rms_epsilon = NaN"),
    ("rms_eps_negative", "dense", "target", {Q3 + "attention.layer_norm_rms_epsilon": ("f32", -1.0)}, "abort",
     "layer_norm_rms_epsilon = -1.0"),
    ("rms_eps_inf", "dense", "target", {Q3 + "attention.layer_norm_rms_epsilon": ("f32", INF)}, "garbage output",
     "layer_norm_rms_epsilon = inf"),
    ("rope_freq_base_nan", "dense", "target", {Q3 + "rope.freq_base": ("f32", NAN)}, "garbage output",
     "rope.freq_base = NaN"),
    ("rope_freq_base_0_draft", "dense", "draft", {DF + "rope.freq_base": ("f32", 0.0)}, "garbage drafts",
     "rope.freq_base = 0.0"),
    ("embedding_length_0", "dense", "target", {Q3 + "embedding_length": ("u32", 0)}, "", "embedding_length = 0"),
    ("head_count_0", "dense", "target", {Q3 + "attention.head_count": ("u32", 0)}, "", "head_count = 0"),
    ("head_count_kv_not_dividing", "dense", "target", {Q3 + "attention.head_count_kv": ("u32", 3)}, "",
     "head_count_kv = 3"),
    ("head_count_kv_above_heads", "dense", "target", {Q3 + "attention.head_count_kv": ("u32", 8)}, "",
     "head_count_kv = 8"),
    ("key_length_0", "dense", "target", {Q3 + "attention.key_length": ("u32", 0)}, "", "key_length = 0"),
    ("per_layer_array_short", "dense", "target", {Q3 + "attention.head_count": ("arr", "u32", [4, 4])}, "",
     "head_count = [4, 4]"),
    ("rope_dims_above_head", "dense", "target", {Q3 + "rope.dimension_count": ("u32", 64)}, "abort",
     "rope.dimension_count = 64"),
    ("rope_dims_odd", "dense", "target", {Q3 + "rope.dimension_count": ("u32", 31)}, "abort",
     "rope.dimension_count = 31"),
    ("experts_without_used", "dense", "target", {Q3 + "expert_count": ("u32", 4)}, "abort", "expert_used_count = 0"),
    ("used_experts_without_experts", "dense", "target", {Q3 + "expert_used_count": ("u32", 2)}, "abort",
     "expert_used_count = 2"),
    ("empty_vocabulary", "dense", "target", {"tokenizer.ggml.tokens": ("arr", "str", []),
                                             "tokenizer.ggml.token_type": ("arr", "i32", [])}, "",
     "tokenizer.ggml.tokens = []"),
    ("bos_outside_vocab_added", "dense", "target", {"tokenizer.ggml.bos_token_id": ("u32", 9999),
                                                    "tokenizer.ggml.add_bos_token": ("bool", True)},
     "abort at tokenize", "bos_token_id = 9999"),
    ("full_attention_interval_0", "hybrid", "target",
     {**ALL_RECURRENT_KEYS_GONE, Q35 + "full_attention_interval": ("u32", 0)}, "SIGFPE", "full_attention_interval = 0"),
    ("ssm_inner_size_wrong", "hybrid", "target", {Q35 + "ssm.inner_size": ("u32", 100)}, "abort",
     "ssm.inner_size = 100"),
    ("ssm_time_step_rank_0", "hybrid", "target", {Q35 + "ssm.time_step_rank": ("u32", 0)}, "",
     "ssm.time_step_rank = 0"),
    ("ssm_groups_not_dividing", "hybrid", "target", {Q35 + "ssm.group_count": ("u32", 3)}, "",
     "ssm.group_count (3)"),
    ("rope_sections_too_wide", "hybrid", "target", {Q35 + "rope.dimension_sections": ("arr", "i32", [30, 30, 30, 0])},
     "abort", "rope.dimension_sections = [30, 30, 30, 0]"),
    ("rope_dims_0_hybrid", "hybrid", "target", {Q35 + "rope.dimension_count": ("u32", 0)}, "hang",
     "rope.dimension_count = 0"),
    ("mtp_blocks_are_all_layers", "hybrid-mtp", "target", {Q35 + "nextn_predict_layers": ("u32", 5)}, "",
     "nextn_predict_layers = 5"),
    ("draft_block_count_0", "dense", "draft", {DF + "block_count": ("u32", 0)}, "abort", "dflash.block_count = 0"),
    ("draft_block_count_600", "dense", "draft", {DF + "block_count": ("u32", 600)}, "abort",
     "dflash.block_count = 600"),
    ("draft_rms_eps_nan", "hybrid", "draft", {DF + "attention.layer_norm_rms_epsilon": ("f32", NAN)}, "abort",
     "layer_norm_rms_epsilon = NaN"),
    ("draft_rope_dims_above_head", "dense", "draft", {DF + "rope.dimension_count": ("u32", 64)}, "abort",
     "dflash.rope.dimension_count = 64"),
    ("draft_experts", "dense", "draft", {DF + "expert_count": ("u32", 2)}, "abort", "dflash.expert_used_count = 0"),
    ("draft_block_size_1", "dense", "draft", {DF + "block_size": ("u32", 1)}, "", "dflash.block_size = 1"),
    ("draft_target_layer_negative", "dense", "draft", {DF + "target_layers": ("arr", "i32", [-1, 3])}, "",
     "dflash.target_layers = [-1, 3]"),
    ("draft_without_tokenizer", "dense", "draft", {"tokenizer.ggml.model": ("str", "none")},
     "tokenize asserts / no mask token", "tokenizer.ggml.model = none"),
    ("draft_block_size_not_an_int", "dense", "draft", {DF + "block_size": ("str", "eight")}, "traceback",
     "dflash.block_size = 'eight'"),
]


@pytest.mark.parametrize("case", BAD_FILES, ids=[c[0] for c in BAD_FILES])
def test_bad_metadata(case, pairs, tmp_path):
    name, kind, role, changes, _was, needle = case
    pair = pairs[kind]
    bad = rewrite_gguf(getattr(pair, role), tmp_path / f"{name}.gguf", changes)
    target, draft = (bad, pair.draft) if role == "target" else (pair.target, bad)
    proc = run_cli("run", "-m", str(target), "-md", str(draft), "-n", "4", "-t", "1", "-c", "256", "-p", "def f",
                   timeout=TIMEOUT)
    _assert_one_line_error(proc, needle)
    assert f"{role} model" in proc.stderr or role == "draft" and "DFlash draft" in proc.stderr


def _dense(pairs, *args: str, spec: bool = True):
    p = pairs["dense"]
    models = ("-m", str(p.target), "-md", str(p.draft)) if spec else ("-m", str(p.target), "--no-spec")
    return run_cli("run", *models, "-n", "4", "-t", "1", "-p", "def f", *args, timeout=TIMEOUT)


# (id, options, what llama.cpp did with them, needle); the tiny draft's block is 8: n_max 7
BAD_OPTIONS = [
    ("ubatch_below_noise_block", ("-ub", "4"), "abort: non-causal ubatch", "-ub: physical batch size 4"),
    ("batch_below_verify_block", ("-b", "1"), "error after output began", "-b: batch size 1"),
    ("context_below_one_block", ("-c", "1"), "error after output began", "-c: context size 1"),
    ("context_wraps_32_bits", ("-c", "4294967296"), "silently the training context", "-c: context size 4294967296"),
    ("batch_wraps_32_bits", ("-b", "4294967297"), "wrapped to 1", "-b: batch size 4294967297"),
    ("context_beyond_memory", ("-c", "100000000"), "a minute of allocation, bad_alloc", "GiB available"),
    # (so large that even a simulated context's bookkeeping fails: the metadata estimate answers)
    ("context_far_beyond_memory", ("-c", "1000000000"), "a minute of allocation, bad_alloc", "memory is available"),
    ("context_beyond_memory_unfitted", ("-c", "1000000000", "--no-fit"), "a minute of allocation, bad_alloc",
     "memory is available"),
    ("threads_beyond_ggml", ("-t", "100000"), "SIGSEGV", "-t: n_threads 100000"),
]


@pytest.mark.parametrize("case", BAD_OPTIONS, ids=[c[0] for c in BAD_OPTIONS])
def test_bad_options(case, pairs):
    _name, args, _was, needle = case
    _assert_one_line_error(_dense(pairs, *args), needle)


def test_context_beyond_memory_says_what_fits(pairs):
    proc = _dense(pairs, "-c", "100000000", spec=False)
    _assert_one_line_error(proc, "GiB")
    fits = int(re.search(r"-c: context size \d+ does not fit: host needs .* a context of at most (\d+) fits",
                         proc.stderr).group(1))
    assert fits >= 4096
    # without the fit, the metadata estimate (runtime.memory) says so too, from above
    proc = _dense(pairs, "-c", "100000000", "--no-fit", spec=False)
    about = int(re.search(r"-c: context size \d+ needs .* at most about (\d+) fits", proc.stderr).group(1))
    assert 4096 <= about <= fits


def test_memory_estimate(pairs):
    from ggspec.errors import InputError
    from ggspec.runtime.gguf_meta import read_meta
    from ggspec.runtime.memory import check_memory, kv_cache_bytes, recurrent_bytes

    dense = read_meta(pairs["dense"].target)
    # 4 layers x 256 cells x (K + V: 2 KV heads x 32) x 2 bytes (f16); contexts are padded to 256
    assert kv_cache_bytes(dense, 256, "f16", "f16") == 4 * 256 * (64 + 64) * 2
    assert kv_cache_bytes(dense, 1, "f32", "q8_0") == 4 * 256 * (64 * 4 + 64 * 34 / 32)
    hybrid = read_meta(pairs["hybrid"].target)
    # 2 attention layers only; 2 recurrent layers: conv (3 x (256 + 2 x 4 x 64)) + state (64 x 256), f32, per plane
    assert kv_cache_bytes(hybrid, 256, "f16", "f16") == 2 * 256 * (64 + 64) * 2
    assert recurrent_bytes(hybrid, 3) == 3 * 2 * (3 * (256 + 2 * 4 * 64) + 64 * 256) * 4
    check_memory([(dense, 0)], 4096, "f16", "f16", 512, available=2**30)
    with pytest.raises(InputError, match=r"only 1 MiB of memory is available: no context fits"):
        check_memory([(dense, 0)], 4096, "f16", "f16", 512, available=2**20)


# --- legal edge values still run -----------------------------------------------------------------

LEGAL_FILES = [
    # llama.cpp reads recurrent_layers and never divides by the interval
    ("unused_full_attention_interval_0", "hybrid", "target", {Q35 + "full_attention_interval": ("u32", 0)}),
    # llama.cpp disables an out-of-range special token that is never added, with a warning
    ("eos_outside_vocab", "dense", "target", {"tokenizer.ggml.eos_token_id": ("u32", 9999)}),
    ("per_layer_head_counts", "dense", "target", {Q3 + "attention.head_count": ("arr", "u32", [4, 4, 4, 4])}),
    # n_max is clamped to DEFAULT_N_MAX (15), not to the block
    ("draft_block_size_huge", "dense", "draft", {DF + "block_size": ("u32", 100000)}),
]


@pytest.mark.parametrize("case", LEGAL_FILES, ids=[c[0] for c in LEGAL_FILES])
def test_legal_metadata_still_runs(case, pairs, tmp_path):
    name, kind, role, changes = case
    pair = pairs[kind]
    edited = rewrite_gguf(getattr(pair, role), tmp_path / f"{name}.gguf", changes)
    target, draft = (edited, pair.draft) if role == "target" else (pair.target, edited)
    proc = run_cli("run", "-m", str(target), "-md", str(draft), "-n", "4", "-t", "1", "-c", "256", "-p", "def f",
                   timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.mark.parametrize("args, spec", [
    (("-c", "9", "-b", "8", "-ub", "8"), True),  # exactly one prompt token + one verify block of 8
    (("-c", "1", "-b", "1", "-ub", "1"), False),  # plain decoding needs one token at a time
], ids=["speculative_exact_fit", "plain_minimum"])
def test_legal_edge_options_still_run(pairs, args, spec):
    proc = _dense(pairs, *args, spec=spec)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "4 tokens" in proc.stderr


# --- the architecture tables against the tree ------------------------------------------------------

def _graph_asserts(tree: Path) -> tuple[set[str], set[str]]:
    """Architectures whose graph asserts head_k == head_v, and n_rot == head size."""
    kv, rot = set(), set()
    for arch, body in graph_sources(tree).items():
        if not re.search(r"const int64_t n_embd_head\s*=\s*hparams\.n_embd_head_[kv]\(\);", body):
            continue
        if re.search(r"^\s*GGML_ASSERT\(n_embd_head == hparams\.n_embd_head_[kv]\(\)\);", body, re.MULTILINE):
            kv.add(arch)
        if re.search(r"^\s*GGML_ASSERT\(n_embd_head == n_rot\);", body, re.MULTILINE):
            rot.add(arch)
    return kv, rot


def test_arch_tables_match_the_tree(build_info):
    from ggspec.runtime.preflight import HEAD_KV_EQUAL_ARCHS, ROT_EQUALS_HEAD_ARCHS

    tree = Path(build_info.root) / "llama.cpp"
    if not (tree / "src" / "models").is_dir():
        pytest.skip(f"the build's patched tree is gone: {tree}")
    kv, rot = _graph_asserts(tree)
    assert kv == HEAD_KV_EQUAL_ARCHS
    assert rot == ROT_EQUALS_HEAD_ARCHS


def test_a_vocabulary_without_byte_tokens_is_one_error(dense_pair, tmp_path):
    """A SentencePiece vocabulary without the <0xXX> byte pieces a character outside it (here 日) falls back
    to: llama.cpp's tokenizer throws std::out_of_range through its C API, which killed the process
    (std::terminate). Patch 0008's wrapper turns it into one line; text the vocabulary covers runs."""
    spm = {"tokenizer.ggml.model": ("str", "llama"), "tokenizer.ggml.pre": None, "tokenizer.ggml.merges": None,
           "tokenizer.ggml.add_space_prefix": ("bool", False)}  # "▁" would fall back to bytes too
    bad = rewrite_gguf(dense_pair.target, tmp_path / "spm-without-bytes.gguf", spm)
    _assert_one_line_error(run_cli("run", "-m", str(bad), "--no-spec", "-n", "4", "-p", "日本", timeout=TIMEOUT),
                           "its vocabulary cannot encode this text")
    proc = run_cli("run", "-m", str(bad), "--no-spec", "-n", "4", "-p", "cafe", timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stderr[-1500:]
