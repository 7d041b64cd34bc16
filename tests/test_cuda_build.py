"""The CUDA build without a GPU: the toolkit finder and the compile check of the patched CUDA units.

The README's test command installs the `cuda` extra (NVIDIA's CUDA 13.0 wheels), so these run in
CI; elsewhere the ones that need a toolkit skip with the finder's one-line reason.
"""

from __future__ import annotations

import difflib
import os
import shutil
from pathlib import Path

import pytest

from ggspec.native import build as nb
from ggspec.native import cuda, cuda_check

ARCH_90 = nb.BuildOptions(cuda=True, cuda_arch="90")


@pytest.fixture(scope="module")
def toolkit() -> cuda.CudaToolkit:
    try:
        return cuda.find_toolkit()
    except nb.BuildError as exc:
        if os.environ.get("CI"):
            pytest.fail(f"CI installs the cuda extra, yet: {exc}")
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def good_check(toolkit) -> cuda_check.CheckResult:
    """The compile check of the current series, in $GGSPEC_HOME (kept: a rerun takes a second)."""
    return cuda_check.compile_check(ARCH_90)


# --- the compile check -----------------------------------------------------------------------------


def test_compile_check_passes_on_the_series(good_check):
    units = cuda_check.touched_units(nb.patch_files())
    assert "ggml/src/ggml-cuda/ggml-cuda.cu" in units  # patch 0002's supports_op
    assert good_check.units == units and set(good_check.unit_s) == set(units)
    for unit in units:
        assert (good_check.build_dir / cuda_check.object_target(unit)).is_file(), unit
    assert cuda_check.compile_check(ARCH_90).configure_s == 0.0  # the configured directory is kept


def test_the_check_uses_the_build_flags(good_check, toolkit):
    cache = (good_check.build_dir / "CMakeCache.txt").read_text()
    for arg in ARCH_90.cmake_args() + toolkit.cmake_args():
        name, value = arg.removeprefix("-D").split("=", 1)
        assert f"{name}:" in cache and f"={value}\n" in cache, arg


def _cuda_link_line(build_dir: Path) -> str:
    """How libggml-cuda would be linked, from either generator's files."""
    if (build_dir / "build.ninja").is_file():
        ninja = (build_dir / "build.ninja").read_text()
        return ninja.split("build bin/libggml-cuda.so.", 1)[1].split("\nbuild ", 1)[0]
    return (build_dir / cuda_check.OBJECT_DIR / "link.txt").read_text()


def test_no_stub_driver_can_be_loaded_at_run_time(good_check, toolkit):
    """libggml-cuda links the stand-in libcuda.so (soname libcuda.so.1) where no driver exists; no
    folder of its rpath may hold a libcuda.so.1, or it would shadow the real driver on a GPU machine."""
    link = _cuda_link_line(good_check.build_dir)
    rpaths = [d for flag in link.split() if flag.startswith("-Wl,-rpath,")
              for d in flag.removeprefix("-Wl,-rpath,").split(":") if d]
    assert str(toolkit.runtime_dir) in rpaths  # libcudart.so.N found without LD_LIBRARY_PATH
    for folder in rpaths:
        assert not (Path(folder) / "libcuda.so.1").exists(), folder
    if toolkit.source == "pypi":
        assert not list(toolkit.root.rglob("libcuda.so.1"))


def _break_unit(tree: Path, unit: str) -> str:
    """A patch on top of the series that makes `unit` reference an undeclared identifier."""
    old = (tree / unit).read_text().splitlines(keepends=True)
    new = old + ["int ggspec_broken_by_test() { return ggspec_undeclared_identifier; }\n"]
    return "".join(difflib.unified_diff(old, new, fromfile=f"a/{unit}", tofile=f"b/{unit}"))


