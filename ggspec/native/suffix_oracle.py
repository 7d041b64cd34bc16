"""The `suffix` draft type's exactness oracle: arctic-inference's SuffixDecodingCache (Snowflake's
reference implementation of SuffixDecoding), built from its PyPI source by `ggspec build --tools`.

arctic-inference itself does not install on a CPU machine without a GPU stack (its build needs
torch and vLLM's), but its suffix tree is a small standalone C++ extension: this downloads the
pinned source (sha256-checked, from the package index pip uses), compiles `csrc/suffix_decoding`
with cmake and nanobind (the test extra), and lays it out as an importable package under
`$GGSPEC_HOME/oracles/`. tests/test_suffix.py imports it from there; nothing else does.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
import urllib.request
from pathlib import Path

from ggspec.native.errors import BuildError
from ggspec.native import paths

PACKAGE, VERSION = "arctic-inference", "0.3.0"
SHA256 = "7f22e3e1b1071c6061c0d6951be17c0fb50b08d06d6e543144c8f52faba60a36"
INDEX = "https://pypi.org/simple"
STEM = f"arctic_inference-{VERSION}"


def oracle_dir() -> Path:
    """Where the built oracle lives: put it on sys.path, then `import arctic_inference.suffix_decoding`."""
    return paths.ggspec_home() / "oracles" / STEM


def is_built() -> bool:
    return (oracle_dir() / ".complete").is_file()


def ensure(log=print) -> Path | None:
    """The oracle, built once; None (with a line saying why) where nanobind is not installed."""
    if is_built():
        return oracle_dir()
    try:
        import nanobind  # noqa: F401, PLC0415
    except ImportError:
        log(f"note: the suffix oracle ({PACKAGE} {VERSION}) needs nanobind: pip install -e '.[test]'")
        return None
    with tempfile.TemporaryDirectory(prefix="ggspec-oracle-") as tmp:
        src = _unpack(_download(Path(tmp)), Path(tmp))
        _compile(src, Path(tmp) / "build", oracle_dir())
    log(f"built the suffix oracle ({PACKAGE} {VERSION}'s SuffixTree): {oracle_dir()}")
    return oracle_dir()


def _download(tmp: Path) -> Path:
    """The pinned sdist from the index (its simple JSON API), checked against SHA256."""
    req = urllib.request.Request(f"{INDEX}/{PACKAGE}/", headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            files = json.load(r)["files"]
        url = next(f["url"] for f in files if f["filename"] == f"{STEM}.tar.gz")
        dest = tmp / f"{STEM}.tar.gz"
        with urllib.request.urlopen(url, timeout=120) as r, open(dest, "wb") as out:
            shutil.copyfileobj(r, out)
    except (OSError, StopIteration, KeyError, ValueError) as e:
        raise BuildError(f"cannot download {PACKAGE} {VERSION}'s source from {INDEX}: {e}") from None
    if hashlib.sha256(dest.read_bytes()).hexdigest() != SHA256:
        raise BuildError(f"{dest.name}: sha256 differs from the pinned {SHA256}")
    return dest


def _unpack(tarball: Path, tmp: Path) -> Path:
    with tarfile.open(tarball) as tar:
        tar.extractall(tmp, filter="data")
    return tmp / STEM


def _compile(src: Path, build: Path, dest: Path) -> None:
    """cmake + nanobind over csrc/suffix_decoding, then a package: arctic_inference.suffix_decoding
    (its own __init__.py and cache.py) with the compiled `_C` beside them."""
    cmake = ["cmake", "-S", str(src / "csrc" / "suffix_decoding"), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release",
             f"-DPython_EXECUTABLE={sys.executable}"]
    for cmd in (cmake, ["cmake", "--build", str(build), "-j", "2"]):
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["(no output)"]
            raise BuildError(f"building the suffix oracle failed: {' '.join(cmd[:2])}: {tail[0]}")
    partial = dest.with_name(dest.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    pkg = partial / "arctic_inference" / "suffix_decoding"
    pkg.mkdir(parents=True)
    (partial / "arctic_inference" / "__init__.py").write_text("")
    for name in ("__init__.py", "cache.py"):
        shutil.copy(src / "arctic_inference" / "suffix_decoding" / name, pkg / name)
    for lib in build.glob("_C*.so"):
        shutil.copy(lib, pkg / lib.name)
    (partial / ".complete").write_text(VERSION)
    shutil.rmtree(dest, ignore_errors=True)
    partial.rename(dest)
