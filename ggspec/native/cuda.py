"""A CUDA toolkit that can build ggml-cuda here, with or without a GPU.

A system toolkit (CUDA_HOME, CUDA_PATH, nvcc on PATH, /usr/local/cuda) is used only when it is
complete: "nvcc exists" is not "CUDA is usable" (a toolkit without cuBLAS or a driver library
fails in cmake's configure, minutes later). Otherwise NVIDIA's PyPI wheels (`pip install
'ggspec[cuda]'`, the `nvidia` namespace package) are made usable through a fix-up folder in the
ggspec cache: the layout CMake's FindCUDAToolkit expects (lib64, unversioned library names) and a
link-time stand-in for the driver library, built once.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ggspec.native import paths
from ggspec.native.errors import BuildError

HOW_TO_GET = "pip install 'ggspec[cuda]' (NVIDIA's CUDA 13.0 wheels), or install NVIDIA's CUDA toolkit with cuBLAS"

# the wheels of the `cuda` extra and what each brings into nvidia/cu13
WHEEL_PARTS = {
    "nvidia-cuda-nvcc": ("bin/nvcc",),
    "nvidia-cuda-crt": ("include/crt/host_config.h",),
    "nvidia-nvvm": ("nvvm/bin/cicc",),
    "nvidia-cuda-runtime": ("include/cuda_runtime.h", "lib/libcudart.so.*"),
    "nvidia-cuda-cccl": ("include/cccl/cuda/std/version",),
    "nvidia-cublas": ("include/cublas_v2.h", "lib/libcublas.so.*", "lib/libcublasLt.so.*"),
}

# Driver entry points ggml-cuda calls directly (CUDA::cuda_driver). The stand-in only has to
# satisfy the linker: it carries the real soname, so the real libcuda.so.1 is loaded at run time.
STUB_SYMBOLS = (
    "cuInit", "cuDriverGetVersion", "cuGetProcAddress", "cuGetErrorString", "cuDeviceGet",
    "cuDeviceGetAttribute", "cuMemAddressFree", "cuMemAddressReserve", "cuMemCreate",
    "cuMemGetAllocationGranularity", "cuMemMap", "cuMemRelease", "cuMemSetAccess", "cuMemUnmap",
)


@dataclass(frozen=True)
class CudaToolkit:
    root: Path  # CUDAToolkit_ROOT: bin/nvcc, include/, lib/ or lib64/
    version: str  # nvcc's, e.g. "13.0.88"
    source: str  # "system" or "pypi"
    driver_stub: bool  # no real libcuda.so.1 here: programs link against the stand-in
    runtime_dir: Path  # the folder of libcudart.so.N / libcublas.so.N, for the build's rpath

    @property
    def nvcc(self) -> Path:
        return self.root / "bin" / "nvcc"

    def cmake_args(self) -> list[str]:
        args = [f"-DCUDAToolkit_ROOT={self.root}", f"-DCMAKE_CUDA_COMPILER={self.nvcc}"]
        # CMake counts the toolkit's lib folders as implicit and leaves them out of the rpath; wheels
        # are in no loader path, so libggml-cuda would not find libcudart at run time
        args.append(f"-DCMAKE_BUILD_RPATH={self.runtime_dir}")
        if self.driver_stub:
            # libggml-cuda needs libcuda.so.1, which only a driver installs: let programs link
            # without it (it is resolved when they run on a machine with the driver)
            args.append("-DCMAKE_EXE_LINKER_FLAGS=-Wl,--allow-shlib-undefined")
        return args


# --- what a toolkit folder has ----------------------------------------------------------------------


def _lib_dirs(root: Path) -> list[Path]:
    return [root / "lib64", root / "lib", *sorted(root.glob("targets/*/lib"))]


def _include_dirs(root: Path) -> list[Path]:
    return [root / "include", *sorted(root.glob("targets/*/include"))]


def _has_lib(root: Path, name: str, stubs: bool = False) -> bool:
    dirs = _lib_dirs(root)
    if stubs:
        dirs += [d / "stubs" for d in dirs]
    return any((d / name).exists() for d in dirs)


def _has_header(root: Path, name: str) -> bool:
    return any((d / name).is_file() for d in _include_dirs(root))


def _loader_names() -> set[str]:
    """The library names the dynamic loader's cache knows (`ldconfig -p`)."""
    try:
        listing = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True).stdout
    except OSError:
        return set()
    return {line.split()[0] for line in listing.splitlines()[1:] if line.strip()}


