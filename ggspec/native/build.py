"""Build the patched llama.cpp: fetch the pinned sdist, extract, patch, configure, compile.

Every build lives in `$GGSPEC_HOME/builds/<key>/`, where the key hashes everything that changes
the binaries: the pin, the bytes of every patch, the cmake options and the CPU target. Which
targets are compiled is not part of the key: `build.json` lists them, a build with the tools
serves a plain request, and a plain build is extended in place when the tools are asked for.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field, replace
from functools import cache
from pathlib import Path

from ggspec.native import paths
from ggspec.native.atomic import atomic_write
from ggspec.native.errors import BuildError


def _warn(message: str) -> None:
    """A damaged state file that ggspec works around: said once on stderr, never fatal."""
    try:
        sys.stderr.write(f"warning: {message}\n")
        sys.stderr.flush()
    except (OSError, ValueError, AttributeError):
        pass


def _write_json(path: Path, obj) -> None:
    """Atomic and unique-temp: concurrent writers never mix, readers never see half a file."""
    atomic_write(path, lambda tmp: tmp.write_text(json.dumps(obj, indent=2)))


@dataclass(frozen=True)
class BuildOptions:
    cuda: bool = False
    vulkan: bool = False
    tools: bool = False  # llama-server, llama-cli, llama-speculative-simple (RPC is always built)
    native: bool = True  # GGML_NATIVE: tune for this CPU (part of the cache key)
    cuda_arch: str = ""  # CMAKE_CUDA_ARCHITECTURES, e.g. "90" or "86;89"; "" = native (needs a GPU)
    # GGML_CUDA_FA: the flash-attention kernels, about a third of a CUDA build's compile time; off
    # for a quick build (a GPU check), where llama.cpp then runs attention without them
    cuda_fa: bool = True

    def cmake_args(self) -> list[str]:
        on = lambda flag: "ON" if flag else "OFF"  # noqa: E731
        args = [
            "-DCMAKE_BUILD_TYPE=Release",
            "-DBUILD_SHARED_LIBS=ON",
            # a Vulkan build compiles llama.cpp's test-backend-ops: it checks the patched kernels
            # against the CPU backend on the machine's own device
            f"-DLLAMA_BUILD_TESTS={on(self.vulkan)}",
            # tools, examples and server are always configured (one configuration serves plain and
            # --tools builds); only the targets below are compiled
            "-DLLAMA_BUILD_EXAMPLES=ON",
            "-DLLAMA_BUILD_TOOLS=ON",
            "-DLLAMA_BUILD_SERVER=ON",
            "-DGGML_RPC=ON",  # --rpc devices and ggml-rpc-server (multi-device runs, issue 7)
            # nothing may be fetched during the build
            "-DLLAMA_CURL=OFF",
            "-DLLAMA_OPENSSL=OFF",
            "-DLLAMA_BUILD_UI=OFF",
            "-DLLAMA_USE_PREBUILT_UI=OFF",
            f"-DGGML_NATIVE={on(self.native)}",
            "-DGGML_CCACHE=ON",
        ]
        if self.native:
            args += native_fixups()
        if self.cuda:
            args.append("-DGGML_CUDA=ON")
            if self.cuda_arch:
                args.append(f"-DCMAKE_CUDA_ARCHITECTURES={self.cuda_arch}")
            if not self.cuda_fa:  # only when off: the keys of existing builds stay as they were
                args.append("-DGGML_CUDA_FA=OFF")
        if self.vulkan:
            args.append("-DGGML_VULKAN=ON")
        return args

    def targets(self) -> list[str]:
        targets = list(LIBRARY_TARGETS)
        if self.vulkan:
            targets.append(BACKEND_OPS_TEST)
        if self.tools:
            targets += TOOL_TARGETS
        return targets


LIBRARY_TARGETS = ("llama", "ggml-rpc-server", "ggspec-common")  # ggspec-common: patch 0017
BACKEND_OPS_TEST = "test-backend-ops"  # llama.cpp's op test: every backend against the CPU one
TOOL_TARGETS = ("llama-server", "llama-cli", "llama-speculative-simple", "llama-completion", "llama-quantize")


@dataclass
class BuildInfo:
    key: str
    root: str
    lib_dir: str
    options: dict
    patches: list[str]
    cpu_target: str
    seconds: float
    targets: list[str] = field(default_factory=list)  # what has been compiled in this build dir
    cached: bool = field(default=False, compare=False)

    def has(self, options: BuildOptions) -> bool:
        return set(options.targets()) <= set(self.targets)


# --- cache key ------------------------------------------------------------------------------------


def patch_files() -> list[Path]:
    """The patch series in application order; names must look like `NNNN-name.patch`."""
    pdir = paths.patches_dir()
    if not pdir.is_dir():
        raise BuildError(f"patch directory not found: {pdir}")
    files = sorted(pdir.glob("*.patch"))
    for f in files:
        if not re.fullmatch(r"\d{4}-[A-Za-z0-9_.-]+\.patch", f.name):
            raise BuildError(f"patch file name must look like NNNN-name.patch: {f.name}")
    return files


@cache
def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return " ".join(sorted(line.split(":", 1)[1].split()))
    except OSError:
        pass
    return platform.processor()


def cpu_target(native: bool) -> str:
    """What GGML_NATIVE compiles for: the machine plus a hash of its CPU feature flags."""
    machine = platform.machine()
    if not native:
        return f"generic-{machine}"
    return f"native-{machine}-{hashlib.sha256(_cpu_flags().encode()).hexdigest()[:12]}"


# Intel AMX: -march=native enables it whenever the CPU lists it, but some hosts (VMs, sandboxes)
# grant the permission syscall and still trap the instruction: every quantized matmul then dies
# with SIGILL. A 10-line probe, run once per CPU, tells us whether to compile AMX out.
_AMX_PROBE = r"""
#include <immintrin.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>
int main(void) {
    if (syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */)) return 2;
    unsigned char cfg[64];
    memset(cfg, 0, sizeof cfg);
    cfg[0] = 1; cfg[16] = 64; cfg[48] = 16;
    _tile_loadconfig(cfg);
    _tile_zero(0);
    _tile_release();
    return 0;
}
"""
_NO_AMX = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"


def _amx_traps() -> bool:
    """True when this CPU advertises AMX but executing it kills the process."""
    if "amx_tile" not in _cpu_flags().split():
        return False
    with tempfile.TemporaryDirectory(prefix="ggspec-amx-") as probe_dir:  # $GGSPEC_HOME may be read-only
        src, exe = Path(probe_dir) / "amx.c", Path(probe_dir) / "amx"
        src.write_text(_AMX_PROBE)
        try:
            compiled = subprocess.run(["cc", "-O1", "-mamx-tile", str(src), "-o", str(exe)], capture_output=True)
        except OSError:
            return False  # no compiler: the build will say so
        if compiled.returncode != 0:
            return False  # a compiler without AMX support will not emit it either
        return subprocess.run([str(exe)], capture_output=True).returncode < 0  # killed by a signal


@cache
def native_fixups() -> list[str]:
    """Extra cmake flags GGML_NATIVE needs on this machine, probed once and remembered per CPU."""
    record = paths.ggspec_home() / "probe" / f"native-{cpu_target(True)}.json"
    try:
        flags = json.loads(record.read_bytes())
        if isinstance(flags, list) and all(isinstance(f, str) for f in flags):
            return flags
        _warn(f"ignoring the damaged probe record {record}: probing again")
    except FileNotFoundError:
        pass
    except (OSError, ValueError):
        _warn(f"ignoring the damaged probe record {record}: probing again")
    flags = []
    if platform.machine() in ("x86_64", "AMD64") and _amx_traps():
        flags = [f"-DCMAKE_C_FLAGS={_NO_AMX}", f"-DCMAKE_CXX_FLAGS={_NO_AMX}"]
    try:
        _write_json(record, flags)
    except OSError:
        pass  # a read-only $GGSPEC_HOME: probed again next time
    return flags


def build_key(options: BuildOptions, patches: list[Path] | None = None) -> str:
    """Names the build directory. The targets are not part of it: a `--tools` build serves a plain
    one, and asking for the tools later compiles them into the same directory. The CUDA arch list
    is (it is a cmake option); where the CUDA toolkit lives is not."""
    h = hashlib.sha256()
    ident = {
        "pin": f"{paths.PIN_PACKAGE}=={paths.PIN_VERSION}",
        "patches": [(f.name, hashlib.sha256(f.read_bytes()).hexdigest())
                    for f in (patch_files() if patches is None else patches)],
        "cmake": options.cmake_args(),
        "cpu": cpu_target(options.native),
    }
    h.update(json.dumps(ident, sort_keys=True).encode())
    return h.hexdigest()[:16]


# --- the steps -------------------------------------------------------------------------------------


def _run(cmd: list[str], cwd: Path | None = None, what: str = "") -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["(no output)"]
        raise BuildError(f"{what or cmd[0]} failed: {tail[0]}")
    return proc


def obtain_sdist() -> Path:
    """The pinned sdist tarball: `$GGSPEC_SDIST` if set, else downloaded once with pip."""
    env = os.environ.get("GGSPEC_SDIST")
    if env:
        path = Path(env)
        if not path.is_file():
            raise BuildError(f"GGSPEC_SDIST points at a missing file: {path}")
        return path
    dest = paths.ggspec_home() / "sdist"
    tarball = dest / f"{paths.SDIST_STEM}.tar.gz"
    if tarball.is_file():
        return tarball
    dest.mkdir(parents=True, exist_ok=True)
    _run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
         f"{paths.PIN_PACKAGE}=={paths.PIN_VERSION}", "-d", str(dest)],
        what="pip download of the pinned llama-cpp-python sdist",
    )
    if not tarball.is_file():
        raise BuildError(f"pip download did not produce {tarball.name}")
    return tarball


def extract_sdist(tarball: Path) -> Path:
    """Extract once into `$GGSPEC_HOME/src/`; a `.complete` stamp marks a finished extraction."""
    target = paths.sdist_dir()
    stamp = target / ".complete"
    if stamp.is_file():
        return target
    tmp = target.with_name(target.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    with tarfile.open(tarball) as tar:
        tar.extractall(tmp, filter="data")
    inner = tmp / paths.SDIST_STEM
    if not (inner / "vendor" / "llama.cpp" / "CMakeLists.txt").is_file():
        raise BuildError(f"{tarball.name} does not contain vendor/llama.cpp")
    shutil.rmtree(target, ignore_errors=True)
    inner.rename(target)
    shutil.rmtree(tmp, ignore_errors=True)
    stamp.write_text(paths.PIN_VERSION)
    return target


def pristine_tree() -> Path:
    return paths.sdist_dir() / "vendor" / "llama.cpp"


def apply_patches(tree: Path, patches: Iterable[Path]) -> None:
    """Apply each patch with `git apply`, checking it first so a failure names patch and hunk."""
    # Stop git from discovering a repository above the tree (the cache may live inside one).
    env = dict(os.environ, GIT_CEILING_DIRECTORIES=str(tree.parent))
    for patch in patches:
        check = subprocess.run(["git", "apply", "--check", "-p1", str(patch)],
                               cwd=tree, env=env, capture_output=True, text=True)
        if check.returncode != 0:
            lines = [ln for ln in check.stderr.splitlines() if ln.startswith("error:")]
            where = "; ".join(ln.removeprefix("error: ") for ln in lines[:2]) or check.stderr.strip()
            raise BuildError(f"patch {patch.name} does not apply to the pinned tree: {where}")
        subprocess.run(["git", "apply", "-p1", str(patch)], cwd=tree, env=env, check=True)


def prepare_tree(root: Path, patches: list[Path]) -> Path:
    """A fresh copy of the pristine tree with the patch series applied."""
    tree = root / "llama.cpp"
    shutil.rmtree(tree, ignore_errors=True)
    # The vendored tree carries a `.git` file pointing into a submodule store that isn't there.
    shutil.copytree(pristine_tree(), tree, ignore=shutil.ignore_patterns(".git"), symlinks=True)
    apply_patches(tree, patches)
    return tree


def toolkit_args(options: BuildOptions) -> list[str]:
    """Where the CUDA toolkit is, for the configure step only: its path is not part of the key."""
    if not options.cuda:
        return []
    from ggspec.native import cuda  # only CUDA builds need the toolkit search

    return cuda.find_toolkit().cmake_args()


_PROGRESS_RE = re.compile(r"^\[\s*(\d+)%\]\s+(.*)$")


def compile_tree(tree: Path, build_dir: Path, options: BuildOptions, targets: Iterable[str],
                 on_line: Callable[[int | None, str], None]) -> None:
    """Configure (once per build dir) and compile `targets`, reporting each `[ NN%] …` line."""
    if not (build_dir / "CMakeCache.txt").is_file():
        configure = ["cmake", "-S", str(tree), "-B", str(build_dir), *options.cmake_args(), *toolkit_args(options)]
        _run(configure, what="cmake configure")
    jobs = str(os.cpu_count() or 1)
    cmd = ["cmake", "--build", str(build_dir), "-j", jobs, "--target", *targets]
    log_path = build_dir / "compile.log"
    # ccache hashes absolute include paths; with the builds folder as base dir, a build under a
    # new key (say, a changed patch) reuses every object whose sources did not change
    env = dict(os.environ, CCACHE_BASEDIR=str(paths.builds_dir()))
    with open(log_path, "w") as log, subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1, env=env,
        errors="replace",  # a compiler's message may quote bytes that are not UTF-8
    ) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            log.write(line)
            m = _PROGRESS_RE.match(line.strip())
            on_line(int(m.group(1)) if m else None, m.group(2) if m else line.strip())
        proc.wait()
    if proc.returncode != 0:
        errors = [ln for ln in log_path.read_text(errors="replace").splitlines() if "error" in ln.lower()]
        first = errors[0].strip() if errors else f"exit code {proc.returncode}"
        raise BuildError(f"compile failed ({first}); full log: {log_path}")


# --- public API ------------------------------------------------------------------------------------


_INFO_TYPES = {"key": str, "root": str, "lib_dir": str, "options": dict, "patches": list, "cpu_target": str,
               "seconds": (int, float), "targets": list}


def _parse_info(raw) -> BuildInfo:
    """A build record from its JSON; ValueError when anything is missing or of the wrong type."""
    if not isinstance(raw, dict):
        raise ValueError("not an object")
    raw = {k: v for k, v in raw.items() if k != "cached"}
    for name, types in _INFO_TYPES.items():
        if name in raw and not isinstance(raw[name], types):
            raise ValueError(f"{name} has the wrong type")
    if not all(isinstance(t, str) for t in raw.get("targets", []) + raw.get("patches", [])):
        raise ValueError("targets and patches must be names")
    _options(raw.get("options", {}))
    return BuildInfo(**raw)  # TypeError: a missing or unknown field


def _options(raw) -> BuildOptions:
    """BuildOptions from a record; ValueError / TypeError when it is not one."""
    if not isinstance(raw, dict):
        raise ValueError("options is not an object")
    fields = BuildOptions.__dataclass_fields__
    for name, value in raw.items():
        if name not in fields:
            raise ValueError(f"unknown option {name!r}")
        if not isinstance(value, type(fields[name].default)):
            raise ValueError(f"option {name} has the wrong type")
    return BuildOptions(**raw)


def _read_info(key: str) -> BuildInfo | None:
    """The record of the build directory `key`, if a build finished there and its library exists.
    A damaged record is ignored with a warning (`ggspec build` rewrites it)."""
    info_file = paths.builds_dir() / key / "build.json"
    try:
        raw = json.loads(info_file.read_bytes())
    except FileNotFoundError:
        return None
    except NotADirectoryError:
        return None
    except (OSError, ValueError) as exc:
        _warn(f"ignoring the damaged build record {info_file} ({exc.__class__.__name__}): `ggspec build` repairs it")
        return None
    try:
        info = _parse_info(raw)
    except (ValueError, TypeError) as exc:
        _warn(f"ignoring the damaged build record {info_file} ({exc}): `ggspec build` repairs it")
        return None
    if info.key != key or not any(Path(info.lib_dir).glob("libllama.*")):
        return None
    return info


def _damaged_record(key: str) -> bool:
    """A build.json is only ever written once its build finished: when it is there but unreadable,
    the tree it describes is complete and a `cmake --build` brings the record back cheaply."""
    root = paths.builds_dir() / key
    return ((root / "build.json").is_file() and _read_info_quietly(key) is None
            and (root / "build" / "CMakeCache.txt").is_file() and (root / "llama.cpp").is_dir())


def _read_info_quietly(key: str) -> BuildInfo | None:
    try:
        return _parse_info(json.loads((paths.builds_dir() / key / "build.json").read_bytes()))
    except (OSError, ValueError, TypeError):
        return None


def find_build(options: BuildOptions) -> BuildInfo | None:
    """The finished build for these options and the current patches, if there is one: a build
    with more targets (say, `--tools`) serves a request for fewer."""
    info = _read_info(build_key(options))
    return info if info is not None and info.has(options) else None


def _write_info(root: Path, info: BuildInfo) -> None:
    _write_json(root / "build.json", asdict(info) | {"cached": False})


def mark_current(info: BuildInfo) -> None:
    _write_json(paths.current_build_file(), {"key": info.key, "options": info.options})


SELECT_ENV = "GGSPEC_BUILD"  # a build key: this process uses that build instead of the current one


def current_options() -> BuildOptions | None:
    """The options of the build `ggspec build` last produced or selected, if any, or of the build
    `$GGSPEC_BUILD` names (a key under builds/: one process on, say, the Vulkan build while the
    current one stays the CPU build). A damaged current.json is ignored with a warning: the newest
    finished build that matches the current patches takes its place (and is recorded again, when
    $GGSPEC_HOME is writable)."""
    problem = paths.home_problem()
    if problem:
        raise BuildError(problem)
    selected = os.environ.get(SELECT_ENV)
    if selected:
        info = _read_info(selected) if re.fullmatch(r"[0-9a-f]{16}", selected) else None
        if info is None:
            raise BuildError(f"{SELECT_ENV}={selected}: no finished build of that key in {paths.builds_dir()}")
        return _options(info.options)
    f = paths.current_build_file()
    try:
        raw = json.loads(f.read_bytes())
        if not isinstance(raw, dict) or not isinstance(raw.get("key"), str):
            raise ValueError("no build key")
        return _options(raw.get("options"))
    except (FileNotFoundError, NotADirectoryError):
        return None
    except (OSError, ValueError, TypeError) as exc:
        why = str(exc) if type(exc) is ValueError else exc.__class__.__name__
        info = _newest_matching_build()
        if info is None:
            _warn(f"ignoring the damaged {f} ({why})")
            return None
        _warn(f"ignoring the damaged {f} ({why}): using build {info.key}, the newest that matches the patches")
        try:
            mark_current(info)
        except OSError:
            pass
        return _options(info.options)


def _newest_matching_build() -> BuildInfo | None:
    """The most recently finished build whose key matches its options and today's patches."""
    try:
        records = sorted(paths.builds_dir().glob("*/build.json"), key=lambda p: p.stat().st_mtime, reverse=True)
    except OSError:
        return None
    for record in records:
        info = _read_info_quietly(record.parent.name)
        if info is None or info.key != record.parent.name or not any(Path(info.lib_dir).glob("libllama.*")):
            continue
        try:
            if build_key(_options(info.options)) == info.key:
                return info
        except (ValueError, TypeError, BuildError):
            continue
    return None


