"""Costs known before the first step (ggspec/speculative/rules/calibration.py), on the real build.

An engine with the adaptive draft length (the default: no draft length given) measures what its
steps cost before the first prompt, by running a short schedule of draft lengths through itself,
and caches the tables per machine, build, files and settings; the next engine with the same key
reads them and measures nothing. The calibration leaves nothing behind (no sequence, no
statistics, no cells, nothing its drafts taught), and greedy output still equals plain greedy.
Where the tables say that no draft length can pay even if every drafted token were right, the
engine decodes plainly and never calls the draft model.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from helpers.pairs import DFLASH, DRAFT, STACK, TARGET

from ggspec.runtime import ContextParams
from ggspec.speculative.driver import decode_one, decode_plain
from ggspec.speculative.engine import Engine
from ggspec.speculative.models import PairConfig
from ggspec.speculative.request import Request
from ggspec.speculative.rules import calibration
from ggspec.speculative.types.draft_vocab import DraftVocabOptions

CTX = ContextParams(n_ctx=1024, n_threads=1, flash_attn="off")
N = 48


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    """Each test starts from an empty calibration cache of its own."""
    folder = tmp_path / "calibration"
    monkeypatch.setattr(calibration, "cache_dir", lambda: folder)
    return folder


def _plain(prompt: str, n: int = N) -> list[int]:
    with Engine.open(PairConfig(TARGET, ctx=CTX), plain=True) as e:
        return decode_plain(e, e.target_model.tokenize(prompt), n).tokens


def _measured(cfg: PairConfig, cache_dir) -> tuple:
    """The cached tables' file and its contents after an engine for `cfg` measured them."""
    with Engine.open(cfg):
        pass
    (path,) = cache_dir.glob("*.json")
    return path, json.loads(path.read_text())


def test_default_is_the_adaptive_length_and_a_given_length_is_fixed():
    assert PairConfig(TARGET, DRAFT).auto
    assert not PairConfig(TARGET, DRAFT, n_max=3).auto
    assert PairConfig(TARGET, DRAFT, n_max=3, adaptive=True).auto  # auto:3
    with Engine.open(PairConfig(TARGET, DRAFT, n_max=3, ctx=CTX)) as e:
        assert e.draft_length is None and e.calibration is None


def test_an_engine_measures_its_costs_once_then_reads_them(cache_dir):
    cfg = PairConfig(TARGET, DFLASH, ctx=CTX)
    with Engine.open(cfg) as e:
        cal = e.calibration
        assert cal.measured and cal.seconds is not None
        # it leaves nothing behind: no sequence, no step counted, every slot free, no learned prior
        assert not e.active and e.stats.steps == 0 and e.stats.tokens == 0
        assert len(e.slots.free) == e.parallel
        assert not e.draft_length.tracks and e.draft_length._learned is None
        tables = e.draft_length.tables()
        rows = {int(r) for r in tables["spec"]}
        assert rows and max(rows) == e.n_max + 1  # the full length's verify was measured
        assert tables["plain"] and tables["draft"]
        files = list(cache_dir.glob("*.json"))
        assert len(files) == 1
        doc = json.loads(files[0].read_text())
        assert doc["key"]["n_max"] == e.n_max and doc["key"]["type"] == "draft-dflash"
        out = decode_one(e, e.target_model.tokenize(STACK), N).tokens
    assert out == _plain(STACK)
    with Engine.open(cfg) as e:  # the same key: read, not measured
        assert not e.calibration.measured and e.calibration.seconds is None
        assert e.draft_length.steps >= 16  # no warm-up steps of its own
        seeded = e.draft_length.tables()
        assert seeded["plain"] == tables["plain"] and seeded["draft"] == tables["draft"]


def test_the_key_follows_the_settings_that_change_costs(cache_dir):
    with Engine.open(PairConfig(TARGET, DRAFT, ctx=CTX)):
        pass
    with Engine.open(PairConfig(TARGET, DRAFT, ctx=CTX, parallel=2)) as e:
        assert e.calibration.measured  # two sequences verify twice the rows: measured again
        rows = {int(r) for r in e.draft_length.tables()["spec"]}
        assert max(rows) == 2 * (e.n_max + 1)
    with Engine.open(PairConfig(TARGET, DRAFT, ctx=CTX, adaptive=True, n_max=3)) as e:
        assert e.calibration.measured  # another cap
    assert len(list(cache_dir.glob("*.json"))) == 3


