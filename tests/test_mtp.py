"""draft-mtp: drafting with the target's own MTP block, against llama.cpp's own draft-mtp loop.

On the converter-shaped tiny hybrid targets with one MTP block (`hybrid-mtp`: qwen35 with
`nextn_predict_layers = 1` and the block's tensors under `blk.4.*`; `hybrid-moe-mtp`: qwen35moe,
experts in every block), as written and with a fitted head (helpers.fixtures.mtp_head): the drafts equal those of
`llama-speculative-simple --spec-type draft-mtp` (patch 0009's dump) at every common position with
the heads' own acceptance, the p-min cut and n-min (forced acceptance of every count, n_max 1..7 on
both targets: tests/test_exactness.py); greedy output equals plain greedy output; a request never
sees the carried state of the one before it; sampled drafts keep the target's distribution. Needs
a `ggspec build --tools` build.
"""

from __future__ import annotations

import itertools
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from conftest import PROMPTS, run_cli
from helpers.drafts import ggspec_drafts, spec_equals_plain, three_at_once_equal_plain, unforced_drafts_equal_llama_cpps
from helpers.fixtures.mtp_head import ensure_fitted
from helpers.pairs import MTP_CTX as CTX
from helpers.pairs import MTP_N as N
from helpers.pairs import MTP_PROMPT as PROMPT
from helpers.serving import serve_equals_plain
from helpers.stats import p_value, plain_and_spec_draws

from ggspec.bench.forced import ForcedAcceptance, cycle_lengths
from ggspec.catalogue.tiny import ensure_tiny_pair
from ggspec.errors import InputError
from ggspec.speculative.engine import Engine, Serving
from ggspec.speculative.lossless import run_prompts
from ggspec.speculative.models import Models, PairConfig
from ggspec.speculative.planes import PlaneOptions
from ggspec.speculative.request import Request
from ggspec.speculative.sampling import SamplerSettings
from ggspec.speculative.stats import merge
from ggspec.speculative.types.draft_vocab import draft_vocab_ids, frequency_order
from ggspec.speculative.types.mtp import MTPOptions


@pytest.fixture(scope="module")
def mtp_target(fixture_dir) -> Path:
    return ensure_tiny_pair(fixture_dir, "hybrid-mtp").target


@pytest.fixture(scope="module")
def fitted_target(fixture_dir, mtp_target, build_info) -> Path:
    """The same target with its MTP head fitted to its own greedy text (helpers.fixtures.mtp_head):
    drafts are accepted often enough for natural acceptance and sampling to be tested."""
    return ensure_fitted(fixture_dir, mtp_target)


@pytest.fixture(scope="module")
def moe_target(fixture_dir, build_info) -> Path:
    """qwen35moe (routed experts + a shared expert in every block, the MTP block's too), with its
    MTP head fitted like `fitted_target`'s."""
    return ensure_fitted(fixture_dir, ensure_tiny_pair(fixture_dir, "hybrid-moe-mtp").target)


# --- detection and refusals -----------------------------------------------------------------------


def test_a_target_with_an_mtp_block_drafts_with_it(mtp_target, hybrid_pair):
    with Models(PairConfig(target=mtp_target)) as models:
        assert models.plan.spec_type == "draft-mtp" and models.plan.kind == "draft-mtp" and models.target.load_mtp
    with Models(PairConfig(target=hybrid_pair.target)) as models:  # no MTP block: plain
        assert models.plan.spec_type is None and not models.target.load_mtp
    # a DFlash draft given with -md wins; draft-mtp asked for with one leaves it unused, saying so
    with Models(PairConfig(target=mtp_target, draft=hybrid_pair.draft)) as models:
        assert models.plan.spec_type == "draft-dflash"
    with Models(PairConfig(target=mtp_target, draft=hybrid_pair.draft, spec_type="draft-mtp")) as models:
        assert models.plan.kind == "draft-mtp" and models.draft is None
        assert any("MTP head: the draft model is not used" in w for w in models.warnings)


def test_draft_mtp_is_refused_in_one_line_where_it_cannot_run(hybrid_pair, dense_pair):
    with pytest.raises(InputError, match="the target has no MTP block"):
        Models(PairConfig(target=hybrid_pair.target, spec_type="draft-mtp"))
    with pytest.raises(InputError, match="architecture 'qwen3' has no MTP head"):
        Models(PairConfig(target=dense_pair.target, spec_type="draft-mtp"))
    with pytest.raises(InputError, match="shortest draft"):
        PairConfig(target=dense_pair.target, n_min=-1).validate()