def _check_home() -> None:
    """$GGSPEC_HOME must be a writable directory before anything is downloaded or compiled."""
    problem = paths.home_problem()
    if problem:
        raise BuildError(problem)
    home = paths.ggspec_home()
    try:
        home.mkdir(parents=True, exist_ok=True)
        probe = home / f".write-test.{os.getpid()}"
        probe.touch()
        probe.unlink()
    except OSError as exc:
        raise BuildError(f"GGSPEC_HOME {home} is not writable ({exc.strerror or exc})") from None


class Reporter:
    """What `build()` tells its caller; the CLI passes a rich-backed one."""

    def phase(self, name: str) -> None: ...
    def compile_line(self, percent: int | None, text: str) -> None: ...


def check_options(options: BuildOptions) -> None:
    """Catch option combinations cmake would only reject after a long configure."""
    if options.cuda_arch and not options.cuda:
        raise BuildError("--cuda-arch needs --cuda")
    if not options.cuda_fa and not options.cuda:
        raise BuildError("--no-cuda-fa needs --cuda")
    if options.vulkan:
        from ggspec.native import vulkan  # only Vulkan builds need its SDK

        vulkan.find_sdk()  # the missing packages are named now, not by cmake minutes later
    if options.cuda and not options.cuda_arch and shutil.which("nvidia-smi") is None:
        raise BuildError(
            "--cuda without --cuda-arch detects the GPU architecture, but no NVIDIA GPU is visible "
            "here: pass --cuda-arch (e.g. 90 for H100/H200, 89 for RTX 40xx, 86 for RTX 30xx)"
        )