def test_a_cache_of_another_key_or_unreadable_is_measured_again(cache_dir):
    cfg = PairConfig(TARGET, DRAFT, ctx=CTX)
    with Engine.open(cfg):
        pass
    (path,) = cache_dir.glob("*.json")
    path.write_text("{not json")
    with Engine.open(cfg) as e:
        assert e.calibration.measured
    doc = json.loads(path.read_text())
    doc["key"]["version"] = -1
    path.write_text(json.dumps(doc))
    with Engine.open(cfg) as e:
        assert e.calibration.measured
    doc = json.loads(path.read_text())
    del doc["tables"]["spec"]  # the right key, damaged tables
    path.write_text(json.dumps(doc))
    with Engine.open(cfg) as e:
        assert e.calibration.measured


@pytest.mark.parametrize("flash_attn", ["off", "auto"])
def test_where_no_length_can_pay_the_draft_model_is_never_called(cache_dir, flash_attn):
    """Tables whose draft calls cost a second each (a draft model far dearer than its target):
    every sequence decodes plainly, the draft context makes no call, the user is told why. The
    engine then runs on a plain engine's contexts (no draft context), whatever the attention
    setting; the draft's own options (a reduced vocabulary here) are no error for that plain engine."""
    cfg = PairConfig(TARGET, DRAFT, ctx=replace(CTX, flash_attn=flash_attn),
                     spec_options={"draft-simple": DraftVocabOptions(vocab=300)})
    path, doc = _measured(cfg, cache_dir)
    doc["tables"]["draft"] = {n: {k: [1.0] * 4 for k in lengths} for n, lengths in doc["tables"]["draft"].items()}
    path.write_text(json.dumps(doc))
    with Engine.open(cfg) as e:
        assert not e.calibration.measured and e.plain_by_cost
        assert any("decoding plainly" in n for n in e.notes)
        assert e.draft_ctx is None and e.proposer is None and e.target.flash_attn == flash_attn
        seqs = [decode_one(e, e.target_model.tokenize(STACK), N) for _ in range(2)]
        assert all(s.stats.drafted == 0 and s.plain_by_cost and len(s.stats.k_hist) == 1 for s in seqs)
        out = [s.tokens for s in seqs]
    assert out == [_plain(STACK)] * 2


def test_costs_that_make_drafts_pay_are_used_from_the_first_step(cache_dir):
    """Tables whose verify rows cost next to nothing beyond the first (a GPU's shape): the first
    step already verifies drafts, with no warm-up at the full length."""
    cfg = PairConfig(TARGET, DRAFT, ctx=CTX, adaptive=True, n_max=4)
    path, doc = _measured(cfg, cache_dir)
    t = doc["tables"]
    one = min(v for samples in t["plain"].values() for v in samples)
    t["spec"] = {str(r): [one] * 4 for r in range(1, 6)}
    t["draft"] = {n: {str(k): [0.01 * one * k] * 4 for k in range(1, 5)} for n in t["draft"]}
    t["rest_spec"] = t["rest_plain"]
    path.write_text(json.dumps(doc))
    with Engine.open(cfg) as e:
        seq = e.add(Request(e.target_model.tokenize(STACK), N))
        ks = [step.k for _, step in e.run() if step.kind != "prefill"]
        assert ks[0] and ks[0] > 0  # drafts verified at the first step
        assert seq.tokens == _plain(STACK)


def test_drafts_must_beat_a_plain_engines_step(cache_dir):
    """The calibration measures what a plain engine's step costs (a bare target context made as a
    plain engine makes it, every slot decoding), and an engine decides plain by cost against that,
    not against its own steps that verify nothing (dearer: flash attention kept off for verify
    batches, the draft's bookkeeping). Forged tables where a draft step costs 5 plain-engine steps
    and 1/2 of the engine's own k = 0 steps: plain by cost, and not without the plain engine's step."""
    cfg = PairConfig(TARGET, DRAFT, ctx=CTX, adaptive=True, n_max=4)
    path, doc = _measured(cfg, cache_dir)
    t = doc["tables"]
    n_seqs, one = t["plain_engine"]
    assert n_seqs == cfg.parallel and 0 < one < 1
    t["plain"] = {"1": [10 * one] * 4}
    t["true_plain"] = None
    t["spec"] = {str(r): [5 * one] * 4 for r in range(1, 6)}
    t["draft"] = {n: {str(k): [1e-9] * 4 for k in range(1, 5)} for n in t["draft"]}
    for plain_engine, hopeless in (([1, one], True), (None, False)):
        t["plain_engine"] = plain_engine
        path.write_text(json.dumps(doc))
        with Engine.open(cfg) as e:
            assert not e.calibration.measured and e.plain_by_cost == hopeless


