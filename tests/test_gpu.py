"""The CUDA side of the plane layouts (patch 0010): tests marked `gpu` run only where the current
build has a GPU backend and sees a GPU device (scripts/device_check.sh builds one and runs them);
elsewhere they skip, saying why.

- the gated delta-net op with snapshot maps on the GPU equals the CPU op (a ggml-level C test);
- greedy speculative output equals plain greedy output with the target on the GPU, dense and
  hybrid (capped planes with a lead: the snapshot map runs in the CUDA kernel);
- with a lead layout the scheduler really puts the gated delta-net on the GPU (GGML_SCHED_DEBUG);
- patch 0011: chained MTP drafts on the GPU equal one decode per step (qwen35, qwen35moe, and a
  Gemma 4 assistant reading the target's cache);
- draft-simple, draft-eagle3, a comma list and ngram-cache with the models on the GPU.

The C test's harness also runs here without a GPU (CPU against CPU), so a broken harness shows.
"""

from __future__ import annotations

import itertools
import re
import subprocess

import numpy as np
import pytest
from conftest import PROMPTS, run_cli
from helpers.drafts import ggspec_drafts
from helpers.gdn_map import SKIP_EXIT, compile_map_test
from helpers.pairs import MTP_PROMPT

from ggspec.bench.forced import ForcedAcceptance, cycle_lengths
from ggspec.runtime import ContextParams
from ggspec.speculative.engine import Engine
from ggspec.speculative.lossless import run_prompts
from ggspec.speculative.models import PairConfig
from ggspec.speculative.planes import PlaneOptions
from ggspec.speculative.stats import merge
from ggspec.speculative.types.mtp import MTPOptions
from ggspec.speculative.types.ngram_mod import NgramModOptions

N_PREDICT = 64
N_MAX = 7  # the fixtures' block size is 8
GPU_PROMPTS = PROMPTS[:6]
# F32 caches and no flash attention: the same numerics for a one-token decode and a verify batch
EXACT = ContextParams(n_ctx=1024, n_batch=256, n_ubatch=256, n_threads=2, type_k="f32", type_v="f32",
                      flash_attn="off")


def test_map_test_harness_runs_without_a_gpu(build_info, tmp_path):
    """The C test compiles against any build; CPU against CPU it finds no difference, and without
    a GPU device it says skip (77) rather than pass."""
    exe = compile_map_test(build_info, tmp_path)
    proc = subprocess.run([str(exe), "--self-check", "--quick"], capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0 and " 0 failed" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert re.search(r" [1-9]\d* skipped slots checked", proc.stdout), proc.stdout
    if not (build_info.options.get("cuda") or build_info.options.get("vulkan")):
        plain = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60, check=False)
        assert plain.returncode == SKIP_EXIT, plain.stdout + plain.stderr


@pytest.mark.gpu
def test_delta_net_map_op_gpu_equals_cpu(gpu_build, tmp_path):
    """Every plane count 2..9 and 28, every lead, S_v 16..128, KDA on/off, hand-made maps."""
    exe = compile_map_test(gpu_build, tmp_path)
    proc = subprocess.run([str(exe)], capture_output=True, text=True, timeout=600, check=False)
    print(proc.stdout)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert " 0 failed" in proc.stdout and "on gpu" in proc.stdout, proc.stdout


def _gpu_config(pair, planes: PlaneOptions | None = None) -> PairConfig:
    """The target entirely on the GPU; the draft stays on the CPU (its numerics cannot break
    losslessness, only acceptance)."""
    return PairConfig(target=pair.target, draft=pair.draft, fixed_block=True, n_max=N_MAX, ctx=EXACT,
                      n_gpu_layers=-1, n_gpu_layers_draft=0, planes=planes or PlaneOptions())