def test_a_patch_that_breaks_a_cuda_unit_fails_the_check(tmp_path, good_check):
    unit = good_check.units[0]  # compiled first: the check fails within seconds
    series = tmp_path / "patches"
    shutil.copytree(nb.paths.patches_dir(), series)
    (series / "0099-break-cuda.patch").write_text(_break_unit(good_check.build_dir.parent / "llama.cpp", unit))
    patches = sorted(series.glob("*.patch"))
    assert cuda_check.touched_units(patches) == good_check.units
    with pytest.raises(nb.BuildError) as exc:
        cuda_check.compile_check(ARCH_90, patches=patches, root=tmp_path / "check")
    msg = str(exc.value)
    assert "\n" not in msg and f"{unit} does not compile" in msg and "ggspec_undeclared_identifier" in msg, msg


def test_touched_units_come_from_the_patch_files(tmp_path):
    patch = tmp_path / "0001-x.patch"
    patch.write_text("\n".join([
        "--- a/ggml/src/ggml-cuda/gated_delta_net.cu", "+++ b/ggml/src/ggml-cuda/gated_delta_net.cu",
        "--- /dev/null", "+++ b/ggml/src/ggml-cuda/template-instances/new-kernel.cu",
        "+++ b/ggml/src/ggml-cuda/common.cuh", "+++ b/ggml/src/ggml-cpu/ops.cpp",
        "+++ b/ggml/src/ggml-cuda/gated_delta_net.cu", ""]))
    units = cuda_check.touched_units([patch])
    assert units == ["ggml/src/ggml-cuda/gated_delta_net.cu", "ggml/src/ggml-cuda/template-instances/new-kernel.cu"]
    assert cuda_check.object_target(units[1]) == \
        "ggml/src/ggml-cuda/CMakeFiles/ggml-cuda.dir/template-instances/new-kernel.cu.o"


# --- the toolkit finder ----------------------------------------------------------------------------


def _touch(path: Path, text: str = "") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _incomplete_system_toolkit(root: Path) -> Path:
    """nvcc, runtime headers and libcudart: what /usr/local/cuda-13.0 has on these machines."""
    _touch(root / "bin" / "nvcc", "#!/bin/sh\necho 'Cuda compilation tools, release 13.0, V13.0.88'\n").chmod(0o755)
    _touch(root / "include" / "cuda_runtime.h")
    _touch(root / "lib64" / "libcudart.so")
    return root


def test_finder_refuses_an_incomplete_toolkit_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(cuda, "_linkable_driver", lambda: False)  # a GPU machine's driver would count
    root = _incomplete_system_toolkit(tmp_path / "cuda")
    with pytest.raises(nb.BuildError) as exc:
        cuda.find_toolkit(candidates=[root], wheels=[])
    msg = str(exc.value)
    assert "\n" not in msg and str(root) in msg, msg
    assert "cuBLAS" in msg and "driver library" in msg and "pip install 'ggspec[cuda]'" in msg, msg
    assert "nvcc" not in cuda.missing_parts(root)[0]

    _touch(root / "lib64" / "libcublas.so")
    _touch(root / "lib64" / "libcublasLt.so")
    _touch(root / "include" / "cublas_v2.h")
    _touch(root / "lib64" / "stubs" / "libcuda.so")
    assert cuda.missing_parts(root) == []  # complete: chosen over the wheels


def test_finder_names_missing_wheels(tmp_path):
    wheel = tmp_path / "site-packages" / "nvidia" / "cu13"
    _touch(wheel / "bin" / "nvcc").chmod(0o755)
    _touch(wheel / "include" / "cuda_runtime.h")
    with pytest.raises(nb.BuildError) as exc:
        cuda.find_toolkit(candidates=[], wheels=[wheel])
    msg = str(exc.value)
    assert "nvidia-cublas" in msg and "nvidia-nvvm" in msg and "nvidia-cuda-nvcc" not in msg, msg
    assert "pip install 'ggspec[cuda]'" in msg


