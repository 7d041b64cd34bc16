"""draft-eagle3: an EAGLE3 head (llama.cpp's common_speculative_impl_draft_eagle3).

The shipped head for tiny-coder (`models/tiny/tiny-coder-eagle3.gguf`, scripts/train_tiny_eagle3.py:
the inputs of target layers 1, 2 and 3, its own 512-row head with d2t) is detected and checked
against the target, refused in one line where it cannot run (a head reading the final state of a
qwen3 target, whose graph does not export it); its drafts equal those of
llama.cpp's own loop (`--spec-type draft-eagle3`, patch 0009's dump) at every common position with
its own acceptance, p-min and n-min (with forced acceptance of every length, and three sequences at
once: tests/test_exactness.py); greedy output equals plain greedy output for a long prompt;
sampled drafts keep the target's distribution (test_sampling_engine); the CLI and the server run it.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from conftest import PROMPTS, run_cli
from helpers.drafts import Recorder, compare, greedy, unforced_drafts_equal_llama_cpps
from helpers.gguf_edit import rewrite_gguf
from helpers.pairs import CPP_CTX as CTX
from helpers.pairs import DRAFT, EAGLE3, TARGET
from helpers.serving import serve_equals_plain

from ggspec.bench.forced import ForcedAcceptance, cycle_lengths
from ggspec.bench.native import run_cpp
from ggspec.errors import InputError
from ggspec.runtime import ContextParams
from ggspec.speculative.driver import generate_spec
from ggspec.speculative.engine import Engine, Serving
from ggspec.speculative.models import Models, PairConfig
from ggspec.speculative.request import Request

PROMPT = "def fibonacci(n):"
N = 100


def _cfg(**kw) -> PairConfig:
    return PairConfig(**{"target": TARGET, "draft": EAGLE3, "n_max": 4, "ctx": CTX, **kw})


def test_the_head_is_detected_and_described():
    for spec_type in (None, "draft-eagle3"):
        with Models(_cfg(spec_type=spec_type)) as models:
            plan = models.plan
            assert plan.kind == "draft-eagle3" and plan.uses_draft_model
            assert plan.meta.target_layers == (1, 2, 3) and plan.meta.n_vocab_draft == 512


def test_heads_that_cannot_run_are_refused_in_one_line(tmp_path, dense_pair):
    def edited(name, changes):
        return rewrite_gguf(EAGLE3, tmp_path / f"{name}.gguf", changes)

    cases = [
        (_cfg(draft=edited("two", {"eagle3.target_layers": ("arr", "i32", [1, 2])})), "exactly 3"),
        (_cfg(draft=edited("deep", {"eagle3.target_layers": ("arr", "i32", [1, 2, 9])})), "layer(s) [9]"),
        (_cfg(draft=edited("wide", {"eagle3.target_hidden_size": ("u32", 256)})), "256 wide"),
        (_cfg(draft=edited("final", {"eagle3.target_layers": ("arr", "i32", [1, 2, 4])})), "does not export"),
        (_cfg(draft=DRAFT, spec_type="draft-eagle3"), "needs an EAGLE3 head"),
        (_cfg(spec_type="draft-simple"), "drafts draft-eagle3, not draft-simple"),
        (PairConfig(target=dense_pair.target, draft=EAGLE3, ctx=CTX), "tokens, the target"),
    ]
    for cfg, needle in cases:
        with pytest.raises(InputError, match=re.escape(needle)):
            Models(cfg)


@pytest.mark.parametrize("text, p_min, n_min", [(PROMPT, 0.0, 0), (PROMPTS[2], 0.5, 0), (PROMPTS[2], 0.5, 2)])
def test_the_heads_own_acceptance_and_p_min_cuts_equal_llama_cpps(text, p_min, n_min, tool):
    cfg = _cfg(n_max=6, p_min=p_min, n_min=n_min)
    mine, res = unforced_drafts_equal_llama_cpps(tool, cfg, text, "draft-eagle3", N, cut_lengths=3)
    assert res.accepted > 0 and (p_min > 0 or len(mine) < N // 2)  # the trained head is accepted often


def test_a_long_prompt_is_encoded_in_several_calls():
    """A prompt longer than the head's batches: the encoder and the first decoder call split it."""
    text = "\n".join(PROMPTS) * 3
    cfg = _cfg(ctx=ContextParams(n_ctx=2048, n_threads=1, flash_attn="off", n_batch=128, n_ubatch=64))
    with Engine.open(cfg) as eng:
        prompt = eng.target_model.tokenize(text)
        assert len(prompt) > 300
        plain = greedy(eng, prompt, 40)
        steps = list(generate_spec(eng, prompt, 40, ignore_eos=True))
    assert [t for st in steps for t in st.tokens] == plain and sum(st.accepted for st in steps) > 0