def _forced(sp: Engine):
    """Forced acceptance lengths 0..n_max, each prompt starting elsewhere in the cycle."""
    offsets = itertools.count()

    def make(prompt, plain):
        lengths = itertools.islice(cycle_lengths(N_MAX), next(offsets), None)
        return ForcedAcceptance(sp.proposer, np.concatenate([prompt, plain]), lengths, sp.target_model.n_vocab)
    return make


@pytest.mark.gpu
def test_dense_speculative_equals_greedy_on_gpu(gpu_build, tiny_coder_pair):
    """The shipped trained pair (tiny-coder): lossless up to genuine near-ties, and it speculates."""
    with Engine.open(_gpu_config(tiny_coder_pair)) as sp:
        runs = list(run_prompts(sp, GPU_PROMPTS, N_PREDICT))
    diverged = [f"prompt {i}: {r.divergence.describe()}" for i, r in enumerate(runs) if r.divergence]
    stats = merge(r.spec_stats for r in runs)
    print(f"tau {stats.tau:.2f}, accept histogram {stats.accept_hist}" + "".join(f"\n  {d}" for d in diverged))
    # F16 matrices: a batched verify may flip a genuine near-tie (see test_lossless.py), nothing else
    assert all(r.divergence.benign for r in runs if r.divergence), "\n".join(diverged)
    assert len(diverged) <= len(GPU_PROMPTS) // 3, "\n".join(diverged)
    assert sum(len(r.plain) for r in runs) == len(GPU_PROMPTS) * N_PREDICT
    assert stats.tau > 1.5  # the draft's proposals are accepted: the pair really speculates


def _hybrid_runs(pair, planes: PlaneOptions):
    with Engine.open(_gpu_config(pair, planes)) as sp:
        return list(run_prompts(sp, GPU_PROMPTS, N_PREDICT, _forced(sp)))


def _divergences(runs) -> list[str]:
    return [f"prompt {i}: {r.divergence.describe()}" for i, r in enumerate(runs) if r.divergence]


@pytest.mark.gpu
@pytest.mark.parametrize("planes, lead", [(4, 0), (4, "default"), (3, "default"), (5, 1)])
def test_hybrid_planes_are_lossless_on_gpu(planes, lead, gpu_build, hybrid_pair):
    """Capped layouts with a lead run the snapshot map in the CUDA kernel; forced acceptance makes
    every accepted count happen, and the missed ones replay. On the H200 (2026-11-30) a batched
    verify flipped 4 of 6 genuine near-ties of this fixture (margins 0.012-0.038) in every layout,
    uncapped included: the GPU's batched kernels round differently from its one-token ones. So the
    oracle allows benign near-ties only, and the capped layout must diverge exactly where the
    uncapped one does: the planes and the snapshot map change nothing."""
    uncapped = _hybrid_runs(hybrid_pair, PlaneOptions())
    runs = _hybrid_runs(hybrid_pair, PlaneOptions(planes, lead))
    diverged = _divergences(runs)
    print("\n".join(diverged))
    assert all(r.divergence.benign for r in runs if r.divergence), "\n".join(diverged)
    assert diverged == _divergences(uncapped)
    for capped, plain_layout in zip(runs, uncapped):  # token for token the same output as uncapped
        assert capped.spec == plain_layout.spec
    stats = merge(r.spec_stats for r in runs)
    assert all(stats.accept_hist), stats.accept_hist
    assert stats.replays > 0  # some accepted counts are not kept: the replay path ran


# one scheduler line per graph node (ggml-backend.cpp, GGML_SCHED_DEBUG=2): op, name, size, backend
_GDN_NODE = re.compile(r"node #\s*\d+ \(GATED_DELT\): .{20} \(.{5}\) \[(.{5}) ")