def system_driver() -> bool:
    """A real driver library (libcuda.so.1) is installed: this machine can run CUDA programs."""
    return "libcuda.so.1" in _loader_names()


def _linkable_driver() -> bool:
    """A driver's own libcuda.so (its development link) that CMake can link instead of a stub."""
    return "libcuda.so" in _loader_names()


def runtime_dir(root: Path) -> Path:
    """The folder libcudart comes from; never one with a libcuda.so.1, which must be the driver's."""
    for d in _lib_dirs(root):
        if any(d.glob("libcudart.so*")) and not (d / "libcuda.so.1").exists():
            return d.resolve()
    raise BuildError(f"no libcudart.so.N in {root} outside a folder holding libcuda.so.1")


def missing_parts(root: Path) -> list[str]:
    """What a system toolkit lacks for a ggml-cuda build, in words ([] when it is complete)."""
    missing = []
    if not os.access(root / "bin" / "nvcc", os.X_OK):
        missing.append("nvcc")
    if not _has_header(root, "cuda_runtime.h"):
        missing.append("the runtime headers (cuda_runtime.h)")
    if not _has_lib(root, "libcudart.so"):
        missing.append("libcudart.so")
    if not (_has_lib(root, "libcublas.so") and _has_lib(root, "libcublasLt.so") and _has_header(root, "cublas_v2.h")):
        missing.append("cuBLAS (libcublas.so, cublas_v2.h)")
    if not (_has_lib(root, "libcuda.so", stubs=True) or _linkable_driver()):
        missing.append("the driver library (libcuda.so or stubs/libcuda.so)")
    return missing


def system_candidates() -> list[Path]:
    """Where a system toolkit may be, in the order CMake users expect; existing folders only."""
    found = [Path(os.environ[v]) for v in ("CUDA_HOME", "CUDA_PATH") if os.environ.get(v)]
    nvcc = shutil.which("nvcc")
    if nvcc:
        found += [Path(nvcc).parent.parent, Path(nvcc).resolve().parent.parent]
    found.append(Path("/usr/local/cuda"))
    unique: list[Path] = []
    for p in found:
        if p.is_dir() and p.resolve() not in [u.resolve() for u in unique]:
            unique.append(p)
    return unique


def wheel_roots() -> list[Path]:
    """nvidia/cu13 folders of the installed `nvidia` namespace package (NVIDIA's PyPI wheels)."""
    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        return []
    if spec is None or not spec.submodule_search_locations:
        return []
    return [Path(p) / "cu13" for p in spec.submodule_search_locations if (Path(p) / "cu13").is_dir()]


def missing_wheels(root: Path) -> list[str]:
    """The `cuda` extra's wheels whose files are not in this nvidia/cu13 folder."""
    return [wheel for wheel, files in WHEEL_PARTS.items()
            if not all(any(root.glob(f)) for f in files)]


# --- nvcc and its host compiler ---------------------------------------------------------------------


