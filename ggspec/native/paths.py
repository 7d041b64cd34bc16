"""Where ggspec keeps its pinned source, its builds and its generated fixtures."""

from __future__ import annotations

import os
from pathlib import Path

# The pin: the llama.cpp tree vendored in this llama-cpp-python sdist, together with the
# ctypes bindings written for exactly that tree (see shared LLAMA_NOTES).
PIN_PACKAGE = "llama-cpp-python"
PIN_VERSION = "0.3.36"
SDIST_STEM = f"llama_cpp_python-{PIN_VERSION}"

REPO_ROOT = Path(__file__).resolve().parents[2]


def ggspec_home() -> Path:
    """Cache root: `$GGSPEC_HOME`, default `~/.cache/ggspec`."""
    env = os.environ.get("GGSPEC_HOME")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "ggspec"


def home_problem() -> str:
    """Why `$GGSPEC_HOME` cannot hold ggspec's state ("" when it can, or does not exist yet)."""
    home = ggspec_home()
    for folder in (home, *home.parents):
        if folder.exists():
            if not folder.is_dir():
                return f"GGSPEC_HOME {home}: {folder} is not a directory"
            break
    return ""


def patches_dir() -> Path:
    """The ordered patch series (`NNNN-name.patch`); `$GGSPEC_PATCHES` overrides it."""
    env = os.environ.get("GGSPEC_PATCHES")
    return Path(env) if env else REPO_ROOT / "patches"


def sdist_dir() -> Path:
    """The extracted, pristine sdist (source tree + bindings)."""
    return ggspec_home() / "src" / SDIST_STEM


def builds_dir() -> Path:
    return ggspec_home() / "builds"


def current_build_file() -> Path:
    return ggspec_home() / "current.json"


def fixtures_dir() -> Path:
    return ggspec_home() / "fixtures"