def _delta_net_backends(hybrid_pair, planes: str, lead: str) -> tuple[list[str], int]:
    """The backend of every gated delta-net node the scheduler placed in a short run, and the most
    splits one graph had."""
    proc = run_cli("run", "-m", str(hybrid_pair.target), "-md", str(hybrid_pair.draft), "--dflash",
                   "-ngl", "-1", "-ngld", "-1", "-n", "16", "-p", PROMPTS[1],
                   "--spec-draft-rs-planes", planes, "--spec-draft-rs-planes-lead", lead,
                   env={"GGML_SCHED_DEBUG": "2", "GGSPEC_VERBOSE": "1"}, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    backends = [b.strip() for b in _GDN_NODE.findall(proc.stderr)]
    splits = [int(n) for n in re.findall(r"## SPLIT #(\d+):", proc.stderr)]
    return backends, max(splits, default=-1) + 1


@pytest.mark.gpu
def test_lead_layout_runs_the_delta_net_on_the_gpu(gpu_build, hybrid_pair):
    """Before patch 0010 CUDA refused the op with a snapshot map: a lead layout sent every gated
    delta-net node to the CPU (more splits, copies both ways). Now it stays on the GPU."""
    default, default_splits = _delta_net_backends(hybrid_pair, "uncapped", "default")
    lead, lead_splits = _delta_net_backends(hybrid_pair, "4", "2")
    print(f"gated delta-net nodes: default layout {len(default)} on {sorted(set(default))}, max {default_splits} "
          f"splits per graph; lead 2 of 4 planes {len(lead)} on {sorted(set(lead))}, max {lead_splits} splits")
    assert default and lead, "no gated delta-net node in the scheduler's output (GGML_SCHED_DEBUG)"
    assert not [b for b in default + lead if b.startswith("CPU")], (default, lead)
    assert lead_splits <= default_splits


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["hybrid-mtp", "hybrid-moe-mtp"])
@pytest.mark.parametrize("n_max", [1, 3, 7])
def test_chained_mtp_drafts_equal_unchained_on_gpu(n_max, kind, gpu_build, fixture_dir):
    """Patch 0011's chained MTP graph on the GPU (argmax, get_rows, top-k on the device): the
    same drafts as one decode per step, and greedy output equal to plain greedy output, for
    qwen35 and qwen35moe (routed + shared experts in the MTP block)."""
    from helpers.fixtures.mtp_head import ensure_fitted

    from ggspec.catalogue.tiny import ensure_tiny_pair

    target = ensure_fitted(fixture_dir, ensure_tiny_pair(fixture_dir, kind).target)
    logs = []
    for chain in (False, True):
        cfg = PairConfig(target=target, n_max=n_max, ctx=EXACT, n_gpu_layers=-1, p_min=0.01,
                         spec_options={"draft-mtp": MTPOptions(chain=chain)})
        with Engine.open(cfg) as eng:
            logs.append(ggspec_drafts(eng, MTP_PROMPT, n_max, forced=True)[0])
    assert logs[0] == logs[1]


@pytest.mark.gpu
@pytest.mark.parametrize("n_max", [1, 3, 7])
def test_gemma4_drafter_chained_and_not_equal_on_gpu(n_max, gpu_build, fixture_dir):
    """A Gemma 4 assistant reading the target's cache on the GPU: unchained and chained drafts
    agree, and greedy output equals plain greedy output (checked by ggspec_drafts)."""
    from helpers.fixtures.gemma4 import ensure_gemma4_pair

    pair = ensure_gemma4_pair(fixture_dir)
    logs = []
    for chain in (False, True):
        cfg = PairConfig(target=pair.target, draft=pair.drafter, n_max=n_max, ctx=EXACT, n_gpu_layers=-1,
                         n_gpu_layers_draft=-1, p_min=0.01, spec_options={"draft-mtp": MTPOptions(chain=chain)})
        with Engine.open(cfg) as eng:
            logs.append(ggspec_drafts(eng, MTP_PROMPT, n_max, forced=True)[0])
    assert logs[0] == logs[1]


