"""Batch invariance on the CPU backend (patches 0021, 0022): a token decoded alone and the same token
as any row of a batch of any size (a verify, a prompt chunk, rows beside other sequences' rows)
give the same bits, so greedy speculative output equals plain greedy output byte for byte (the
oracle's byte-identity rule) on real files, for every n-gram type, and a prompt's text does not
depend on how it was chunked.

The probe (ggspec.bench.invariance) runs on the real Gemma 3 270M (Q8_0 head, Q5_0, Q4_K, Q6_K) and
the Qwen2.5-Coder 1.5B (Q4_K, Q6_K) in both attention settings and both repack settings (the
repacked Q4_K gemm, the batched Q6_K kernel, llamafile's sgemm, flash attention's tiles), and on
the shipped tiny target (F32) requantized by llama.cpp's own llama-quantize to F16, Q8_0, Q4_0 and
IQ4_NL (each type's one-row and batched kernels, the repacked Q4_0 / IQ4_NL gemm). With the
invariance switched off, the same probe finds the difference and names the kernel: the test has
the power to fail.
"""

from __future__ import annotations

import subprocess

import pytest

from ggspec.bench.invariance import kernel_behind, probe
from ggspec.bench.prompts import BUILTIN
from ggspec.catalogue.pairs import check_files, get_entry, resolve
from ggspec.native.bindings import batch_invariant, set_batch_invariant
from ggspec.runtime import ContextParams
from ggspec.speculative.driver import generate_greedy
from ggspec.speculative.engine import Engine
from ggspec.speculative.lossless import IDENTITY_RULE, run_prompts
from ggspec.speculative.models import PairConfig
from ggspec.speculative.request import Request

ROWS = (2, 4, 8, 16)
PAST_128 = (64, 160, 256)  # batches past patch 0021's old limit of 128 rows
EVERY_SIZE = 2 ** 63 - 1  # the default row limit: every row count


@pytest.fixture
def invariance(build_info):
    """Restores the process's invariance setting after a test that switches it."""
    before = batch_invariant()
    yield
    set_batch_invariant(before > 0, before or None)


def _assert_identical(report) -> None:
    bad = [r for r in report.rows if not r.identical]
    assert not bad and report.identical, (f"{report.model} fa {report.flash_attn} repack {report.repack}: "
                                          f"{len(bad)} rows differ ({bad[:3]}), chunks {report.chunks}, node {report.node}")


def test_invariance_is_on_by_default_for_every_row_count(build_info, invariance):
    assert batch_invariant() == EVERY_SIZE
    set_batch_invariant(True, 65)
    assert batch_invariant() == 65
    set_batch_invariant(False)
    assert batch_invariant() == 0


@pytest.mark.real
@pytest.mark.parametrize("fa", ["on", "off"])
@pytest.mark.parametrize("repack", [True, False])
def test_every_row_equals_the_token_alone_on_gemma(real_target, fa, repack):
    # a fill past 512 cells: where flash attention split a lone row's KV across threads; a prompt
    # of 600 tokens in chunks of 7 ... 512 rows and whole against one token at a time
    _assert_identical(probe(real_target, fa, repack, fills=(3, 600), ks=(*ROWS, *PAST_128), n_threads=2,
                            prompt=600, chunk_sizes=(7, 64, 128, 512, "whole")))


@pytest.mark.real
def test_every_row_count_from_1_to_130_and_past_on_gemma(real_target):
    # every remainder of the 4-row gemm and of the tiles, the old limit's neighbours, and beyond
    _assert_identical(probe(real_target, "on", True, fills=(40,), ks=(*range(1, 131), 160, 200, 255, 256),
                            chunk_sizes=(), n_threads=2))


@pytest.mark.real
@pytest.mark.parametrize("fa", ["on", "off"])
def test_rows_beside_other_sequences_equal_the_token_alone(real_target, fa):
    """What `serve` does with several clients: a sequence's rows share a batch with three other
    sequences' rows (each after its own prefix)."""
    _assert_identical(probe(real_target, fa, True, fills=(40, 600), ks=(1, 4, 16), chunk_sizes=(), n_threads=2,
                            neighbours=5))


@pytest.mark.real
def test_every_row_equals_the_token_alone_on_the_qwen_target(build_info):
    entry = get_entry("qwen2.5-coder-1.5b")
    if check_files(entry, None) != "ok":
        pytest.skip("qwen2.5-coder-1.5b is not pulled")
    _assert_identical(probe(resolve(entry).target, "on", True, fills=(40,), ks=(4, 8, 160), chunk_sizes=(7, 128, "whole"),
                            n_threads=2))


