"""draft-mtp with a Gemma 4 assistant: a separate drafter that reads the target's KV cache.

On the converter-shaped tiny pair of helpers.fixtures.gemma4 (a gemma4 target in E2B's layout:
sliding-window groups, wider full-attention heads with proportional RoPE, the last layers sharing
earlier layers' KV; a gemma4-assistant drafter of four Q-only layers): drafts equal those of
`llama-speculative-simple -md DRAFTER --spec-type draft-mtp` (patch 0009's dump) at every common
position with the drafter's own acceptance, the p-min cut and n-min (forced acceptance of every
count, n_max 1..7: tests/test_exactness.py); greedy output equals plain greedy output, alone,
with three sequences and with the prompt cache; a request in a reused slot drafts as it would
alone; sampled drafts keep the target's distribution; pairs the drafter cannot read are refused
in one line. Needs a `ggspec build --tools` build.
"""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pytest
from conftest import PROMPTS, run_cli
from helpers.drafts import ggspec_drafts, spec_equals_plain, three_at_once_equal_plain, unforced_drafts_equal_llama_cpps
from helpers.fixtures.gemma4 import DRAFTER, ensure_gemma4_pair, write_gemma4_drafter
from helpers.pairs import MTP_CTX as CTX
from helpers.pairs import MTP_N as N
from helpers.pairs import MTP_PROMPT as PROMPT
from helpers.serving import serve_equals_plain
from helpers.stats import draft_model_decoded, p_value, plain_and_spec_draws

from ggspec.bench.forced import ForcedAcceptance, cycle_lengths
from ggspec.catalogue.tiny import ensure_tiny_pair
from ggspec.errors import InputError
from ggspec.speculative.engine import Engine, Serving
from ggspec.speculative.lossless import run_prompts
from ggspec.speculative.models import Models, PairConfig
from ggspec.speculative.sampling import SamplerSettings
from ggspec.speculative.stats import merge
from ggspec.speculative.types.draft_vocab import draft_vocab_ids
from ggspec.speculative.types.mtp import MTPOptions


@pytest.fixture(scope="module")
def gemma4(fixture_dir):
    return ensure_gemma4_pair(fixture_dir)


def _cfg(gemma4, **kw) -> PairConfig:
    return PairConfig(target=gemma4.target, draft=gemma4.drafter, **({"ctx": CTX} | kw))


# --- detection and refusals -----------------------------------------------------------------------


def test_a_gemma4_assistant_given_as_the_draft_drafts_draft_mtp(gemma4):
    for spec_type in (None, "draft-mtp"):  # detected from the file; llama.cpp needs the type named
        with Models(_cfg(gemma4, spec_type=spec_type)) as models:
            assert models.plan.spec_type == "draft-mtp" and models.plan.shares_cells
            assert models.draft is not None and models.draft.arch == "gemma4-assistant"
            assert not models.target.load_mtp  # the target has no MTP block: nothing more to load
    with Models(_cfg(gemma4, use_draft=False)) as models:  # --no-draft: plain
        assert models.plan.spec_type is None and models.draft is None


def test_pairs_the_drafter_cannot_read_are_refused_in_one_line(gemma4, fixture_dir, tmp_path):
    with pytest.raises(InputError, match="no MTP block of its own.*gemma4-assistant"):
        Models(PairConfig(target=gemma4.target, spec_type="draft-mtp"))
    with pytest.raises(InputError, match="MTP drafter: its spec type is draft-mtp"):
        Models(_cfg(gemma4, spec_type="draft-dflash"))
    other = ensure_tiny_pair(fixture_dir, "hybrid-mtp").target
    with pytest.raises(InputError, match="drafts for a gemma4 target; this target's architecture is 'qwen35'"):
        Models(PairConfig(target=other, draft=gemma4.drafter))
    for what, spec in (("KV heads", replace(DRAFTER, n_head_kv=2, n_head=4)),
                       ("key_length_swa", replace(DRAFTER, head_dim_swa=16)),
                       ("embedding_length_out", replace(DRAFTER, n_embd_out=96)),
                       ("sliding_window", replace(DRAFTER, sliding_window=64))):
        bad = write_gemma4_drafter(tmp_path / f"bad-{what}.gguf", spec=spec)
        with pytest.raises(InputError, match=what):
            Models(PairConfig(target=gemma4.target, draft=bad))