@pytest.mark.gpu
@pytest.mark.parametrize("pair, spec_type, n_max", [("tiny-coder-simple", "draft-simple", 3),
                                                    ("tiny-coder-eagle3", "draft-eagle3", 4),
                                                    ("tiny-coder-simple", "ngram-mod,draft-simple", 4),
                                                    ("tiny-coder", "ngram-cache", 8)])
def test_every_type_is_lossless_on_gpu(pair, spec_type, n_max, gpu_build):
    """draft-simple, EAGLE3 (its encoder and decoder on the device too), a comma list and
    ngram-cache with the target (and draft) on the GPU: lossless up to genuine near-ties."""
    from ggspec.catalogue.pairs import get_entry, resolve

    files = resolve(get_entry(pair))
    cfg = PairConfig(target=files.target, draft=files.draft if spec_type != "ngram-cache" else None,
                     spec_type=spec_type, n_max=n_max, ctx=EXACT, n_gpu_layers=-1, n_gpu_layers_draft=-1,
                     spec_options={"ngram-mod": NgramModOptions(n_match=4, n_max=8, n_min=2)})
    with Engine.open(cfg) as sp:  # (the primes list: a prompt ngram-cache drafts on)
        runs = list(run_prompts(sp, [*GPU_PROMPTS, PROMPTS[19]], N_PREDICT))
    diverged = _divergences(runs)
    print(spec_type, "".join(f"\n  {d}" for d in diverged))
    assert all(r.divergence.benign for r in runs if r.divergence), "\n".join(diverged)
    assert merge(r.spec_stats for r in runs).accepted > 0


@pytest.mark.gpu
def test_plan_pool_and_adaptive_length_on_gpu(gpu_build, tiny_coder_pair):
    """Patch 0012's parked plans with the target and the DFlash draft on the device (CUDA graphs
    per scheduler): the same greedy text as without them, graphs reused from the pool, and the
    adaptive length lossless there too."""
    from dataclasses import replace

    base = _gpu_config(tiny_coder_pair)
    texts = {}
    for name, cfg in (("no pool", replace(base, plan_pool=0)), ("pool", replace(base, plan_pool=8)),
                      ("auto", replace(base, plan_pool=8, adaptive=True))):
        with Engine.open(cfg) as sp:
            runs = list(run_prompts(sp, GPU_PROMPTS, N_PREDICT))
            texts[name] = [r.spec for r in runs]
            assert all(r.divergence is None or r.divergence.benign for r in runs)
            if name == "pool":
                assert sp.draft_ctx.plan_stats()[1] > 0
    assert texts["pool"] == texts["no pool"]


@pytest.mark.gpu
@pytest.mark.parametrize("draft_layers", [0, -1])
def test_the_memory_fit_measures_the_gpu_as_llama_cpp_reports_it(gpu_build, tiny_coder_pair, hybrid_pair,
                                                                   draft_layers):
    """speculative.rules.memory_fit on a GPU: the target (and the draft, or not) on the device, the dense pair
    and the hybrid one with capped planes; what it measures before loading is what llama.cpp's
    breakdown reports once the contexts exist, per device and for the host (weights and caches
    equal, totals within 5 %)."""
    from dataclasses import replace

    from ggspec.runtime import footprint
    from ggspec.speculative.rules import memory_fit as fit

    for pair, planes in ((tiny_coder_pair, None), (hybrid_pair, PlaneOptions.parse(3, None))):
        cfg = replace(_gpu_config(pair, planes), n_gpu_layers_draft=draft_layers, mmap=False, calibrate=False)
        before = fit.measure(cfg, pools=False)
        with Engine.open(cfg) as engine:
            loaded = footprint.measure([engine.target, engine.draft_ctx])
        assert set(before.devices) == set(loaded.devices) and len(loaded.devices) >= 2  # a GPU and the host
        for name, use in loaded.devices.items():
            est = before.devices[name]
            assert (est.model, est.context) == (use.model, use.context), name
            assert abs(est.total - use.total) <= 0.05 * max(use.total, 1), (name, est, use)