def test_cli_runs_the_head_a_target_ships_with(mtp_target, hybrid_pair):
    res = run_cli("run", "-m", str(mtp_target), "-p", PROMPT, "-n", "24", "--spec-draft-n-max", "3", "--check")
    assert res.returncode == 0, res.stderr
    assert "draft-mtp" in res.stderr and "identical" in res.stderr, res.stderr
    bad = run_cli("run", "-m", str(hybrid_pair.target), "--spec-type", "draft-mtp", "-p", PROMPT, "-n", "8")
    assert bad.returncode != 0 and "Traceback" not in bad.stderr
    assert "--spec-type: the target has no MTP block" in bad.stderr


# --- exactness against llama.cpp's draft-mtp loop ---------------------------------------------------


@pytest.mark.parametrize("head", ["random", "fitted", "moe"])
@pytest.mark.parametrize("p_min,n_min", [(0.0, 0), (0.9, 0), (0.9, 2)])
def test_unforced_drafts_and_p_min_cuts_equal_llama_cpps(p_min, n_min, head, mtp_target, fitted_target, moe_target,
                                                          tool):
    """The head's own drafts, accepted as the target decides (the fitted heads: often), llama.cpp's
    confidence cut (top-10 softmax of the argmax below p_min ends the draft) and its shortest
    draft (n_min)."""
    target = {"random": mtp_target, "fitted": fitted_target, "moe": moe_target}[head]
    cfg = PairConfig(target=target, n_max=5, ctx=CTX, p_min=p_min, n_min=n_min)
    mine, res = unforced_drafts_equal_llama_cpps(tool, cfg, PROMPT, "draft-mtp", N)
    if head != "random" and p_min == 0:
        assert res.accepted > 0  # real acceptance moved the positions (the dense fitted head: often)
        assert head == "moe" or len(mine) < N - 4


# --- losslessness ---------------------------------------------------------------------------------


@pytest.mark.parametrize("planes", [None, 3])
@pytest.mark.parametrize("n_max", [2, 7])
def test_greedy_output_is_plain_greedy_output(planes, n_max, mtp_target, fitted_target, moe_target):
    fitted, moe = fitted_target, moe_target
    cfg = PairConfig(target=mtp_target, n_max=n_max, ctx=CTX, planes=PlaneOptions(planes, "default"))
    with Engine.open(cfg) as eng:
        offsets = itertools.count()

        def make(prompt, plain):
            lengths = itertools.islice(cycle_lengths(n_max), next(offsets), None)
            return ForcedAcceptance(eng.proposer, np.concatenate([prompt, plain]), lengths, eng.target_model.n_vocab)

        runs = list(run_prompts(eng, PROMPTS[:4], 64, make)) + list(run_prompts(eng, PROMPTS[4:6], 64))
    with Engine.open(replace(cfg, target=fitted)) as eng:  # the fitted head: natural acceptance
        runs += list(run_prompts(eng, PROMPTS[6:10], 64))
    with Engine.open(replace(cfg, target=moe)) as eng:  # qwen35moe, fitted head
        runs += list(run_prompts(eng, PROMPTS[10:13], 64))
    failures = [f"prompt {i}: {r.divergence.describe()}" for i, r in enumerate(runs) if r.divergence]
    assert not failures, "\n".join(failures)
    stats = merge(r.spec_stats for r in runs)
    assert stats.drafted > 0 and stats.accepted > 0
    if planes and planes < n_max + 1:
        assert stats.replays > 0  # capped planes: the replay path ran, and the MTP cache followed


def test_parallel_sequences_draft_in_one_call_per_position(mtp_target):
    """Three sequences at once: each one's output is its plain greedy output, and a step makes at
    most 1 catch-up + n_max draft decodes + 1 verify + 1 replay calls, whatever the sequence count."""
    n_max = 4
    cfg = PairConfig(target=mtp_target, n_max=n_max, ctx=CTX, parallel=3, planes=PlaneOptions(3, "default"))
    with Engine.open(cfg) as eng:
        three_at_once_equal_plain(eng, 40)
        assert eng.stats.max_calls <= 1 + n_max + 1 + 1, eng.stats


@pytest.mark.parametrize("prompt_cache", [False, True])
def test_a_request_never_sees_the_mtp_state_of_the_one_before(prompt_cache, mtp_target):
    """B after A runs exactly as B alone: same tokens, same drafts, same accepted counts."""
    def drafts_of(eng, text):
        log, _ = ggspec_drafts(eng, text, 4, forced=True)
        return log

    cfg = PairConfig(target=mtp_target, n_max=4, ctx=CTX)
    with Engine.open(cfg, serving=Serving(prompt_cache=prompt_cache)) as eng:
        alone = drafts_of(eng, PROMPTS[3])
    with Engine.open(cfg, serving=Serving(prompt_cache=prompt_cache)) as eng:
        drafts_of(eng, PROMPTS[7])
        after = drafts_of(eng, PROMPTS[3])
    assert after == alone