def test_cli_runs_the_drafter(gemma4, tmp_path):
    res = run_cli("run", "-m", str(gemma4.target), "-md", str(gemma4.drafter), "-p", PROMPT, "-n", "24",
                  "--spec-draft-n-max", "3", "--check")
    assert res.returncode == 0, res.stderr
    assert "draft-mtp" in res.stderr and "identical" in res.stderr, res.stderr
    res = run_cli("run", "-m", str(gemma4.target), "-md", str(gemma4.drafter), "-p", PROMPT, "-n", "24",
                  "--spec-draft-n-max", "5", "--spec-draft-chain", "--spec-draft-vocab", "300", "-np", "2", "--check")
    assert res.returncode == 0, res.stderr
    assert "identical" in res.stderr and "unified" in res.stderr, res.stderr
    bad = write_gemma4_drafter(tmp_path / "bad.gguf", spec=replace(DRAFTER, head_dim_full=32))
    res = run_cli("run", "-m", str(gemma4.target), "-md", str(bad), "-p", PROMPT, "-n", "8")
    assert res.returncode != 0 and "Traceback" not in res.stderr and "key_length" in res.stderr, res.stderr
    res = run_cli("run", "-m", str(gemma4.target), "--spec-type", "draft-mtp", "-p", PROMPT, "-n", "8")
    assert res.returncode != 0 and "Traceback" not in res.stderr and "drafter" in res.stderr, res.stderr


# --- exactness against llama.cpp's loop -----------------------------------------------------------


@pytest.mark.parametrize("p_min,n_min", [(0.0, 0), (0.9, 0), (0.9, 2)])
def test_unforced_drafts_and_p_min_cuts_equal_llama_cpps(p_min, n_min, gemma4, tool):
    unforced_drafts_equal_llama_cpps(tool, _cfg(gemma4, n_max=5, p_min=p_min, n_min=n_min), PROMPT, "draft-mtp", N)


# --- losslessness ---------------------------------------------------------------------------------


@pytest.mark.parametrize("n_max", [2, 7])
def test_greedy_output_is_plain_greedy_output(n_max, gemma4):
    with Engine.open(_cfg(gemma4, n_max=n_max)) as eng:
        offsets = itertools.count()

        def make(prompt, plain):
            lengths = itertools.islice(cycle_lengths(n_max), next(offsets), None)
            return ForcedAcceptance(eng.proposer, np.concatenate([prompt, plain]), lengths, eng.target_model.n_vocab)

        runs = list(run_prompts(eng, PROMPTS[:6], 64, make)) + list(run_prompts(eng, PROMPTS[6:9], 64))
    failures = [f"prompt {i}: {r.divergence.describe()}" for i, r in enumerate(runs) if r.divergence]
    assert not failures, "\n".join(failures)
    stats = merge(r.spec_stats for r in runs)
    assert stats.drafted > 0 and stats.accepted > 0


def test_parallel_sequences_draft_in_one_call_per_position(gemma4):
    """Three sequences at once: each one's output is its plain greedy output, and a step makes at
    most n_max draft decodes + 1 verify (no catch-up: the drafter reads the target's cells)."""
    n_max = 4
    with Engine.open(_cfg(gemma4, n_max=n_max, parallel=3)) as eng:
        three_at_once_equal_plain(eng, 40)
        assert eng.stats.max_calls <= n_max + 1, eng.stats


@pytest.mark.parametrize("prompt_cache", [False, True])
def test_a_request_never_sees_the_state_of_the_one_before(prompt_cache, gemma4):
    """B after A drafts exactly as B alone, and A again (all but its last token cached) as A."""
    def drafts_of(eng, text):
        return ggspec_drafts(eng, text, 4, forced=True)[0]

    cfg = _cfg(gemma4, n_max=4)
    with Engine.open(cfg, serving=Serving(prompt_cache=prompt_cache)) as eng:
        alone = [drafts_of(eng, PROMPTS[3])]
    with Engine.open(cfg, serving=Serving(prompt_cache=prompt_cache)) as eng:
        alone.append(drafts_of(eng, PROMPTS[7]))
    with Engine.open(cfg, serving=Serving(prompt_cache=prompt_cache)) as eng:
        drafts_of(eng, PROMPTS[7])
        after = [drafts_of(eng, PROMPTS[3]), drafts_of(eng, PROMPTS[7])]
    assert after == alone


# --- sampling -------------------------------------------------------------------------------------


