"""The Vulkan side of the plane layouts (patch 0020), on whatever Vulkan device the machine has:
Mesa's lavapipe (a Vulkan device on the CPU) here and in CI.

- llama.cpp's test-backend-ops: the gated delta-net op with snapshot maps (every plane layout
  llama.cpp writes, hand-made maps with repeats and skips) and the pinned tree's own trailing
  snapshots, on the Vulkan device against the CPU backend;
- tests/native/test_gdn_map_gpu.c: every plane count 2..9 and 28, every lead, S_v 16..128, KDA,
  and that the slots a map skips keep what they held;
- end to end: greedy speculative output equals plain greedy output on the hybrid fixtures with
  target and draft entirely on the Vulkan device, DFlash on every plane layout and each other
  draft type that runs on a hybrid target with capped planes, token for token the same as on
  the CPU backend; and the scheduler keeps the mapped delta-net on the device.

The Vulkan build lives beside the current one (`nb.build(..., mark=False)`): its processes select
it with `$GGSPEC_BUILD`. Without the packages (`apt-get install libvulkan-dev glslc spirv-headers
mesa-vulkan-drivers`) these skip, saying which is missing; in CI, once .ci/run has installed them
(GGSPEC_CI_VULKAN=1), they fail instead.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import PROMPTS, run_cli
from helpers.gdn_map import compile_map_test

from ggspec.native import build as nb
from ggspec.native import vulkan

VULKAN = nb.BuildOptions(vulkan=True)
HELPERS = Path(__file__).parent / "helpers"


def _unavailable(reason: str):
    if os.environ.get("CI") and os.environ.get("GGSPEC_CI_VULKAN"):  # .ci/run installed the packages
        pytest.fail(f"CI installed the Vulkan packages, yet: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def vulkan_build() -> nb.BuildInfo:
    try:
        vulkan.find_sdk()
    except nb.BuildError as exc:
        _unavailable(str(exc))
    t0 = time.perf_counter()
    info = nb.build(VULKAN, mark=False)
    print(f"Vulkan build {info.key}: {time.perf_counter() - t0:.0f} s here ({info.seconds:.0f} s when compiled)")
    return info


def _device_names(env: dict[str, str]) -> list[str]:
    code = ("import sys; sys.path.insert(0, sys.argv[1]); from conftest import gpu_device_names; "
            "from ggspec.native.bindings import current_build; print('\\n'.join(gpu_device_names(current_build())))")
    proc = subprocess.run([sys.executable, "-c", code, str(Path(__file__).parent)], capture_output=True, text=True,
                          env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return [line for line in proc.stdout.splitlines() if line.startswith("Vulkan")]


@pytest.fixture(scope="module")
def vk_env(vulkan_build) -> dict[str, str]:
    """What a process on the Vulkan build and its device adds to the environment: llama.cpp takes
    a GPU when there is one, else lavapipe, which it ignores unless GGML_VK_VISIBLE_DEVICES names it."""
    extra = {nb.SELECT_ENV: vulkan_build.key}
    if not _device_names(dict(os.environ, **extra)) and vulkan.VISIBLE_DEVICES_ENV not in os.environ:
        extra[vulkan.VISIBLE_DEVICES_ENV] = "0"  # only CPU devices: the first (lavapipe)
    names = _device_names(dict(os.environ, **extra))
    if not names:
        _unavailable(f"no Vulkan device: `apt-get install {vulkan.DEVICE_PACKAGE}` brings lavapipe, one on the CPU")
    print(f"Vulkan device: {names[0]}")
    return extra


# --- the op against the CPU backend ----------------------------------------------------------------

# the test-backend-ops cases of patch 0020 (by their `layout` variable) and the pinned tree's
# trailing ones (by K). One process per group: lavapipe crashes in long mixed runs of this op's
# cases (heap corruption after ~100 cases, the pinned kernel as well as the patched one), never in
# these groups.
MAP_LAYOUTS = [f"planes{p}-lead{lead}" for p in (2, 3, 4, 5, 8, 28) for lead in (0, 1, 3)] + [
    "planes5-lead2", "planes4-lead1", "repeats", "skips", "none"]
GROUPS = [f"layout={name}$" for name in MAP_LAYOUTS] + ["K=1$", "K=[2-9]$"]
_CASE = re.compile(r"^\s+GATED_DELTA_NET\((.*)\): (.*)$", re.MULTILINE)


def test_backend_ops_delta_net_on_vulkan_equals_cpu(vulkan_build, vk_env):
    exe = Path(vulkan_build.lib_dir) / nb.BACKEND_OPS_TEST
    results: dict[str, str] = {}
    for group in GROUPS:
        proc = subprocess.run([str(exe), "test", "-o", "GATED_DELTA_NET", "-b", "Vulkan0", "-p", group],
                              capture_output=True, text=True, env=dict(os.environ, **vk_env), timeout=300)
        found = {case: re.sub(r"\x1b\[[0-9;]*m", "", verdict).strip() for case, verdict in _CASE.findall(proc.stdout)}
        assert proc.returncode == 0 and found, f"{group}: rc {proc.returncode}\n{proc.stdout[-3000:]}{proc.stderr[-1000:]}"
        results |= found
    bad = {case: verdict for case, verdict in results.items() if verdict != "OK"}
    mapped = [case for case in results if "layout=" in case]
    print(f"{len(results)} cases OK on Vulkan0, {len(mapped)} with a snapshot map")
    assert not bad, bad  # "not supported" included: before patch 0020 Vulkan refused every map
    assert len(mapped) == 82 and len(results) > len(mapped)
    assert {case.rsplit("layout=", 1)[1] for case in mapped} == set(MAP_LAYOUTS)


def test_map_op_on_vulkan_equals_cpu(vulkan_build, vk_env, tmp_path):
    """Every plane count 2..9 and 28, every lead, S_v 16..128, KDA on/off, hand-made maps; the
    slots a map skips keep their sentinel."""
    exe = compile_map_test(vulkan_build, tmp_path)
    proc = subprocess.run([str(exe)], capture_output=True, text=True, env=dict(os.environ, **vk_env), timeout=600)
    print(proc.stdout.strip().splitlines()[-1])
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "device under test: Vulkan" in proc.stdout and " 0 failed" in proc.stdout, proc.stdout[-2000:]


# --- end to end --------------------------------------------------------------------------------------


def _runs(fixture_dir: Path, n_gpu_layers: int, env: dict[str, str]) -> dict:
    proc = subprocess.run([sys.executable, str(HELPERS / "backend_runs.py"), str(fixture_dir), str(n_gpu_layers)],
                          capture_output=True, text=True, env=env, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def test_hybrid_runs_on_vulkan_equal_the_cpu_backend(vk_env, fixture_dir, build_info):
    """The hybrid target entirely on the device, forced acceptance through the types that draft
    without a draft context: ngram-simple on every plane layout (uncapped, 2..5 planes, leads 0..3
    and the default), ngram-map-k, ngram-map-k4v, ngram-mod and ngram-cache with 3 capped planes.
    Plain greedy on the device, replays from the planes, the same tokens as on the CPU backend.

    The types with a draft context (DFlash, draft-simple, EAGLE3, MTP heads: backend_runs.py's
    DRAFT_CASES) are not run here: on lavapipe (Mesa 22.3.6) a decode with device sampling or
    layer-input extraction crashes inside the driver's queue thread, with or without this patch;
    on a real Vulkan GPU the `gpu`-marked tests of test_gpu.py run them (its gpu_build takes a
    Vulkan build)."""
    cpu = _runs(fixture_dir, 0, dict(os.environ))
    gpu = _runs(fixture_dir, -1, dict(os.environ, **vk_env))
    assert cpu.keys() == gpu.keys()
    report = []
    for name, on_gpu in gpu.items():
        on_cpu = cpu[name]
        kinds = {d.split(":", 1)[0] for d in on_gpu["divergences"] if d}
        report.append(f"{name}: accepted {on_gpu['accepted']}, replays {on_gpu['replays']}, "
                      f"divergences {sorted(kinds) or 'none'}")
        for backend, res in (("vulkan", on_gpu), ("cpu", on_cpu)):
            assert res["benign"], (name, backend, res["divergences"])
        assert on_gpu["plain"] == on_cpu["plain"], name  # the device decodes as the CPU does
        assert on_gpu["spec"] == on_cpu["spec"], name
        assert on_gpu["divergences"] == on_cpu["divergences"], name
        if on_gpu["capped"]:
            assert on_gpu["replays"] > 0, name  # missed accepted counts replay from the planes
    print("\n".join(report))


_GDN_NODE = re.compile(r"node #\s*\d+ \(GATED_DELT\): .{20} \(.{5}\) \[(.{5}) ")


def test_lead_layout_keeps_the_delta_net_on_the_vulkan_device(vk_env, hybrid_pair):
    """Before patch 0020 Vulkan refused the op with a snapshot map: the scheduler sent every gated
    delta-net node of a lead layout to the CPU. Now each one runs on Vulkan0."""
    proc = run_cli("run", "-m", str(hybrid_pair.target), "--spec-type", "ngram-simple",
                   "-ngl", "-1", "-n", "16", "-p", PROMPTS[1],
                   "--spec-draft-rs-planes", "4", "--spec-draft-rs-planes-lead", "2",
                   env={**vk_env, "GGML_SCHED_DEBUG": "2", "GGSPEC_VERBOSE": "1"}, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    backends = {b.strip() for b in _GDN_NODE.findall(proc.stderr)}
    assert backends == {"Vulka"}, backends  # the scheduler prints five characters of the name