# --- sampling -------------------------------------------------------------------------------------


def test_sampled_mtp_drafts_keep_the_target_distribution(fitted_target):
    """At temperature 1 the head's distribution travels with its drafts: rejection sampling keeps
    the target's (chi-square over many seeds, as tests/test_sampling_engine.py)."""
    cfg = PairConfig(target=fitted_target, n_max=3, ctx=replace(CTX, n_ctx=4096), parallel=8,
                     planes=PlaneOptions(3, "default"), sampling=SamplerSettings(temp=1.0, top_k=0, top_p=1.0, min_p=0))
    with Models(cfg) as models:
        prompt = models.target.tokenize(PROMPT)
        plain, spec = plain_and_spec_draws(models, cfg, prompt, n=3)
        with Engine(models, replace(cfg, parallel=1)) as eng:  # sampled drafts do get accepted
            seq = eng.add(Request(prompt, 64, ignore_eos=True, seed=5))
            list(eng.run())
            assert seq.stats.accepted > 0
    assert len(plain) > 5
    assert p_value(plain, spec) > 0.01


# --- bench and serve --------------------------------------------------------------------------------


def test_bench_runs_draft_mtp_beside_llama_cpps_loop(mtp_target, tmp_path):
    import json

    out = tmp_path / "bench.json"
    res = run_cli("bench", "-m", str(mtp_target), "--native", "--spec-draft-n-max", "3", "-n", "16", "-r", "1",
                  "--save", str(out), timeout=300)
    assert res.returncode == 0, res.stderr
    doc = json.loads(out.read_text())
    assert doc["settings"]["spec_type"] == "draft-mtp"
    kinds = {c["kind"] for c in doc["configs"]}
    assert {"spec", "native", "native-baseline"} <= kinds  # (ggspec's baseline runs are paired in)
    spec = [r for r in doc["runs"] if r["config"].startswith("kind=spec|")]
    assert len(spec) == 12 and all(r["divergence"] is None for r in spec)  # the 12 built-in prompts
    assert all(r["stats"]["drafted"] > 0 for r in spec)


def test_serve_drafts_with_the_mtp_head_for_concurrent_clients(mtp_target):
    serve_equals_plain(mtp_target)


# --- chained drafting and a reduced draft vocabulary (patch 0011) --------------------------------------


def _chained_and_not(target: Path, n_max: int, forced: bool = True, **kw) -> list[list]:
    logs = []
    for chain in (False, True):
        with Engine.open(PairConfig(target=target, n_max=n_max, ctx=CTX, spec_options={"draft-mtp": MTPOptions(chain=chain)}, **kw)) as eng:
            logs.append(ggspec_drafts(eng, PROMPT, n_max, forced=forced)[0])
    return logs


@pytest.mark.parametrize("head", ["random", "fitted", "moe"])
@pytest.mark.parametrize("n_max", range(1, 8))
def test_chained_drafts_are_the_unchained_drafts(n_max, head, mtp_target, fitted_target, moe_target):
    """All n_max steps in one graph (argmax, next embedding and next h on the device, each step's
    K/V in its own cell) draft exactly what one decode per step drafts, at every position; on
    qwen35moe with the block's routed and shared experts in every step."""
    target = {"random": mtp_target, "fitted": fitted_target, "moe": moe_target}[head]
    unchained, chained = _chained_and_not(target, n_max)
    assert chained == unchained


@pytest.mark.parametrize("head", ["random", "moe"])
def test_chained_confidence_cuts_like_the_unchained_loop(head, mtp_target, moe_target):
    unchained, chained = _chained_and_not(mtp_target if head == "random" else moe_target, 5, forced=False,
                                          p_min=0.9, n_min=2)
    assert chained == unchained
    assert len({len(d) for _, _, d in chained}) > 2  # the cut did bite


