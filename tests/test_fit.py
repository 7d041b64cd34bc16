"""The memory fit (speculative/fit.py): what it measures before loading is what llama.cpp reports
once the engine's contexts exist, for every kind of drafter and for recurrent planes; what the
prepared-plan pools add while running stays under its bound; a context left to it shrinks to
what fits and a given one is refused in one line."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from ggspec.errors import InputError
from ggspec.runtime import ContextParams, footprint
from ggspec.runtime.footprint import HOST
from ggspec.speculative.driver import drive
from ggspec.speculative.engine import Engine
from ggspec.speculative.models import PairConfig
from ggspec.speculative.planes import PlaneOptions
from ggspec.speculative.request import Request
from ggspec.speculative.rules import memory_fit as fit

TINY = Path(__file__).resolve().parents[1] / "models" / "tiny"


def _configs(name: str, pairs: dict) -> PairConfig:
    """One configuration per kind of drafter (mmap off: llama.cpp's mapped-file figure spans the
    whole file, repacked tensors included, while the pages a run needs are the fit's)."""
    ctx = ContextParams(n_ctx=1024, n_threads=1)
    base = dict(ctx=ctx, mmap=False, calibrate=False)
    if name == "dflash":
        return PairConfig(TINY / "tiny-coder.gguf", TINY / "tiny-coder-dflash-b8.gguf", **base)
    if name == "eagle3-np2":
        return PairConfig(TINY / "tiny-coder.gguf", TINY / "tiny-coder-eagle3.gguf", parallel=2, **base)
    if name == "draft-simple":
        return PairConfig(TINY / "tiny-coder.gguf", TINY / "tiny-coder-draft.gguf", n_max=6, **base)
    if name == "hybrid-capped-planes":
        pair = pairs["hybrid"]
        return PairConfig(pair.target, pair.draft, n_max=7, planes=PlaneOptions.parse(3, None), **base)
    if name == "ngram-no-pool":
        return PairConfig(TINY / "tiny-coder.gguf", spec_type="ngram-simple", plan_pool=0, **base)
    raise KeyError(name)


@pytest.fixture(scope="module")
def pairs(fixture_dir):
    from ggspec.catalogue.tiny import ensure_tiny_pair

    return {"hybrid": ensure_tiny_pair(fixture_dir, "hybrid")}


def _run_and_measure(cfg: PairConfig, n: int = 48):
    """llama.cpp's report right after the engine is built, and after it generated n tokens."""
    with Engine.open(cfg) as engine:
        assert not engine.plain_by_cost
        loaded = footprint.measure([engine.target, engine.draft_ctx])
        prompt = engine.target_model.tokenize("class Stack:\n    def __init__(self):\n")
        for _ in drive(engine, [Request(prompt, n, ignore_eos=True)]):
            pass
        ran = footprint.measure([engine.target, engine.draft_ctx])
    return loaded, ran


def _check(cfg: PairConfig) -> None:
    before = fit.measure(cfg, pools=False)
    bound = fit.measure(cfg)
    loaded, ran = _run_and_measure(cfg)
    assert set(before.devices) == set(loaded.devices) == {HOST}
    for name, use in loaded.devices.items():
        est = before.devices[name]
        # the weights, caches and recurrent planes are llama.cpp's own sizes: equal
        assert (est.model, est.context) == (use.model, use.context), name
        # the compute buffers: the reserved graphs, within 5 %
        assert abs(est.total - use.total) <= 0.05 * use.total, (name, est, use)
        # running adds the parked plans' buffers (patch 0018 counts them): under the pool bound
        assert use.total <= ran.total(name) <= bound.total(name), (name, ran.devices[name], bound.devices[name])


@pytest.mark.parametrize("name", ["dflash", "eagle3-np2", "draft-simple", "hybrid-capped-planes", "ngram-no-pool"])
def test_the_measure_before_loading_is_what_llama_cpp_reports(name, pairs, build_info):
    _check(_configs(name, pairs))


def test_gemma_and_the_real_qwen_pair(real_target, build_info):
    from ggspec.catalogue.pairs import check_files, get_entry, resolve

    _check(PairConfig(real_target, spec_type="ngram-simple", mmap=False, calibrate=False,
                      ctx=ContextParams(n_ctx=2048, n_threads=2)))
    entry = get_entry("qwen2.5-coder-1.5b")
    if check_files(entry, None) != "ok":
        pytest.skip("qwen2.5-coder-1.5b is not pulled")
    coder = resolve(entry)
    _check(PairConfig(coder.target, coder.draft, n_max=4, mmap=False, calibrate=False,
                      ctx=ContextParams(n_ctx=2048, n_threads=2)))


@pytest.fixture(scope="module")
def dummies(build_info):
    """The real-shape dummy pairs (test_scale's: made once, ~2.5 GB, then cached)."""
    from ggspec.catalogue.pairs import get_entry, make

    return {name: make(get_entry(name)) for name in ("dummy-qwen3-0.6b", "dummy-qwen3.5-0.8b")}


@pytest.mark.scale
@pytest.mark.parametrize("name, planes", [("dummy-qwen3-0.6b", None), ("dummy-qwen3.5-0.8b", None),
                                          ("dummy-qwen3.5-0.8b", 3)])
def test_the_real_shape_dummy_pairs(dummies, name, planes):
    """Qwen3-0.6B and the hybrid Qwen3.5-0.8B at Q4_K_M with their DFlash drafts, -np 2: real
    shapes (151,936-token heads, 16-row verify blocks, the hybrid's delta-net states per plane)."""
    files = dummies[name]
    _check(PairConfig(files.target, files.draft, n_max=7, parallel=2, planes=PlaneOptions.parse(planes, None),
                      mmap=False, calibrate=False, ctx=ContextParams(n_ctx=2048, n_threads=2)))


def test_mapped_weights_are_llama_cpps_file_range(build_info):
    """With mmap (the default) llama.cpp reports the mapped range of the file as the weights;
    the fit counts the buffers the weights need: equal for a file nothing is repacked from."""
    cfg = _configs("dflash", {})
    loaded, _ = _run_and_measure(replace(cfg, mmap=True), n=4)
    assert loaded.devices[HOST].model == fit.measure(cfg).devices[HOST].model


def test_a_context_left_to_the_fit_shrinks_and_a_given_one_is_refused(build_info):
    cfg = replace(_configs("draft-simple", {}), ctx=ContextParams(n_ctx=65536, n_threads=1))
    full = fit.measure(cfg).total(HOST)
    small = fit.measure(replace(cfg, ctx=replace(cfg.ctx, n_ctx=8192))).total(HOST)
    room = {HOST: (full + small) // 2}
    result = fit.fit(cfg, n_ctx_given=False, room=room)
    n_ctx = result.cfg.ctx.n_ctx
    assert 8192 < n_ctx < 65536 and n_ctx % 256 == 0 and result.cfg.ctx.measured
    assert result.footprint.total(HOST) <= room[HOST]
    # the largest that fits: one step of 256 cells more does not
    assert fit.measure(replace(cfg, ctx=replace(cfg.ctx, n_ctx=n_ctx + 256))).total(HOST) > room[HOST]
    assert "context size 65536 does not fit" in result.notes[0] and f"using {n_ctx}" in result.notes[0]
    with pytest.raises(InputError, match=rf"context size 65536 does not fit: host needs .* a context of at most {n_ctx} fits"):
        fit.fit(cfg, n_ctx_given=True, room=room)
    with pytest.raises(InputError, match="no context fits beside the weights"):
        fit.fit(cfg, n_ctx_given=False, room={HOST: 1 << 20})
    assert fit.fit(cfg, n_ctx_given=True).notes == []  # this machine holds it


def test_the_cli_fits_by_default_and_says_what_it_needs(tiny_coder_pair):
    from conftest import run_cli

    proc = run_cli("run", "-m", str(tiny_coder_pair.target), "-md", str(tiny_coder_pair.draft), "-t", "1",
                   "-n", "4", "-p", "def f", "-c", "100000000")
    assert proc.returncode == 1
    assert proc.stderr.startswith("error: -c: context size 100000000 does not fit: host needs "), proc.stderr


def test_planes_then_sequences_give_way_where_no_context_fits(pairs, build_info):
    """A hybrid target at -np 4 with its 8 rollback planes, in a room where not even the smallest
    context fits: the planes left to the fit are halved first (capped planes replay: slower, never
    wrong), then the sequences; what is given stays, and the refusal says what was tried."""
    base = replace(_configs("hybrid-capped-planes", pairs), planes=PlaneOptions(), parallel=4)

    def floor(**kw) -> int:
        return fit.measure(replace(base, ctx=replace(base.ctx, n_ctx=256), **kw)).total(HOST)

    full, capped, one = floor(), floor(planes=PlaneOptions(4)), floor(parallel=2, planes=PlaneOptions(2))
    assert full > capped > one  # each plane and each sequence holds recurrent states and verify rows
    result = fit.fit(base, n_ctx_given=False, parallel_given=False, room={HOST: (full + capped) // 2})
    assert result.cfg.planes.planes == 4 and result.cfg.parallel == 4 and result.changed[0] == "planes"
    assert result.notes[0].startswith("4 parallel sequences with 8 rollback planes do not fit (host needs ")
    assert "using 4 parallel sequences with 4 rollback planes" in result.notes[0]
    assert result.footprint.total(HOST) <= (full + capped) // 2
    # planes given: the sequences give way
    given = replace(base, planes=PlaneOptions(8))
    result = fit.fit(given, n_ctx_given=False, parallel_given=False, room={HOST: (full + capped) // 2})
    assert result.cfg.parallel < 4 and result.cfg.planes.planes == 8 and "parallel" in result.changed
    # neither left to it: refused, saying so
    with pytest.raises(InputError, match="no context fits beside the weights"):
        fit.fit(given, n_ctx_given=False, room={HOST: (full + capped) // 2})
    with pytest.raises(InputError, match="; nor with 1 parallel sequence with 2 rollback planes"):
        fit.fit(base, n_ctx_given=False, parallel_given=False, room={HOST: one // 2})


def test_the_calibration_context_is_counted_where_one_is_made(build_info):
    """A model drafter's adaptive rule measures a plain step on a bare context of its own, beside
    the engine's, when it calibrates: the fit counts it (as llama.cpp reports it once made), and
    nothing where the length is fixed or the types are n-grams."""
    from ggspec.runtime import Context
    from ggspec.speculative.models import Models
    from ggspec.speculative.rules.calibration import plain_step_params

    fixed = _configs("draft-simple", {})  # n_max given: a fixed length, no calibration
    auto = replace(fixed, n_max=None, calibrate=True, parallel=2)
    extra = fit.measure(auto, pools=False).total(HOST) - fit.measure(replace(auto, calibrate=False), pools=False).total(HOST)
    with Models(auto) as models:
        ctx = Context(models.target, plain_step_params(replace(auto.ctx, n_seq_max=2), 2), what="calibration")
        made = footprint.context_use(ctx)[HOST]
        ctx.close()
    assert extra == made.context + made.compute > 0
    ngram = _configs("ngram-no-pool", {})
    assert fit.measure(replace(ngram, calibrate=True), pools=False).total(HOST) == fit.measure(ngram, pools=False).total(HOST)