def test_a_context_too_small_for_the_schedule_measures_as_it_runs(cache_dir):
    cfg = PairConfig(TARGET, DRAFT, ctx=replace(CTX, n_ctx=256), adaptive=True, n_max=31)
    with Engine.open(cfg) as e:
        assert e.capacity == 256  # the schedule needs about 240 tokens past the prompt
        assert not e.calibration.measured and not list(cache_dir.glob("*.json"))
        prompt = e.target_model.tokenize("def f(x):")
        out = decode_one(e, prompt, 24).tokens
    assert out == _plain("def f(x):", 24)


def test_every_slot_decodes_lossless_after_a_calibration_at_parallel_3(cache_dir):
    prompts = ["def fibonacci(n):", "class Stack:\n    def __init__(self):", "The quick brown fox"]
    with Engine.open(PairConfig(TARGET, DFLASH, ctx=CTX, parallel=3)) as e:
        seqs = [e.add(Request(e.target_model.tokenize(p), N)) for p in prompts]
        for _ in e.run():
            pass
        outs = [s.tokens for s in seqs]
    assert outs == [_plain(p) for p in prompts]


def test_schedule_measures_both_ends_and_between():
    assert calibration.schedule(7) == [7, 0, 1, 4]
    assert calibration.schedule(2) == [2, 0, 1]
    assert calibration.schedule(1) == [1, 0]


def test_a_server_plain_by_cost_keeps_its_text_drafters_for_the_requests_that_name_them(cache_dir):
    """A server engine (standby types) whose own drafts cannot pay still holds every text drafter:
    a request that names one drafts with it at that type's own length (llama-server's way) and
    gets the plain text; the others decode plainly, the draft model never called, the prompt
    cache kept. Before, such a server refused `speculative.type: ngram-simple` with a 400."""
    from ggspec.speculative.engine import Serving
    from ggspec.speculative.request import DraftLimits

    cfg = PairConfig(TARGET, DRAFT, ctx=CTX, parallel=2)
    path, doc = _measured(cfg, cache_dir)
    doc["tables"]["draft"] = {n: {k: [1.0] * 4 for k in lengths} for n, lengths in doc["tables"]["draft"].items()}
    path.write_text(json.dumps(doc))
    with Engine.open(cfg, serving=Serving(standby_types=True, prompt_cache=True)) as e:
        assert e.plain_by_cost and e.draft_ctx is None and e.draft_length is None
        assert {"ngram-simple", "ngram-map-k", "suffix"} <= set(e.request_types)
        prompt = e.target_model.tokenize(STACK * 3)
        named = e.add(Request(prompt, N, limits=DraftLimits(e.n_max, types=("ngram-simple",))))
        plain = e.add(Request(prompt, N))
        while e.active:
            e.step()
        assert named.speculate and named.stats.drafted > 0 and not plain.speculate and plain.stats.drafted == 0
        assert named.tokens == plain.tokens == _plain(STACK * 3)
        assert e.slots.cached  # (the finished sequences' cells kept for a later prompt)


def test_a_server_plain_by_cost_without_room_for_its_text_drafters_decodes_plainly(cache_dir):
    """Where the batch cannot hold the text drafters' longest verify block (theirs are longer than
    the pair's own), the server engine decodes plainly as before instead of failing to start."""
    from ggspec.speculative.engine import Serving

    cfg = PairConfig(TARGET, DRAFT, ctx=replace(CTX, n_batch=40), parallel=2)
    path, doc = _measured(cfg, cache_dir)
    doc["tables"]["draft"] = {n: {k: [1.0] * 4 for k in lengths} for n, lengths in doc["tables"]["draft"].items()}
    path.write_text(json.dumps(doc))
    with Engine.open(cfg, serving=Serving(standby_types=True)) as e:
        assert e.plain_by_cost and e.proposer is None and e.request_types == e.plan.kinds
        seq = e.add(Request(e.target_model.tokenize(STACK), N))
        while e.active:
            e.step()
        assert seq.tokens == _plain(STACK)