def test_sampled_drafts_keep_the_target_distribution(gemma4):
    """At temperature 1 the drafter's distribution travels with its drafts: rejection sampling keeps
    the target's (chi-square over many seeds, as tests/test_sampling_engine.py)."""
    cfg = _cfg(gemma4, n_max=3, ctx=replace(CTX, n_ctx=4096), parallel=8,
               sampling=SamplerSettings(temp=1.0, top_k=0, top_p=1.0, min_p=0))
    with Models(cfg) as models:
        prompt = models.target.tokenize(PROMPT)
        plain, spec = plain_and_spec_draws(models, cfg, prompt, n=3, check=draft_model_decoded)
    assert len(plain) > 5
    assert p_value(plain, spec) > 0.01


# --- bench and serve --------------------------------------------------------------------------------


def test_bench_runs_the_drafter_beside_llama_cpps_loop(gemma4, tmp_path):
    import json

    out = tmp_path / "bench.json"
    res = run_cli("bench", "-m", str(gemma4.target), "-md", str(gemma4.drafter), "--native", "--spec-draft-n-max", "3",
                  "-n", "16", "-r", "1", "--acceptance-profile", "mtp", "--save", str(out), timeout=300)
    assert res.returncode == 0, res.stderr
    doc = json.loads(out.read_text())
    assert doc["settings"]["spec_type"] == "draft-mtp"
    assert {"spec", "native", "native-baseline"} <= {c["kind"] for c in doc["configs"]}
    spec = [r for r in doc["runs"] if r["config"].startswith("kind=spec|")]
    native = [r for r in doc["runs"] if r["config"].startswith("kind=native|")]
    assert spec and native and all(r["divergence"] is None for r in spec)
    assert all(r["stats"]["drafted"] > 0 for r in spec + native)  # llama.cpp's loop got the drafter too


def test_serve_drafts_with_the_drafter_for_concurrent_clients(gemma4):
    serve_equals_plain(gemma4.target, "-md", str(gemma4.drafter))


# --- chained drafting and a reduced draft vocabulary (patch 0011) --------------------------------------


def _chained_and_not(gemma4, n_max: int, forced: bool = True, **kw) -> list[list]:
    logs = []
    for chain in (False, True):
        with Engine.open(_cfg(gemma4, n_max=n_max, spec_options={"draft-mtp": MTPOptions(chain=chain)}, **kw)) as eng:
            logs.append(ggspec_drafts(eng, PROMPT, n_max, forced=forced)[0])
    return logs


@pytest.mark.parametrize("n_max", range(1, 8))
def test_chained_drafts_are_the_unchained_drafts(n_max, gemma4):
    """All n_max steps of the drafter in one graph (argmax, the next token's target embedding and
    the projected state on the device, every step at id_last's position over the target's cells)
    draft exactly what one decode per step drafts, at every position."""
    unchained, chained = _chained_and_not(gemma4, n_max)
    assert chained == unchained


def test_chained_confidence_cuts_like_the_unchained_loop(gemma4):
    unchained, chained = _chained_and_not(gemma4, 5, forced=False, p_min=0.9, n_min=2)
    assert chained == unchained
    assert len({len(d) for _, _, d in chained}) > 2  # the cut did bite


def test_chained_steps_make_two_calls_whatever_the_draft_length(gemma4):
    """Three sequences: each output is its plain greedy output, and a step is one draft call and
    the verify (no catch-up); unchained it is n_max draft calls. Chained, the target's cache is
    one stream (the chain reads it in one step-major ubatch), and the engine says so."""
    n_max = 6
    calls = {}
    for chain in (False, True):
        with Engine.open(_cfg(gemma4, n_max=n_max, parallel=3, spec_options={"draft-mtp": MTPOptions(chain=chain)})) as eng:
            three_at_once_equal_plain(eng, 40)
            calls[chain] = eng.stats.max_calls
            assert eng.target.params.kv_unified == chain
            assert any("unified" in w for w in eng.warnings) == chain
    assert calls[True] <= 2 and calls[False] >= n_max + 1, calls


def test_a_reduced_vocabulary_changes_acceptance_never_the_output(gemma4):
    n_vocab_draft = 200  # of the fixture's 512 tokens
    with Engine.open(_cfg(gemma4, n_max=4, spec_options={"draft-mtp": MTPOptions(chain=True, vocab=n_vocab_draft)})) as eng:
        same, log = spec_equals_plain(eng, PROMPTS[:4], 40)
        allowed = set(draft_vocab_ids(eng.target_model, n_vocab_draft).tolist())
        assert eng.draft_model.draft_vocab is not None  # on the drafter's head, not the target's
    assert same
    assert all(set(d) <= allowed for _, _, d in log) and any(d for _, _, d in log)