def build(options: BuildOptions, force: bool = False, reporter: Reporter | None = None,
          mark: bool = True) -> BuildInfo:
    """The build for `options`: cached, extended by the missing targets, or made from scratch.
    It becomes the current build unless `mark` is False (a test building the Vulkan library
    beside the CPU one selects it per process with `$GGSPEC_BUILD`)."""
    reporter = reporter or Reporter()
    check_options(options)
    problem = paths.home_problem()
    if problem:
        raise BuildError(problem)
    patches = patch_files()
    key = build_key(options)
    existing = None if force else _read_info(key)
    if existing is not None and existing.has(options):
        existing.cached = True
        if not mark:
            return existing
        try:
            mark_current(existing)
        except OSError as exc:  # a read-only $GGSPEC_HOME still serves its builds
            _warn(f"cannot record {existing.key} as the current build in {paths.ggspec_home()} "
                  f"({exc.strerror or exc})")
        return existing
    _check_home()  # something will be written: fail before a download or a compile
    toolkit_args(options)  # a missing CUDA toolkit is said now, not after the download
    if existing is None and not force and _damaged_record(key):
        # the record of a finished build is damaged: compile into the same tree (up to date: seconds)
        existing = BuildInfo(key=key, root="", lib_dir="", options={}, patches=[], cpu_target="", seconds=0.0)

    t0 = time.perf_counter()
    root = paths.builds_dir() / key
    build_dir = root / "build"
    tree = root / "llama.cpp"
    if existing is None:  # from scratch: a fresh patched tree and build dir
        root.mkdir(parents=True, exist_ok=True)
        (root / "build.json").unlink(missing_ok=True)
        reporter.phase("download")
        tarball = obtain_sdist()
        reporter.phase("extract")
        extract_sdist(tarball)
        reporter.phase("patch")
        tree = prepare_tree(root, patches)
        shutil.rmtree(build_dir, ignore_errors=True)
        done: list[str] = []
    else:  # extend: the same configured tree, only the targets it lacks
        done = list(existing.targets)
    reporter.phase("configure")
    missing = [t for t in options.targets() if t not in done]
    compile_tree(tree, build_dir, options, missing, reporter.compile_line)

    info = BuildInfo(
        key=key,
        root=str(root),
        lib_dir=str(build_dir / "bin"),
        options=asdict(replace(options, tools=options.tools or bool(existing and existing.options.get("tools")))),
        patches=[p.name for p in patches],
        cpu_target=cpu_target(options.native),
        seconds=round(time.perf_counter() - t0 + (existing.seconds if existing else 0.0), 1),
        targets=done + missing,
    )
    _write_info(root, info)
    if mark:
        mark_current(info)
    return info