def test_nothing_found_says_how_to_get_it():
    msg = cuda._nothing_usable([], [])
    assert msg.startswith("no usable CUDA toolkit: no CUDA toolkit found") and "pip install 'ggspec[cuda]'" in msg


def test_a_host_compiler_newer_than_nvcc_allows_is_refused(tmp_path, monkeypatch):
    root = tmp_path / "cuda"
    _touch(root / "include" / "crt" / "host_config.h", "#if defined(__GNUC__)\n#if __GNUC__ > 15\n#error\n#endif\n")
    fake_gxx = _touch(tmp_path / "g++-16", "#!/bin/sh\necho '#define __GNUC__ 16'\n")
    fake_gxx.chmod(0o755)
    monkeypatch.setenv("CUDAHOSTCXX", str(fake_gxx))
    with pytest.raises(nb.BuildError, match=r"nvcc 13\.0\.88 supports gcc up to 15, but .* is gcc 16: set CUDAHOSTCXX"):
        cuda.check_host_compiler(root, "13.0.88")
    fake_gxx.write_text("#!/bin/sh\necho '#define __GNUC__ 15'\n")
    cuda.check_host_compiler(root, "13.0.88")


def test_a_missing_toolkit_stops_the_build_before_the_download(tmp_path, monkeypatch):
    monkeypatch.setenv("GGSPEC_HOME", str(tmp_path))
    def nothing_usable():
        raise nb.BuildError("no usable CUDA toolkit: test")

    monkeypatch.setattr(cuda, "find_toolkit", nothing_usable)
    monkeypatch.setattr(nb, "obtain_sdist", lambda: pytest.fail("downloaded without a toolkit"))
    with pytest.raises(nb.BuildError, match="no usable CUDA toolkit"):
        nb.build(ARCH_90)


def test_the_arch_list_is_part_of_the_build_key():
    keys = {nb.build_key(nb.BuildOptions(cuda=True, cuda_arch=arch)) for arch in ("90", "86;89", "89;86")}
    assert len(keys) == 3
    assert "-DCMAKE_CUDA_ARCHITECTURES=86;89" in nb.BuildOptions(cuda=True, cuda_arch="86;89").cmake_args()


def test_compile_check_is_for_cuda_builds():
    from conftest import run_cli

    proc = run_cli("build", "--compile-check")
    assert proc.returncode == 1 and proc.stderr.strip() == "error: --compile-check needs --cuda", proc.stderr


def test_no_cuda_fa_is_a_build_option_of_its_own():
    """--no-cuda-fa drops the flash-attention kernels (GGML_CUDA_FA=OFF): another key; the
    default leaves the keys of existing builds as they were; without --cuda it is refused."""
    with_fa, without = nb.BuildOptions(cuda=True, cuda_arch="90"), nb.BuildOptions(cuda=True, cuda_arch="90", cuda_fa=False)
    assert "-DGGML_CUDA_FA=OFF" in without.cmake_args() and not any("GGML_CUDA_FA" in a for a in with_fa.cmake_args())
    assert nb.build_key(with_fa) != nb.build_key(without)
    with pytest.raises(nb.BuildError, match="--no-cuda-fa needs --cuda"):
        nb.check_options(nb.BuildOptions(cuda_fa=False))


def test_a_build_the_loader_refuses_is_one_line():
    """A CUDA build on a machine without NVIDIA's driver: the bindings' RuntimeError becomes one
    line saying what to do (seen with the full sm_90 build made here)."""
    from ggspec.native.bindings import load_failure

    exc = RuntimeError("Failed to load shared library '/b/bin/libllama.so': libcuda.so.1: cannot open shared object "
                       "file: No such file or directory")
    text = load_failure("/b/bin", exc)
    assert "\n" not in text and "(libcuda.so.1: cannot open shared object file" in text
    assert "`ggspec build` (without --cuda) makes a CPU build current" in text
    assert "driver" not in load_failure("/b/bin", RuntimeError("Failed to load shared library 'x': libfoo.so: bad ELF"))