def nvcc_version(nvcc: Path) -> str:
    try:
        out = subprocess.run([str(nvcc), "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BuildError(f"{nvcc} does not run ({exc})") from None
    m = re.search(r"\bV(\d+\.\d+\.\d+)", out) or re.search(r"release (\d+\.\d+)", out)
    if not m:
        raise BuildError(f"{nvcc} --version does not say its release")
    return m.group(1)


def host_compiler() -> str:
    """The compiler nvcc will call: CUDAHOSTCXX (CMake passes it as -ccbin), else nvcc's default,
    gcc on PATH."""
    return os.environ.get("CUDAHOSTCXX") or shutil.which("gcc") or "gcc"


def compiler_id(cxx: str) -> tuple[str, int]:
    """("gcc" | "clang", major version) of a C++ compiler, from its predefined macros."""
    try:
        out = subprocess.run([cxx, "-dM", "-E", "-x", "c++", os.devnull], capture_output=True, text=True).stdout
    except OSError:
        raise BuildError(f"no host compiler for nvcc: {cxx} does not run (install gcc/g++ or set CUDAHOSTCXX)") from None
    macros = dict(re.findall(r"#define (\w+) (.*)", out))
    if "__clang__" in macros:
        return "clang", int(macros.get("__clang_major__", "0"))
    if "__GNUC__" in macros:
        return "gcc", int(macros["__GNUC__"])
    raise BuildError(f"{cxx} is neither gcc nor clang: set CUDAHOSTCXX to a g++ nvcc supports")


def host_limits(root: Path) -> dict[str, int]:
    """The newest gcc / clang major versions nvcc accepts, read from its crt/host_config.h."""
    limits: dict[str, int] = {}
    for inc in _include_dirs(root):
        try:
            text = (inc / "crt" / "host_config.h").read_text(errors="replace")
        except OSError:
            continue
        if m := re.search(r"#if __GNUC__ > (\d+)", text):
            limits["gcc"] = int(m.group(1))
        if m := re.search(r"#if \(__clang_major__ >= (\d+)\)[^\n]*\n#error -- unsupported clang version", text):
            limits["clang"] = int(m.group(1)) - 1
        break
    return limits


def check_host_compiler(root: Path, version: str) -> None:
    """nvcc refuses host compilers newer than it knows: say so before cmake does, in one line."""
    cxx = host_compiler()
    kind, major = compiler_id(cxx)
    limit = host_limits(root).get(kind)
    if limit is not None and major > limit:
        raise BuildError(f"nvcc {version} supports {kind} up to {limit}, but the host compiler {cxx} is {kind} "
                         f"{major}: set CUDAHOSTCXX to an older one (e.g. g++-{limit})")


# --- the PyPI wheels made usable -------------------------------------------------------------------


def fixup_dir(wheel_root: Path, version: str) -> Path:
    tag = hashlib.sha256(str(wheel_root.resolve()).encode()).hexdigest()[:8]
    return paths.ggspec_home() / "cuda" / f"pypi-{version}-{tag}"


def _link_entries(src: Path, dest: Path) -> None:
    dest.mkdir()
    for entry in sorted(src.iterdir()):
        (dest / entry.name).symlink_to(entry)


def _link_libraries(wheel_lib: Path, lib: Path) -> None:
    """lib/: every wheel library, plus the unversioned names FindCUDAToolkit looks for."""
    _link_entries(wheel_lib, lib)
    for entry in sorted(wheel_lib.glob("lib*.so.*")):
        plain = lib / (entry.name.split(".so.")[0] + ".so")
        if not plain.exists():
            plain.symlink_to(entry.name)


def _compile_driver_stub(dest: Path) -> None:
    """stubs/libcuda.so: a link-time stand-in with the real soname. Never named libcuda.so.1, so
    the loader cannot pick it from an rpath folder instead of the driver."""
    dest.parent.mkdir(parents=True)
    cc = os.environ.get("CC") or "cc"
    with tempfile.TemporaryDirectory(prefix="ggspec-cuda-stub-") as tmp:
        src = Path(tmp) / "libcuda.c"
        src.write_text("".join(f"int {name}(void) {{ return 34; /* CUDA_ERROR_STUB_LIBRARY */ }}\n"
                               for name in STUB_SYMBOLS))
        try:
            proc = subprocess.run([cc, "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(dest), str(src)],
                                  capture_output=True, text=True)
        except OSError:
            raise BuildError(f"the CUDA driver stand-in needs a C compiler: {cc} does not run") from None
        if proc.returncode != 0:
            tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
            raise BuildError(f"compiling the CUDA driver stand-in with {cc} failed: {tail}")


def make_fixup(wheel_root: Path, version: str) -> Path:
    """The toolkit root for CMake: the wheels' files by symlink, built once per wheel install and
    reused. nvcc finds its parts from the path it was called by (TOP = bin/..), so bin/ is a real
    folder of links and TOP is this folder, with lib64 and the unversioned names."""
    root = fixup_dir(wheel_root, version)
    if (root / ".complete").is_file() and (root / "bin" / "nvcc").exists():
        return root
    tmp = root.with_name(f"{root.name}.partial.{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir(parents=True)
        for part in ("include", "nvvm"):
            (tmp / part).symlink_to(wheel_root / part)
        _link_entries(wheel_root / "bin", tmp / "bin")
        _link_libraries(wheel_root / "lib", tmp / "lib")
        (tmp / "lib64").symlink_to("lib")  # nvcc.profile's link line and FindCUDAToolkit use lib64
        _compile_driver_stub(tmp / "lib" / "stubs" / "libcuda.so")
        (tmp / ".complete").write_text(str(wheel_root))
        shutil.rmtree(root, ignore_errors=True)
        tmp.rename(root)
    except OSError as exc:
        raise BuildError(f"cannot prepare the CUDA wheels in {root} ({exc.strerror or exc})") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return root


# --- the choice ------------------------------------------------------------------------------------


def find_toolkit(candidates: list[Path] | None = None, wheels: list[Path] | None = None) -> CudaToolkit:
    """A complete system toolkit, else the PyPI wheels (fixed up); BuildError in one line naming
    what is missing and how to get it when neither is usable."""
    candidates = system_candidates() if candidates is None else candidates
    wheels = wheel_roots() if wheels is None else wheels
    gaps: list[tuple[Path, list[str]]] = []
    for root in candidates:
        missing = missing_parts(root)
        if not missing:
            version = nvcc_version(root / "bin" / "nvcc")
            check_host_compiler(root, version)
            return CudaToolkit(root=root, version=version, source="system", driver_stub=not system_driver(),
                               runtime_dir=runtime_dir(root))
        gaps.append((root, missing))
    for wheel_root in wheels:
        if not missing_wheels(wheel_root):
            version = nvcc_version(wheel_root / "bin" / "nvcc")
            check_host_compiler(wheel_root, version)
            return CudaToolkit(root=make_fixup(wheel_root, version), version=version, source="pypi",
                               driver_stub=not system_driver(), runtime_dir=runtime_dir(wheel_root))
    raise BuildError(_nothing_usable(gaps, wheels))


def _nothing_usable(gaps: list[tuple[Path, list[str]]], wheels: list[Path]) -> str:
    said = []
    with_nvcc = [(root, missing) for root, missing in gaps if "nvcc" not in missing]
    if with_nvcc:  # the closest system toolkit: the one with the fewest gaps
        root, missing = min(with_nvcc, key=lambda g: len(g[1]))
        said.append(f"the CUDA toolkit in {root} lacks {_and(missing)}")
    if wheels:
        said.append(f"NVIDIA's CUDA wheels in {wheels[0]} lack {_and(missing_wheels(wheels[0]))}")
    where = "; ".join(said) if said else "no CUDA toolkit found (CUDA_HOME, nvcc on PATH, /usr/local/cuda) "\
                                         "and no NVIDIA CUDA wheels installed"
    return f"no usable CUDA toolkit: {where}: {HOW_TO_GET}"


def _and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]
