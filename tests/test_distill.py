"""`ggspec distill` on the shipped tiny target: the pipeline end to end against the real patched
build (capture through llama.cpp, training, export, the parity check), determinism, resume, and the
refusals of what cannot work."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import gguf
import numpy as np
import pytest
from conftest import run_cli

torch = pytest.importorskip("torch")

from ggspec.distill import capture, corpus, parity, pipeline  # noqa: E402
from ggspec.distill.capture import CapturePlan, Dataset  # noqa: E402
from ggspec.errors import InputError  # noqa: E402

SMALL = ("--sequences", "24", "--prompt-len", "24", "--gen-len", "40", "--steps", "25", "--block", "8",
         "--draft-vocab", "384", "-t", "1")


@pytest.fixture(scope="module")
def distilled(tmp_path_factory, tiny_coder_pair, build_info):
    out = tmp_path_factory.mktemp("distill") / "draft.gguf"
    proc = run_cli("distill", "-m", str(tiny_coder_pair.target), "-o", str(out), *SMALL, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out, proc


def _reader(path: Path) -> gguf.GGUFReader:
    return gguf.GGUFReader(str(path))


def test_distilled_draft_is_a_dflash_gguf_with_a_reduced_vocabulary(distilled, tiny_coder_pair):
    out, proc = distilled
    assert "parity: draft logits" in proc.stderr  # checked inside llama.cpp against PyTorch
    r = _reader(out)
    tensors = {t.name: t for t in r.tensors}
    d2t = np.asarray(tensors["d2t"].data)
    assert d2t.dtype == np.int64 and len(d2t) == 384 and np.all(np.diff(d2t) > 0)
    assert tensors["output.weight"].shape.tolist() == [128, 384]  # its own head over the draft rows
    assert "token_embd.weight" not in tensors  # borrowed from the target
    assert r.fields["general.architecture"].contents() == "dflash"
    assert r.fields["dflash.target_layers"].contents() == [1, 2, 3]  # a 4-layer target: every input from 1
    assert r.fields["dflash.block_size"].contents() == 8
    target = _reader(tiny_coder_pair.target)
    assert r.fields["tokenizer.ggml.tokens"].contents() == target.fields["tokenizer.ggml.tokens"].contents()
    report = json.loads(Path(str(out) + ".json").read_text())
    assert set(report["stages"]) == {"capture", "train", "export"}
    assert report["capture"]["sequences"] == 24 and report["train"]["steps"] == 25
    assert 0 < report["train"]["coverage"] <= 1


def test_distilled_draft_is_lossless_in_ggspec_run(distilled, tiny_coder_pair):
    out, _ = distilled
    prompt = "def parse(text):\n"
    common = ("-m", str(tiny_coder_pair.target), "-p", prompt, "-n", "48", "-t", "1", "--ignore-eos")
    spec = run_cli("run", *common, "-md", str(out), "--spec-draft-n-max", "7")
    plain = run_cli("run", *common, "--no-spec")
    assert spec.returncode == 0 and plain.returncode == 0, spec.stderr + plain.stderr
    assert spec.stdout == plain.stdout
    assert "τ" in spec.stderr  # it did speculate


def test_distill_is_deterministic(distilled, tiny_coder_pair, tmp_path):
    out, _ = distilled
    again = tmp_path / "again.gguf"
    proc = run_cli("distill", "-m", str(tiny_coder_pair.target), "-o", str(again), *SMALL, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert again.read_bytes() == out.read_bytes()


def test_resume_continues_an_interrupted_capture(tiny_coder_pair, build_info, tmp_path):
    texts = corpus.split(corpus.builtin_texts())[0]
    plan = CapturePlan(n_seq=12, prompt_len=16, gen_len=24, parallel=4, threads=1, seed=3)

    def stop_after_first(done, total, n):
        if done == 4:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        capture.capture(tmp_path / "a", tiny_coder_pair.target, plan, (1, 2), texts, False, stop_after_first)
    assert Dataset.open(tmp_path / "a").n_done == 4
    capture.capture(tmp_path / "a", tiny_coder_pair.target, plan, (1, 2), texts, True)
    capture.capture(tmp_path / "b", tiny_coder_pair.target, plan, (1, 2), texts, False)
    a, b = Dataset.open(tmp_path / "a"), Dataset.open(tmp_path / "b")
    assert a.n_done == b.n_done == 12
    assert np.array_equal(a.tokens, b.tokens) and np.array_equal(a.lengths, b.lengths)
    assert np.allclose(a.rows(np.arange(12), 40), b.rows(np.arange(12), 40))
    with pytest.raises(InputError, match="other settings"):  # a resume never mixes data of other settings
        capture.capture(tmp_path / "a", tiny_coder_pair.target, replace(plan, gen_len=30), (1, 2), texts, True)


def test_features_survive_float16_storage():
    # Gemma's residual stream holds values far beyond float16's range: rows are stored scaled
    rng = np.random.default_rng(0)
    rows = (rng.standard_normal((5, 3 * 64)) * np.array([1e-3, 1.0, 3e5]).repeat(64)).astype(np.float32)
    f16, scale = capture.encode(rows, 3)
    back = (f16.astype(np.float32).reshape(5, 3, 64) * scale[..., None]).reshape(rows.shape)
    assert np.all(np.isfinite(back))
    assert np.allclose(back, rows, rtol=1e-3, atol=1e-3 * np.abs(rows).max(axis=1, keepdims=True).min())


def test_parity_check_catches_a_wrong_export(distilled, tiny_coder_pair, tmp_path):
    """The check compares what llama.cpp computes from the file with PyTorch: a draft whose weights
    differ from the file's fails it."""
    from ggspec.distill import export
    from ggspec.distill import train as trainer
    from ggspec.distill import vocab as dv
    from ggspec.distill.model import DraftConfig
    from ggspec.distill.target_file import read_target

    target = read_target(tiny_coder_pair.target)
    ds = Dataset.open(Path(str(distilled[0]) + ".work"))
    cfg = DraftConfig(n_embd=target.n_embd, target_layers=ds.layers, n_layer=1, head_dim=32, n_ff=128, block_size=8,
                      rope_base=target.rope_base, eps=target.eps, embed_scale=target.embed_scale, n_vocab_draft=256)
    vocab = dv.choose(np.asarray(ds.tokens).ravel(), np.asarray(ds.tokens).ravel(), 256, target.n_vocab)
    draft = trainer.init_draft(cfg, vocab, target.head, seed=0)
    path = tmp_path / "d.gguf"
    export.write_draft(path, draft, vocab, target, "test", "f32")
    args = (path, tiny_coder_pair.target, ds, target.mask_id, vocab.d2t, target.embed, target.head, "f32")
    assert parity.check(draft, *args).ok
    with torch.no_grad():
        draft.blocks[0].ffn.down.weight.mul_(1.5)
    assert not parity.check(draft, *args).ok


