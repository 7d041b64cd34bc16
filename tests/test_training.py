"""The training script runs end to end with a tiny step count and exports loadable models that
match their PyTorch originals inside the patched llama.cpp (logits and draft proposals)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from conftest import run_cli

REPO = Path(__file__).resolve().parents[1]


def _train(out: Path, *extra: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "train_tiny_pair.py"), "--out", str(out),
                           "--smoke", *extra], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return proc


def test_training_smoke_run(tmp_path, build_info):
    pytest.importorskip("torch")
    pytest.importorskip("tokenizers")
    out = tmp_path / "smoke"
    proc = _train(out)
    assert "parity: target logits" in proc.stdout, proc.stdout  # the check ran against llama.cpp
    target, draft = out / "tiny-coder.gguf", out / "tiny-coder-dflash-b8.gguf"
    run = run_cli("run", "-m", str(target), "-md", str(draft), "-p", "import os\n", "-n", "16", "--ignore-eos")
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("import os\n")


def test_training_is_deterministic(tmp_path, build_info):
    pytest.importorskip("torch")
    pytest.importorskip("tokenizers")
    _train(tmp_path / "a", "--no-check")
    _train(tmp_path / "b", "--no-check")
    for name in ("tiny-coder.gguf", "tiny-coder-dflash-b8.gguf"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