@pytest.fixture(scope="module")
def requantized(build_info, tmp_path_factory, tiny_coder_pair):
    """The tiny target (F32) requantized by llama.cpp's llama-quantize of the same build."""
    from ggspec.bench.native import find_tool

    quantize = find_tool("llama-quantize")
    out = tmp_path_factory.mktemp("quant")
    files = {}
    for qtype in ("F16", "Q8_0", "Q4_0", "IQ4_NL"):
        path = out / f"tiny-{qtype}.gguf"
        proc = subprocess.run([str(quantize), str(tiny_coder_pair.target), str(path), qtype],
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-1500:]
        files[qtype] = path
    return files


@pytest.mark.parametrize("qtype", ["F32", "F16", "Q8_0", "Q4_0", "IQ4_NL"])
@pytest.mark.parametrize("fa", ["on", "off"])
def test_every_row_equals_the_token_alone_per_weight_type(qtype, fa, requantized, tiny_coder_pair):
    path = tiny_coder_pair.target if qtype == "F32" else requantized[qtype]
    for repack in (True, False):
        _assert_identical(probe(path, fa, repack, fills=(3, 600), ks=(*ROWS, *PAST_128), n_threads=2, prompt=300,
                                chunk_sizes=(7, 64, 128, "whole")))


@pytest.mark.parametrize("fa", ["on", "off"])
def test_an_f32_cache_keeps_every_row_equal(fa, tiny_coder_pair):
    """An F32 KV cache: attention's q (permuted) is contiguous only while it holds one row, which
    once sent a lone row down llamafile's path and its batch down vec_dot's."""
    _assert_identical(probe(tiny_coder_pair.target, fa, True, fills=(3, 300), ks=(2, 4, 8), cache_type="f32",
                            n_threads=2))


@pytest.mark.real
def test_without_invariance_the_probe_finds_the_kernel(real_target, invariance):
    set_batch_invariant(False)
    report = probe(real_target, "off", True, fills=(3,), ks=(2, 4, 8), chunk_sizes=(7,), n_threads=2)
    assert not report.identical and report.node is not None
    first = next(r for r in report.rows if not r.identical)
    assert report.node.op == "MUL_MAT" and kernel_behind(report.node, first.k, True) != "unknown", report.node


NGRAM_TYPES = ["ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache"]
# the built-in bench prompts where text-drafting pays and where it does not: code edit, code echo,
# prose, code generation
PROMPTS = [BUILTIN[5].text, BUILTIN[7].text, BUILTIN[9].text, BUILTIN[0].text]
N_PREDICT = 48


def _real_cfg(real_target, spec_type: str, parallel: int = 1) -> PairConfig:
    return PairConfig(target=real_target, draft=None, spec_type=spec_type, n_max=8, parallel=parallel,
                      ctx=ContextParams(n_ctx=2048, n_threads=2))


@pytest.mark.real
@pytest.mark.parametrize("spec_type", NGRAM_TYPES)
def test_real_model_speculation_is_byte_identical(real_target, spec_type):
    """Every n-gram type on the real Gemma 3 270M: no difference at all, not even a near-tie."""
    with Engine.open(_real_cfg(real_target, spec_type)) as sp:
        runs = list(run_prompts(sp, PROMPTS, N_PREDICT))
    assert all(r.exact for r in runs)
    diffs = [r.divergence.describe() for r in runs if r.divergence is not None]
    assert not diffs, diffs
    assert sum(r.spec_stats.accepted for r in runs) > 0  # drafts were verified, not only plain steps


@pytest.mark.real
def test_four_sequences_together_equal_each_alone_byte_for_byte(real_target):
    """-np 4: the four prompts verified in one batch each equal their solo plain greedy text."""
    prompts = []
    with Engine.open(_real_cfg(real_target, "ngram-simple", parallel=4)) as sp:
        prompts = [sp.target_model.tokenize(p) for p in PROMPTS]
        seqs = [sp.add(Request(p, N_PREDICT, ignore_eos=True, tag=i)) for i, p in enumerate(prompts)]
        list(sp.run())
        with Engine(sp.models, _real_cfg(real_target, None), plain=True) as plain:
            solo = [[t for st in generate_greedy(plain, p, N_PREDICT, ignore_eos=True) for t in st.tokens]
                    for p in prompts]
    assert [s.tokens for s in sorted(seqs, key=lambda s: s.tag)] == solo
    assert sum(s.stats.accepted for s in seqs) > 0


@pytest.mark.real
def test_a_divergence_is_real_under_byte_identity(real_target):
    from ggspec.speculative.lossless import compare

    div = compare([1, 2, 3], [5.0, 0.01, 5.0], [1, 9, 3], exact=True)
    assert div.rule == IDENTITY_RULE and not div.benign and "REAL" in div.describe()
    assert compare([1, 2, 3], [5.0, 0.01, 5.0], [1, 9, 3], exact=False).benign