def test_default_layers_spread_like_the_z_lab_drafts():
    assert pipeline.default_layers(36) == (2, 10, 18, 26, 34)  # z-lab's [1, 9, 17, 25, 33] as layer inputs
    assert pipeline.default_layers(18) == (2, 5, 9, 13, 16)
    assert pipeline.default_layers(4) == (1, 2, 3)


def test_default_draft_vocabulary():
    assert pipeline.draft_vocab_size(None, 1024, 700) == 0  # small vocabularies stay whole
    assert pipeline.draft_vocab_size(None, 262144, 1500) == 2048  # every label token, rounded up
    assert pipeline.draft_vocab_size(None, 262144, 90000) == 32768
    assert pipeline.draft_vocab_size(512, 262144, 1500) == 512  # as asked


# --- refusals: one line, exit 1, before any decode --------------------------------------------------


def _refused(*args: str) -> str:
    proc = run_cli("distill", *args)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stderr
    return lines[0]


def test_refuses_a_target_without_layer_input_extraction(tmp_path):
    path = tmp_path / "gpt2.gguf"
    w = gguf.GGUFWriter(str(path), "gpt2")
    w.add_uint32("gpt2.embedding_length", 64)
    w.add_uint32("gpt2.block_count", 2)
    w.add_uint32("gpt2.context_length", 128)
    w.add_token_list(["a", "b", "c"])
    w.add_tensor("token_embd.weight", np.zeros((3, 64), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    line = _refused("-m", str(path), "-o", str(tmp_path / "d.gguf"))
    assert "'gpt2'" in line and "layer-input extraction" in line


def test_refuses_what_cannot_work(tiny_coder_pair, tmp_path):
    t = str(tiny_coder_pair.target)
    o = str(tmp_path / "d.gguf")
    assert "--layers" in _refused("-m", t, "-o", o, "--layers", "1,4")
    assert "0..3" in _refused("-m", t, "-o", o, "--layers", "1,4")
    assert "--layers" in _refused("-m", t, "-o", o, "--layers", "1,x")
    assert "--draft-vocab" in _refused("-m", t, "-o", o, "--draft-vocab", "5000")
    assert "disk space" in _refused("-m", t, "-o", o, "--sequences", "100000000")
    assert "--block" in _refused("-m", t, "-o", o, "--block", "1")
    assert "-o" in _refused("-m", t)
    assert "--outtype" in _refused("-m", t, "-o", o, "--outtype", "q4")
    assert "-s" in _refused("-m", t, "-o", o, "--seed", "-5")
    assert "context" in _refused("-m", t, "-o", o, "--prompt-len", "100000")
    assert "work folder" in _refused("-m", t, "-o", o, "--work", "/etc/passwd")


# --- the real pretrained target ----------------------------------------------------------------------


@pytest.mark.real
def test_distill_on_gemma_3_270m(real_target, tmp_path):
    """On the real file: a 262k SentencePiece vocabulary copied into the draft, a tied Q8_0 head
    dequantized for the reduced one, layer inputs up to ~1e5 (stored scaled), llama.cpp's d2t
    scatter; the parity check passes and speculation with the draft stays lossless."""
    out = tmp_path / "gemma-draft.gguf"
    proc = run_cli("distill", "-m", str(real_target), "-o", str(out), "--sequences", "8", "--prompt-len", "24",
                   "--gen-len", "24", "-np", "8", "--steps", "6", "--block", "8", "--draft-layers", "1",
                   "--draft-vocab", "512", "--outtype", "q8_0", "-t", "2", timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "parity: draft logits" in proc.stderr
    report = json.loads(Path(str(out) + ".json").read_text())
    assert report["layers"] == [2, 5, 9, 13, 16]  # z-lab's spread over Gemma 3's 18 layers
    r = _reader(out)
    assert len(r.fields["tokenizer.ggml.tokens"].data) == 262144
    assert r.fields["tokenizer.ggml.mask_token_id"].contents() == 4  # Gemma's <mask>
    types = {t.name: t.tensor_type.name for t in r.tensors}
    assert types["blk.0.ffn_up.weight"] == "Q8_0" and types["output.weight"] == "Q8_0"
    assert types["fc.weight"] == "F32"  # Gemma's raw layer inputs (~1e5) overflow f16 and lose q8_0 blocks
    assert not Path(str(out) + ".partial").exists()
    from ggspec.runtime import ContextParams
    from ggspec.speculative.engine import Engine
    from ggspec.speculative.lossless import run_prompts
    from ggspec.speculative.models import PairConfig

    prompts = ["The history of the printing press begins in the fifteenth century, when",
               "def merge_sorted(a, b):\n    \"\"\"Merge two sorted lists into one sorted list.\"\"\"\n"]
    ctx = ContextParams(n_ctx=1024, n_threads=2)
    with Engine.open(PairConfig(target=real_target, draft=out, fixed_block=True, n_max=3, ctx=ctx)) as sp:
        runs = list(run_prompts(sp, prompts, 32))
    # on a real model a batched verify may flip a genuine near-tie; anything else is a bug
    real = [f"prompt {i}: {r.divergence.describe()}" for i, r in enumerate(runs) if r.divergence and not r.divergence.benign]
    assert not real, "\n".join(real)
    for i, r in enumerate(runs):
        if r.divergence:
            print(f"prompt {i}: {r.divergence.describe()}")


def test_without_pytorch_says_how_to_get_it(tiny_coder_pair, tmp_path):
    import subprocess
    import sys

    code = ("import sys; sys.modules['torch'] = None; "  # an import of torch now fails as if it were absent
            f"sys.argv = ['ggspec', 'distill', '-m', {str(tiny_coder_pair.target)!r}, '-o', {str(tmp_path / 'd.gguf')!r}]; "
            "from ggspec.cli import main; main()")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "pip install 'ggspec[train]'" in proc.stderr
