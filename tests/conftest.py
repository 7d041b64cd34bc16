"""Shared fixtures: the real patched build and tiny generated model pairs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ggspec.catalogue.tiny import ensure_tiny_pair, write_dflash_draft
from ggspec.native import build as nb

# Held-out style prompts: code and prose, all ASCII so the tiny byte-level vocab covers them.
PROMPTS = [
    "def fibonacci(n):",
    "import os\nimport sys\n\n",
    "class Stack:\n    def __init__(self):",
    "The quick brown fox",
    "for i in range(10):\n    print(i)",
    "Once upon a time, there was",
    "x = [1, 2, 3]\ny = ",
    "SELECT name FROM users WHERE",
    "# Compute the mean of a list\n",
    "if __name__ == '__main__':",
    "while True:\n    line = input()",
    "The results show that",
    "return sum(a * b for a, b in zip(",
    "Dear Sir or Madam,",
    "try:\n    value = int(text)\nexcept",
    "def parse(path: str) -> dict:",
    "In 1905, Einstein published",
    "with open('data.txt') as f:",
    "lambda x: x ** 2 +",
    "A list of prime numbers: 2, 3, 5,",
]


@pytest.fixture(scope="session")
def build_info() -> nb.BuildInfo:
    """The build `ggspec build` made last (the README's test command builds `--tools`): a cache hit."""
    return nb.build(nb.current_options() or nb.BuildOptions())


@pytest.fixture(scope="session")
def lc(build_info):
    from ggspec.native.bindings import load

    return load()


@pytest.fixture(scope="session")
def tool(build_info) -> Path:
    """llama.cpp's speculative loop (llama-speculative-simple) of that build."""
    from ggspec.bench.native import TOOL, find_tool

    return find_tool(TOOL)


@pytest.fixture(scope="session")
def fixture_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("fixtures")


@pytest.fixture(scope="session")
def dense_pair(fixture_dir):
    return ensure_tiny_pair(fixture_dir, "dense")


@pytest.fixture(scope="session")
def hybrid_pair(fixture_dir):
    return ensure_tiny_pair(fixture_dir, "hybrid")


@pytest.fixture(scope="session")
def bad_drafts(fixture_dir) -> dict[str, Path]:
    """DFlash drafts that do not fit the dense target."""
    d = fixture_dir / "bad"
    d.mkdir(exist_ok=True)
    return {
        "n_embd": write_dflash_draft(d / "embd.gguf", target_kind="dense", seed=0, n_embd=64),
        "layers": write_dflash_draft(d / "layers.gguf", target_kind="dense", seed=0, target_layers=[1, 9]),
        "vocab": write_dflash_draft(d / "vocab.gguf", target_kind="dense", seed=0, n_vocab_extra=7),
    }


def run_cli(*args: str, timeout: float = 120, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run `ggspec ...` in a subprocess, so an abort inside llama.cpp cannot kill the tests."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", COLUMNS="200", **(env or {}))
    return subprocess.run([sys.executable, "-m", "ggspec.cli", *args], capture_output=True,
                          text=True, timeout=timeout, env=env)


REAL_PAIR = "gemma-3-270m"


@pytest.fixture(scope="session")
def real_target() -> Path:
    """The real pretrained target (Gemma 3 270M Q4_K_M), when `ggspec models pull` has fetched it;
    tests marked `real` skip otherwise (`.ci/run` pulls it)."""
    from ggspec.catalogue.pairs import check_files, get_entry, resolve

    entry = get_entry(REAL_PAIR)
    if check_files(entry, None) != "ok":
        pytest.skip(f"{REAL_PAIR} is not pulled: run `ggspec models pull {REAL_PAIR}`")
    return resolve(entry).target


# --- GPU (tests marked `gpu`; scripts/device_check.sh runs them on a machine with one) -----------


def gpu_device_names(build_info: nb.BuildInfo) -> list[str]:
    """The GPU devices the ggml-backend registry of this build lists (after llama.cpp is loaded,
    so the registry is the one ggspec uses)."""
    import ctypes

    from ggspec.native.bindings import load

    load()
    ggml = ctypes.CDLL(str(Path(build_info.lib_dir) / "libggml.so"))
    ggml.ggml_backend_dev_count.restype = ctypes.c_size_t
    ggml.ggml_backend_dev_get.argtypes, ggml.ggml_backend_dev_get.restype = [ctypes.c_size_t], ctypes.c_void_p
    ggml.ggml_backend_dev_type.argtypes, ggml.ggml_backend_dev_type.restype = [ctypes.c_void_p], ctypes.c_int
    ggml.ggml_backend_dev_name.argtypes, ggml.ggml_backend_dev_name.restype = [ctypes.c_void_p], ctypes.c_char_p
    devices = [ggml.ggml_backend_dev_get(i) for i in range(ggml.ggml_backend_dev_count())]
    gpu = 1  # GGML_BACKEND_DEVICE_TYPE_GPU
    return [ggml.ggml_backend_dev_name(d).decode() for d in devices if ggml.ggml_backend_dev_type(d) == gpu]


@pytest.fixture(scope="session")
def gpu_build(build_info) -> nb.BuildInfo:
    """The current build, when it has a GPU backend and sees a GPU device; skips otherwise."""
    options = build_info.options
    if not (options.get("cuda") or options.get("vulkan")):
        pytest.skip("the current build has no GPU backend (`ggspec build --cuda` on a machine with a GPU)")
    names = gpu_device_names(build_info)
    if not names:
        pytest.skip(f"the current build ({build_info.key}) sees no GPU device")
    return build_info


@pytest.fixture(scope="session")
def tiny_coder_pair():
    """The shipped trained dense pair (models/tiny/): its target and draft paths."""
    from ggspec.catalogue.pairs import get_entry, resolve

    return resolve(get_entry("tiny-coder"))