def test_the_prompt_cache_keeps_the_heads_pairs_before_the_shared_prefixs_end():
    """A repeated prompt and a next turn: the target decodes again from one before the end of
    the shared prefix (the head's pair there needs its features), the head keeps its pairs before
    it, and text, drafts and acceptance equal a fresh engine's."""
    with Engine.open(_cfg(parallel=2), serving=Serving(prompt_cache=True)) as eng, \
            Engine.open(_cfg(parallel=2)) as fresh:
        assert not any("EAGLE3" in w for w in eng.warnings)
        a = eng.target_model.tokenize(PROMPT)
        runs = []
        for prompt in (a, a, None):
            if prompt is None:  # the next turn: the first prompt, part of its answer, new text
                prompt = np.concatenate([a, np.asarray(runs[0].tokens[:12], dtype=np.int32),
                                         eng.target_model.tokenize("\n\ndef g(x):", add_special=False)])
            seq = eng.add(Request(prompt, 24, ignore_eos=True))
            list(eng.run())
            ref = fresh.add(Request(prompt, 24, ignore_eos=True))
            list(fresh.run())
            assert seq.tokens == ref.tokens
            assert (seq.stats.drafted, seq.stats.accepted) == (ref.stats.drafted, ref.stats.accepted)
            runs.append(seq)
    assert runs[0].n_cached == 0 and runs[1].n_cached == len(a) - 2 and runs[2].n_cached == len(a) + 12 - 1
    assert runs[1].stats.accepted > 0


def test_cli_and_server_run_it():
    res = run_cli("run", "-m", str(TARGET), "-md", str(EAGLE3), "-p", PROMPT, "-n", "40", "--spec-draft-n-max", "3",
                  "--check")
    assert res.returncode == 0, res.stderr
    assert "draft-eagle3" in res.stderr and "identical" in res.stderr, res.stderr
    serve_equals_plain(TARGET, "-md", str(EAGLE3))


# --- a hybrid target, a head reading its final state ------------------------------------------------


@pytest.fixture(scope="module")
def hybrid_head(tmp_path_factory):
    from helpers.fixtures.eagle3 import write_eagle3_head

    return write_eagle3_head(tmp_path_factory.mktemp("eagle3") / "head.gguf", target_kind="hybrid", layers=(1, 2, 4))


@pytest.mark.parametrize("planes", [None, 3])
def test_a_hybrid_target_and_its_final_state(planes, hybrid_pair, hybrid_head, tool, tmp_path):
    """qwen35 exports its final normed state (target layer 4 = n_layer): a random head reading it
    drafts what llama.cpp's loop drafts; with 3 capped planes the rejected drafts replay, and the
    output stays plain greedy."""
    from ggspec.speculative.planes import PlaneOptions

    cfg = PairConfig(target=hybrid_pair.target, draft=hybrid_head, n_max=4, ctx=CTX,
                     planes=PlaneOptions(planes, "default"))
    with Engine.open(cfg) as eng:
        assert eng.plan.meta.target_layers == (1, 2, 4)
        prompt = eng.target_model.tokenize(PROMPT)
        plain = greedy(eng, prompt, 60 + 6)
        ref = np.concatenate([prompt, plain]).astype(np.int32)
        rec = Recorder(eng.proposer)
        steps = list(generate_spec(eng, prompt, 60, ignore_eos=True,
                                   proposer=ForcedAcceptance(rec, ref, cycle_lengths(4), eng.target_model.n_vocab)))
    assert [t for st in steps for t in st.tokens] == plain[:60]
    assert any(st.replayed for st in steps) == (planes == 3)
    forced = tmp_path / "forced.txt"
    forced.write_text(" ".join(map(str, ref)) + "\n" + " ".join(map(str, range(5))) + "\n")
    res = run_cpp(tool, hybrid_pair.target, hybrid_head, PROMPT, 60, 4, defer=False, spec_type="draft-eagle3",
                  forced=forced, dump_drafts=True)
    assert compare(rec.log, res.drafts, res.draft_anchors) >= len(rec.log) - 2
