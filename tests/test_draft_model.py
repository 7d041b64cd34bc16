"""draft-simple: a classic draft model (llama.cpp's common_speculative_impl_draft_simple).

Detection and llama.cpp's vocabulary rules, refused in one line; the drafts equal those of
llama.cpp's own loop (`llama-speculative-simple --spec-type draft-simple`, patch 0009's dump) at
every common position, with forced acceptance of every length (the cells ggspec keeps from its
own draft calls, and the ones it drops, are exercised) and with the draft's own acceptance, the
p-min cut and n-min; greedy output equals plain greedy output alone, three at once, on a hybrid
target with capped planes and replays, through the prompt cache, the CLI and the server. The
shipped draft is `models/tiny/tiny-coder-draft.gguf` (scripts/train_tiny_draft.py).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from conftest import PROMPTS, run_cli
from test_hostile_models import rewrite_gguf
from test_mtp import Recorder, _compare, _serve_equals_plain
from test_ngram_map import drafts_of
from ggspec.bench.native import TOOL, find_tool, run_cpp
from ggspec.errors import InputError
from ggspec.runtime import ContextParams
from ggspec.speculative.engine import Engine
from ggspec.speculative.loop import generate_greedy, generate_spec
from ggspec.speculative.models import Models, PairConfig
from ggspec.speculative.planes import PlaneOptions
from ggspec.testing.forced import ForcedAcceptance, cycle_lengths

TINY = Path(__file__).resolve().parents[1] / "models" / "tiny"
TARGET, DRAFT, DFLASH = TINY / "tiny-coder.gguf", TINY / "tiny-coder-draft.gguf", TINY / "tiny-coder-dflash-b8.gguf"
CTX = ContextParams(n_ctx=2048, n_threads=1, flash_attn="off")  # llama.cpp's settings of the tool runs
PROMPT = "def fibonacci(n):"
N = 100


@pytest.fixture(scope="module")
def tool(build_info):
    return find_tool(TOOL)


def _cfg(**kw) -> PairConfig:
    return PairConfig(**{"target": TARGET, "draft": DRAFT, "n_max": 5, "ctx": CTX, **kw})


def _greedy(eng: Engine, prompt, n: int) -> list[int]:
    return [t for st in generate_greedy(eng, prompt, n, ignore_eos=True) for t in st.tokens]


# --- detection and refusals -----------------------------------------------------------------------


def test_an_ordinary_draft_model_drafts_draft_simple():
    for spec_type in (None, "draft-simple"):
        with Models(_cfg(spec_type=spec_type)) as models:
            assert models.plan.spec_type == "draft-simple" and models.plan.kind == "draft-simple"
            assert models.draft is not None and models.plan.uses_draft_model
    with Models(_cfg(draft=DFLASH)) as models:  # a DFlash draft still drafts DFlash
        assert models.plan.spec_type == "draft-dflash"


def test_draft_simple_is_refused_in_one_line_where_it_cannot_run(dense_pair, hybrid_pair, tmp_path):
    cases = [
        (_cfg(draft=DFLASH, spec_type="draft-simple"), "is a DFlash model"),
        (_cfg(draft=None, spec_type="draft-simple"), "draft-simple needs a draft model"),
        # the fixtures' vocabulary is another one, of another size
        (_cfg(draft=dense_pair.target), "may differ by at most 128"),
        (PairConfig(target=dense_pair.target, draft=hybrid_pair.target, ctx=CTX), "recurrent layers"),
        (_cfg(draft=rewrite_gguf(DRAFT, tmp_path / "bos.gguf", {"tokenizer.ggml.add_bos_token": ("bool", True)})),
         "adds its BOS token differently"),
        (_cfg(draft=rewrite_gguf(DRAFT, tmp_path / "eagle3.gguf", {"general.architecture": ("str", "eagle3")})),
         "EAGLE3 head"),
    ]
    for cfg, needle in cases:
        with pytest.raises(InputError, match=needle):
            Models(cfg)


def test_a_draft_whose_token_texts_differ_is_refused(tmp_path):
    import gguf

    tokens = [bytes(p).decode() for p in (lambda f: [f.parts[i] for i in f.data])(
        gguf.GGUFReader(str(DRAFT)).fields["tokenizer.ggml.tokens"])]
    tokens[300], tokens[301] = tokens[301], tokens[300]
    bad = rewrite_gguf(DRAFT, tmp_path / "swapped.gguf", {"tokenizer.ggml.tokens": ("arr", "str", tokens)})
    with pytest.raises(InputError, match="token 300 is"):
        Models(_cfg(draft=bad))


def test_cli_runs_a_draft_model_and_says_what_is_wrong():
    res = run_cli("run", "-m", str(TARGET), "-md", str(DRAFT), "-p", PROMPT, "-n", "40", "--spec-draft-n-max", "3",
                  "--check")
    assert res.returncode == 0, res.stderr
    assert "draft-simple" in res.stderr and "identical" in res.stderr, res.stderr
    bad = run_cli("run", "-m", str(TARGET), "-md", str(DFLASH), "--spec-type", "draft-simple", "-p", PROMPT, "-n", "8")
    assert bad.returncode != 0 and "Traceback" not in bad.stderr and "DFlash model" in bad.stderr


# --- exactness against llama.cpp's draft-simple loop -------------------------------------------------


def _drafts(cfg: PairConfig, forced: bool, text: str = PROMPT) -> tuple[list, list[int]]:
    with Engine.open(cfg) as eng:
        prompt = eng.target_model.tokenize(text)
        plain = _greedy(eng, prompt, N + cfg.n_max + 2)
        ref = np.concatenate([prompt, plain]).astype(np.int32)
        rec = Recorder(eng.proposer)
        proposer = ForcedAcceptance(rec, ref, cycle_lengths(cfg.n_max), eng.target_model.n_vocab) if forced else rec
        spec = [t for st in generate_spec(eng, prompt, N, ignore_eos=True, proposer=proposer) for t in st.tokens]
    assert spec == plain[:N]
    return rec.log, ref.tolist()


@pytest.mark.parametrize("n_max", range(1, 8))
def test_forced_drafts_equal_llama_cpps_at_every_position(n_max, tool, tmp_path):
    """Forced acceptance cycling 0..n_max on both sides: every accepted count, so the cells kept
    from ggspec's own draft calls hold other tokens than the committed ones half of the time."""
    mine, ref = _drafts(_cfg(n_max=n_max), forced=True)
    forced = tmp_path / "forced.txt"
    forced.write_text(" ".join(map(str, ref)) + "\n" + " ".join(map(str, range(n_max + 1))) + "\n")
    res = run_cpp(tool, TARGET, DRAFT, PROMPT, N, n_max, defer=False, spec_type="draft-simple", forced=forced,
                  dump_drafts=True)
    assert _compare(mine, res.drafts, res.draft_anchors) >= len(mine) - 2  # all but the budget's last steps
    assert all(len(d) == n_max for _, _, d in mine)  # p-min 0: full drafts


