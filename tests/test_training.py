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


@pytest.mark.parametrize("script, made", [("train_tiny_draft.py", "tiny-coder-draft.gguf"),
                                          ("train_tiny_eagle3.py", "tiny-coder-eagle3.gguf")])
def test_the_draft_training_scripts_make_files_that_speculate(script, made, tmp_path, build_info):
    """draft-simple's and EAGLE3's training scripts, a few steps: their files load against the
    shipped target and speculate losslessly."""
    pytest.importorskip("torch")
    pytest.importorskip("tokenizers")
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / script), "--out", str(tmp_path), "--smoke"],
                          capture_output=True, text=True, timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    run = run_cli("run", "-m", str(REPO / "models" / "tiny" / "tiny-coder.gguf"), "-md", str(tmp_path / made),
                  "-p", "import os\n", "-n", "24", "--check")
    assert run.returncode == 0 and "identical" in run.stderr, run.stderr


def test_the_shipped_eagle3_head_drafts_what_its_pytorch_twin_predicts(build_info):
    """The twin in scripts/train_tiny_eagle3.py computes what llama.cpp's eagle3 graph computes:
    its first draft token at every step of a real run is llama.cpp's."""
    torch = pytest.importorskip("torch")
    import gguf
    import numpy as np

    sys.path.insert(0, str(REPO / "scripts"))
    from conftest import PROMPTS
    from helpers.drafts import Recorder
    from train_tiny_draft import load_target
    from train_tiny_eagle3 import Eagle3, target_features

    from ggspec.runtime import ContextParams
    from ggspec.speculative.driver import generate_spec
    from ggspec.speculative.engine import Engine
    from ggspec.speculative.models import PairConfig

    tiny = REPO / "models" / "tiny"
    target, _ = load_target(tiny / "tiny-coder.gguf")
    tensors = {t.name: torch.from_numpy(np.array(t.data)) for t in gguf.GGUFReader(str(tiny / "tiny-coder-eagle3.gguf")).tensors}
    head = Eagle3(target.cfg.n_embd, target.cfg.n_embd, target.cfg.eps, target.cfg.rope_base)
    names = {"fc": head.fc, "blk.0.attn_q": head.q, "blk.0.attn_k": head.k, "blk.0.attn_v": head.v,
             "blk.0.attn_output": head.o, "blk.0.ffn_gate": head.ffn.gate, "blk.0.ffn_up": head.ffn.up,
             "blk.0.ffn_down": head.ffn.down, "output": head.head, "blk.0.attn_norm": head.attn_norm,
             "blk.0.attn_norm_2": head.hidden_norm, "blk.0.ffn_norm": head.ffn_norm, "output_norm": head.norm}
    with torch.no_grad():
        for name, mod in names.items():
            mod.weight.copy_(tensors[name + ".weight"].float().reshape(mod.weight.shape))
    d2t = tensors["d2t"].long()
    cfg = PairConfig(target=tiny / "tiny-coder.gguf", draft=tiny / "tiny-coder-eagle3.gguf", n_max=4,
                     ctx=ContextParams(n_ctx=2048, n_threads=1, flash_attn="off"))
    same = total = 0
    with Engine.open(cfg) as eng:
        for text in PROMPTS[:3]:
            ids = eng.target_model.tokenize(text)
            rec = Recorder(eng.proposer)
            hist = list(ids) + [t for st in generate_spec(eng, ids, 48, ignore_eos=True, proposer=rec) for t in st.tokens]
            for pos, _, draft in rec.log:
                with torch.no_grad():
                    feats, _ = target_features(target, torch.tensor([hist[:pos + 1]]))
                    emb = torch.nn.functional.embedding(torch.tensor([hist[1:pos + 1]]), target.embed.weight)
                    logits = head.unrolled(emb, feats[:, :pos], 1)[0]
                same += int(d2t[logits[0, -1].argmax()]) == draft[0]
                total += 1
    assert total > 10 and same == total, (same, total)