@pytest.mark.parametrize("head", ["fitted", "moe"])
def test_chained_steps_make_three_calls_whatever_the_draft_length(head, fitted_target, moe_target):
    """Three sequences with capped planes: each output is its plain greedy output, and a step
    makes catch-up + draft + verify calls, plus a replay where a plane lacks the state (the
    verify rows are caught up before that replay instead of at the next step: at most 5 in one
    step, 4 on average); unchained it makes n_max draft calls."""
    n_max = 6
    calls = {}
    for chain in (False, True):
        cfg = PairConfig(target=fitted_target if head == "fitted" else moe_target, n_max=n_max, ctx=CTX,
                         parallel=3, planes=PlaneOptions(3, "default"), spec_options={"draft-mtp": MTPOptions(chain=chain)})
        with Engine.open(cfg) as eng:
            seqs = three_at_once_equal_plain(eng, 48)
            assert sum(s.stats.accepted for s in seqs) > 0
            calls[chain] = (eng.stats.max_calls, eng.stats.calls / eng.stats.steps)
    assert calls[True][0] <= 5 and calls[True][1] <= 4 and calls[False][0] >= n_max + 2, calls


@pytest.mark.parametrize("head", ["fitted", "moe"])
def test_a_reduced_vocabulary_changes_acceptance_never_the_output(head, fitted_target, moe_target):
    n_vocab_draft = 200  # of the fixture's 512 tokens
    cfg = PairConfig(target=fitted_target if head == "fitted" else moe_target, n_max=4, ctx=CTX,
                     spec_options={"draft-mtp": MTPOptions(chain=True, vocab=n_vocab_draft)})
    with Engine.open(cfg) as eng:
        same, log = spec_equals_plain(eng, PROMPTS[:6], 48)
        allowed = set(draft_vocab_ids(eng.target_model, n_vocab_draft).tolist())
    assert len(allowed) >= n_vocab_draft
    assert same
    assert all(set(d) <= allowed for _, _, d in log)
    assert any(d for _, _, d in log)


def test_chain_options_are_refused_in_one_line_where_they_cannot_apply(hybrid_pair, mtp_target):
    from ggspec.speculative.types.mtp import check_chain

    with pytest.raises(InputError, match="add --spec-draft-chain"):
        Models(PairConfig(target=mtp_target, spec_options={"draft-mtp": MTPOptions(vocab=100)}))
    with pytest.raises(InputError, match="apply to draft-mtp, not to draft-dflash"):
        Engine.open(PairConfig(target=hybrid_pair.target, draft=hybrid_pair.draft,
                               spec_options={"draft-mtp": MTPOptions(chain=True)}))
    with pytest.raises(InputError, match="architecture is 'glm4moe'"):
        check_chain("glm4moe", 4, 1, 512)
    with pytest.raises(InputError, match="needs 64 rows in one physical batch, more than 32"):
        check_chain("qwen35", 8, 8, 32)
    res = run_cli("run", "-m", str(mtp_target), "--spec-draft-vocab", "100", "-p", PROMPT, "-n", "8")
    assert res.returncode != 0 and "Traceback" not in res.stderr
    assert "--spec-draft-vocab: a reduced draft vocabulary is scored by chained drafts" in res.stderr


def test_cli_runs_chained_drafts_with_a_reduced_vocabulary(fitted_target):
    res = run_cli("run", "-m", str(fitted_target), "-p", PROMPT, "-n", "32", "--spec-draft-n-max", "5",
                  "--spec-draft-chain", "--spec-draft-vocab", "300", "--check")
    assert res.returncode == 0, res.stderr
    assert "draft-mtp n_max 5" in res.stderr and "check: identical to plain greedy" in res.stderr


def test_the_draft_vocabulary_is_the_most_common_tokens_of_the_reference_text(fitted_target, tmp_path, monkeypatch):
    """Counted in the standard library's source with the target's tokenizer, cached per file, the
    end-of-generation tokens always in; deterministic."""
    from ggspec.runtime import Model

    monkeypatch.setenv("GGSPEC_HOME", str(tmp_path))
    with Model(fitted_target) as model:
        order = frequency_order(model)
        assert sorted(order.tolist()) == list(range(model.n_vocab))
        assert list((tmp_path / "vocab").glob("*.npy"))  # cached
        assert np.array_equal(frequency_order(model), order)
        text = "".join(f.read_text(encoding="utf-8", errors="replace") for f in __import__(
            "ggspec.speculative.types.draft_vocab", fromlist=["corpus_files"]).corpus_files()[:3])
        counts = np.bincount(model.tokenize(text, add_special=False), minlength=model.n_vocab)
        assert counts[order[0]] > 0 and counts[order[0]] >= np.median(counts)
        ids = draft_vocab_ids(model, 50)
        assert np.array_equal(ids[:50], order[:50])
        assert all(model.is_eog(t) for t in ids[50:]) and any(model.is_eog(t) for t in ids)