@pytest.mark.parametrize("p_min,n_min", [(0.0, 0), (0.3, 0), (0.3, 2)])
def test_the_drafts_own_acceptance_and_p_min_cuts_equal_llama_cpps(p_min, n_min, tool):
    text = PROMPT if p_min == 0 else PROMPTS[2]  # (the class body: the draft is unsure of many tokens)
    mine, _ = _drafts(_cfg(n_max=6, p_min=p_min, n_min=n_min), forced=False, text=text)
    res = run_cpp(tool, TARGET, DRAFT, text, N, 6, defer=False, spec_type="draft-simple", p_min=p_min or None,
                  n_min=n_min or None, dump_drafts=True)
    assert _compare(mine, res.drafts, res.draft_anchors) >= len(mine) - 2
    assert res.accepted > 0
    lengths = {len(d) for _, _, d in mine}
    if p_min == 0:
        assert lengths == {6} and len(mine) < N // 3  # the trained draft is accepted often
    else:  # cut drafts of several lengths; with n_min 2, none of length 1
        assert len(lengths) > 2 and (1 not in lengths) == (n_min == 2), lengths


# --- losslessness ---------------------------------------------------------------------------------


@pytest.mark.parametrize("n_max", [1, 3, 7])
def test_greedy_output_is_plain_greedy_output(n_max):
    with Engine.open(_cfg(n_max=n_max)) as eng:
        for text in PROMPTS[:4]:
            prompt = eng.target_model.tokenize(text)
            plain = _greedy(eng, prompt, 64)
            steps = list(generate_spec(eng, prompt, 64, ignore_eos=True))
            assert [t for st in steps for t in st.tokens] == plain, text
            assert sum(st.accepted for st in steps) > 0


