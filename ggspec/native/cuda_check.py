"""The CUDA compile check: compile only the CUDA translation units the patch series touches.

A full CUDA build is ~100 core-minutes for one architecture; a patch that breaks ggml-cuda breaks
a unit it touches. So the check configures the patched tree exactly as `ggspec build --cuda` does
(same cmake options, same toolkit; Ninja where it is installed, else Makefiles: both name every
object as a target) and compiles each `ggml/src/ggml-cuda/*.cu` that a patch file names. The
configured directory is kept per (patch series, options, toolkit): an unchanged series is
checked again in a second.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ggspec.native import build as nb
from ggspec.native import cuda, paths

CUDA_SRC = "ggml/src/ggml-cuda"
OBJECT_DIR = f"{CUDA_SRC}/CMakeFiles/ggml-cuda.dir"  # where CMake puts ggml-cuda's objects

_TOUCHED_RE = re.compile(rf"^\+\+\+ b/({re.escape(CUDA_SRC)}/\S+\.cu)\s*$", re.MULTILINE)


@dataclass
class CheckResult:
    units: list[str]  # tree-relative .cu paths, in compile order
    build_dir: Path
    configure_s: float = 0.0  # 0 when the configured directory was reused
    unit_s: dict[str, float] = field(default_factory=dict)

    @property
    def seconds(self) -> float:
        return self.configure_s + sum(self.unit_s.values())


def touched_units(patches: list[Path]) -> list[str]:
    """The ggml-cuda .cu files the patches modify or add, in order of first mention."""
    units: list[str] = []
    for patch in patches:
        for unit in _TOUCHED_RE.findall(patch.read_text(errors="replace")):
            if unit not in units:
                units.append(unit)
    return units


def object_target(unit: str) -> str:
    """The Ninja target of a unit's object file (CMake keeps the path under the target's folder)."""
    return f"{OBJECT_DIR}/{unit.removeprefix(CUDA_SRC + '/')}.o"


def check_root() -> Path:
    return paths.ggspec_home() / "cuda-check"


def check_key(options: nb.BuildOptions, patches: list[Path], toolkit: cuda.CudaToolkit) -> str:
    tool = hashlib.sha256(f"{toolkit.root}|{toolkit.version}".encode()).hexdigest()[:8]
    return f"{nb.build_key(options, patches)}-{tool}"


def _prepare(work: Path, patches: list[Path]) -> Path:
    """The patched tree, made once per key (a `.complete` stamp marks a finished one)."""
    tree = work / "llama.cpp"
    stamp = work / ".tree-complete"
    if stamp.is_file() and tree.is_dir():
        return tree
    nb.extract_sdist(nb.obtain_sdist())
    work.mkdir(parents=True, exist_ok=True)
    tree = nb.prepare_tree(work, patches)
    stamp.write_text("")
    return tree


def _generator() -> tuple[str, str]:
    """Ninja names every object as a target; without it, the Makefiles of each folder do."""
    return ("Ninja", "build.ninja") if shutil.which("ninja") else ("Unix Makefiles", "Makefile")


def _object_command(build_dir: Path, unit: str) -> list[str]:
    if (build_dir / "build.ninja").is_file():
        return ["ninja", "-C", str(build_dir), object_target(unit)]
    return ["make", "-C", str(build_dir / CUDA_SRC), f"{unit.removeprefix(CUDA_SRC + '/')}.o"]


def _configure(tree: Path, build_dir: Path, options: nb.BuildOptions, toolkit: cuda.CudaToolkit) -> float:
    generator, marker = _generator()
    if (build_dir / marker).is_file() and (build_dir / "CMakeCache.txt").is_file():
        return 0.0
    shutil.rmtree(build_dir, ignore_errors=True)
    t0 = time.perf_counter()
    cmd = ["cmake", "-G", generator, "-S", str(tree), "-B", str(build_dir), *options.cmake_args(), *toolkit.cmake_args()]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    (build_dir.parent / "configure.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        errors = [ln.strip() for ln in (proc.stderr or proc.stdout).splitlines() if ln.strip()]
        first = next((ln for ln in errors if "error" in ln.lower()), errors[0] if errors else "no output")
        raise nb.BuildError(f"cmake configure for the CUDA compile check failed ({first}); "
                            f"full log: {build_dir.parent / 'configure.log'}")
    return round(time.perf_counter() - t0, 1)


# a diagnostic, not the command line: "file(12): error: ...", "file:1:2: fatal error: ...", "error: ..."
_ERROR_RE = re.compile(r"(^|[:)]\s*)(fatal )?error\b", re.IGNORECASE)


def _compile_unit(tree: Path, build_dir: Path, unit: str) -> float:
    t0 = time.perf_counter()
    log = build_dir / f"check-{Path(unit).stem}.log"
    proc = subprocess.run(_object_command(build_dir, unit), capture_output=True, text=True)
    log.write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        lines = (proc.stdout + proc.stderr).splitlines()
        first = next((ln.strip() for ln in lines if _ERROR_RE.search(ln)), f"exit code {proc.returncode}")
        first = first.replace(f"{tree}/", "")
        raise nb.BuildError(f"CUDA compile check: {unit} does not compile ({first}); full log: {log}")
    return round(time.perf_counter() - t0, 1)


def _prune(root: Path, keep: str) -> None:
    """One checked series at a time: older ones are a full tree each (~180 MB)."""
    for old in root.iterdir():
        if old.is_dir() and old.name != keep:
            shutil.rmtree(old, ignore_errors=True)


def compile_check(options: nb.BuildOptions, patches: list[Path] | None = None, root: Path | None = None,
                  force: bool = False, on_unit: Callable[[str], None] | None = None) -> CheckResult:
    """Configure the patched tree for CUDA with the build's options and compile the units the
    patches touch; BuildError names the first unit that fails and its log."""
    if not options.cuda:
        raise nb.BuildError("the CUDA compile check needs CUDA build options")
    nb.check_options(options)
    patches = nb.patch_files() if patches is None else patches
    units = touched_units(patches)
    toolkit = cuda.find_toolkit()
    root = check_root() if root is None else root
    key = check_key(options, patches, toolkit)
    work = root / key
    if force:
        shutil.rmtree(work, ignore_errors=True)
    root.mkdir(parents=True, exist_ok=True)
    _prune(root, key)
    build_dir = work / "build"
    result = CheckResult(units=units, build_dir=build_dir)
    if not units:
        return result
    tree = _prepare(work, patches)
    result.configure_s = _configure(tree, build_dir, options, toolkit)
    for unit in units:
        if on_unit:
            on_unit(unit)
        result.unit_s[unit] = _compile_unit(tree, build_dir, unit)
    return result
