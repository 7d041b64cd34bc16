"""draft-simple: a classic draft model (llama.cpp's common_speculative_impl_draft_simple).

Detection and llama.cpp's vocabulary rules, refused in one line; the drafts equal those of
llama.cpp's own loop (`llama-speculative-simple --spec-type draft-simple`, patch 0009's dump) at
every common position with the draft's own acceptance, the p-min cut and n-min (with forced
acceptance of every length, n_max 1..7: tests/test_exactness.py, which also runs three at once and
B after A); greedy output equals plain greedy output alone, on a hybrid target with capped planes
and replays, through the prompt cache, the CLI and the server. The
shipped draft is `models/tiny/tiny-coder-draft.gguf` (scripts/train_tiny_draft.py).
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import PROMPTS, run_cli
from helpers.drafts import Recorder, greedy, unforced_drafts_equal_llama_cpps
from helpers.gguf_edit import rewrite_gguf
from helpers.pairs import CPP_CTX as CTX
from helpers.pairs import DFLASH, DRAFT, TARGET
from helpers.serving import serve_equals_plain

from ggspec.bench.forced import ForcedAcceptance, cycle_lengths
from ggspec.errors import InputError
from ggspec.speculative.driver import generate_spec
from ggspec.speculative.engine import Engine, Serving
from ggspec.speculative.models import Models, PairConfig
from ggspec.speculative.planes import PlaneOptions
from ggspec.speculative.request import Request

PROMPT = "def fibonacci(n):"
N = 100


def _cfg(**kw) -> PairConfig:
    return PairConfig(**{"target": TARGET, "draft": DRAFT, "n_max": 5, "ctx": CTX, **kw})


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


@pytest.mark.parametrize("p_min,n_min", [(0.0, 0), (0.3, 0), (0.3, 2)])
def test_the_drafts_own_acceptance_and_p_min_cuts_equal_llama_cpps(p_min, n_min, tool):
    text = PROMPT if p_min == 0 else PROMPTS[2]  # (the class body: the draft is unsure of many tokens)
    cfg = _cfg(n_max=6, p_min=p_min, n_min=n_min)
    mine, res = unforced_drafts_equal_llama_cpps(tool, cfg, text, "draft-simple", N, cut_lengths=3)
    assert res.accepted > 0 and (p_min > 0 or len(mine) < N // 3)  # the trained draft is accepted often


# --- losslessness ---------------------------------------------------------------------------------


@pytest.mark.parametrize("n_max", [1, 3, 7])
def test_greedy_output_is_plain_greedy_output(n_max):
    with Engine.open(_cfg(n_max=n_max)) as eng:
        for text in PROMPTS[:4]:
            prompt = eng.target_model.tokenize(text)
            plain = greedy(eng, prompt, 64)
            steps = list(generate_spec(eng, prompt, 64, ignore_eos=True))
            assert [t for st in steps for t in st.tokens] == plain, text
            assert sum(st.accepted for st in steps) > 0


def test_a_hybrid_target_with_capped_planes_and_replays(hybrid_pair, dense_pair):
    """A recurrent target, 3 planes for 6-token drafts: forced acceptance of every length rolls
    back through a plane or replays, and the draft (the dense fixture: same vocabulary) follows."""
    cfg = PairConfig(target=hybrid_pair.target, draft=dense_pair.target, n_max=6, ctx=CTX,
                     planes=PlaneOptions(3, "default"))
    with Engine.open(cfg) as eng:
        assert eng.plan.kind == "draft-simple"
        prompt = eng.target_model.tokenize(PROMPT)
        plain = greedy(eng, prompt, 60 + 8)
        ref = np.concatenate([prompt, plain])
        proposer = ForcedAcceptance(eng.proposer, ref, cycle_lengths(6), eng.target_model.n_vocab)
        steps = list(generate_spec(eng, prompt, 60, ignore_eos=True, proposer=proposer))
    assert [t for st in steps for t in st.tokens] == plain[:60]
    assert any(st.replayed for st in steps)


def test_the_prompt_cache_keeps_the_drafts_cells_with_the_targets():
    """A repeated and an extended prompt reuse the slot's cells in both contexts: only the rest is
    decoded, and the drafts and the text are a fresh engine's."""
    with Engine.open(_cfg(parallel=2), serving=Serving(prompt_cache=True)) as eng, Engine.open(_cfg(parallel=2)) as fresh:
        tok = eng.target_model.tokenize
        a = tok(PROMPT)
        first = eng.add(Request(a, 32, ignore_eos=True))
        list(eng.run())
        longer = np.concatenate([a, np.asarray(first.tokens[:10], dtype=np.int32), tok("\n\ndef g(x):", add_special=False)])
        rec, rec_fresh = Recorder(eng.proposer), Recorder(fresh.proposer)
        eng.proposer, fresh.proposer = rec, rec_fresh
        turn, alone = eng.add(Request(longer, 32, ignore_eos=True)), fresh.add(Request(longer, 32, ignore_eos=True))
        list(eng.run())
        list(fresh.run())
    assert turn.n_cached == len(a) + 10 and alone.n_cached == 0
    assert turn.tokens == alone.tokens and rec.log == rec_fresh.log and rec.log


def test_serve_drafts_with_the_draft_model_for_concurrent_clients():
    serve_equals_plain(TARGET, "-md", str(DRAFT))