def test_three_sequences_at_once_are_each_plain_greedy():
    with Engine.open(_cfg(parallel=3)) as eng:
        prompts = [eng.target_model.tokenize(t) for t in PROMPTS[:3]]
        plain = [_greedy(eng, p, 80) for p in prompts]
        eng.reset()
        seqs = [eng.add(p, 80 - 10 * i, ignore_eos=True) for i, p in enumerate(prompts)]  # leave at other times
        list(eng.run())
    assert [s.tokens for s in seqs] == [p[:80 - 10 * i] for i, p in enumerate(plain)]
    assert sum(s.stats.accepted for s in seqs) > 0


def test_a_hybrid_target_with_capped_planes_and_replays(hybrid_pair, dense_pair):
    """A recurrent target, 3 planes for 6-token drafts: forced acceptance of every length rolls
    back through a plane or replays, and the draft (the dense fixture: same vocabulary) follows."""
    cfg = PairConfig(target=hybrid_pair.target, draft=dense_pair.target, n_max=6, ctx=CTX,
                     planes=PlaneOptions(3, "default"))
    with Engine.open(cfg) as eng:
        assert eng.plan.kind == "draft-simple"
        prompt = eng.target_model.tokenize(PROMPT)
        plain = _greedy(eng, prompt, 60 + 8)
        ref = np.concatenate([prompt, plain])
        proposer = ForcedAcceptance(eng.proposer, ref, cycle_lengths(6), eng.target_model.n_vocab)
        steps = list(generate_spec(eng, prompt, 60, ignore_eos=True, proposer=proposer))
    assert [t for st in steps for t in st.tokens] == plain[:60]
    assert any(st.replayed for st in steps)


def test_a_request_in_a_reused_slot_drafts_as_it_would_alone():
    with Engine.open(_cfg()) as eng:
        alone = drafts_of(eng, PROMPTS[0])
        drafts_of(eng, PROMPTS[1])
        after = drafts_of(eng, PROMPTS[0])
    assert after == alone and any(d for _, _, d in alone)


def test_the_prompt_cache_keeps_the_drafts_cells_with_the_targets():
    """A repeated and an extended prompt reuse the slot's cells in both contexts: only the rest is
    decoded, and the drafts and the text are a fresh engine's."""
    with Engine.open(_cfg(parallel=2), prompt_cache=True) as eng, Engine.open(_cfg(parallel=2)) as fresh:
        tok = eng.target_model.tokenize
        a = tok(PROMPT)
        first = eng.add(a, 32, ignore_eos=True)
        list(eng.run())
        longer = np.concatenate([a, np.asarray(first.tokens[:10], dtype=np.int32), tok("\n\ndef g(x):", add_special=False)])
        rec, rec_fresh = Recorder(eng.proposer), Recorder(fresh.proposer)
        eng.proposer, fresh.proposer = rec, rec_fresh
        turn, alone = eng.add(longer, 32, ignore_eos=True), fresh.add(longer, 32, ignore_eos=True)
        list(eng.run())
        list(fresh.run())
    assert turn.n_cached == len(a) + 10 and alone.n_cached == 0
    assert turn.tokens == alone.tokens and rec.log == rec_fresh.log and rec.log


def test_serve_drafts_with_the_draft_model_for_concurrent_clients():
    _serve_equals_plain(TARGET, "-md", str(DRAFT))
