"""Logit bias and repetition penalties under speculation (sampling.adjust), on the real build:
`adjust` equals llama.cpp's own logit-bias and penalties samplers, and greedy speculative output
with them equals plain greedy output with them, every row judged over the history up to it."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
from helpers.pairs import CPP_CTX, DRAFT, STACK, TARGET

from ggspec.speculative.driver import drive
from ggspec.speculative.engine import Engine
from ggspec.speculative.models import PairConfig
from ggspec.speculative.request import Request
from ggspec.speculative.sampling import SamplerSettings, adjust

N = 48
SETTINGS = [
    SamplerSettings(temp=0.0, penalty_repeat=1.3),
    SamplerSettings(temp=0.0, penalty_last_n=16, penalty_freq=0.4, penalty_present=0.6),
    SamplerSettings(temp=0.0, penalty_last_n=-1, penalty_repeat=1.1, logit_bias=((13, 2.5), (25, -np.inf))),
]


def _llama_cpp(lc, n_vocab: int, row: np.ndarray, s: SamplerSettings, history: list[int]) -> np.ndarray:
    """The row through llama.cpp's llama_sampler_init_logit_bias + llama_sampler_init_penalties."""
    chain = lc.llama_sampler_chain_init(lc.llama_sampler_chain_default_params())
    if s.logit_bias:
        biases = (lc.llama_logit_bias * len(s.logit_bias))(*[lc.llama_logit_bias(t, b) for t, b in s.logit_bias])
        lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_logit_bias(n_vocab, len(s.logit_bias), biases))
    last_n = len(history) if s.penalty_last_n < 0 else s.penalty_last_n
    lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_penalties(n_vocab, last_n, s.penalty_repeat, s.penalty_freq,
                                                                      s.penalty_present))
    for t in history:
        lc.llama_sampler_accept(chain, t)
    cells = (lc.llama_token_data * n_vocab)(*[lc.llama_token_data(i, float(v), 0.0) for i, v in enumerate(row)])
    arr = lc.llama_token_data_array(ctypes.cast(cells, lc.llama_token_data_p), n_vocab, -1, False)
    lc.llama_sampler_apply(chain, ctypes.byref(arr))
    lc.llama_sampler_free(chain)
    return np.array([cells[i].logit for i in range(n_vocab)], dtype=np.float32)


@pytest.mark.parametrize("k", range(len(SETTINGS)))
def test_adjust_is_llama_cpps_samplers(lc, k):
    rng = np.random.default_rng(k)
    n_vocab = 512
    row = rng.normal(0, 3, n_vocab).astype(np.float32)
    history = rng.integers(0, 40, 100).tolist()  # repeats: counts above one
    s = SETTINGS[k]
    np.testing.assert_array_equal(adjust(row, s, history), _llama_cpp(lc, n_vocab, row, s, history))


def test_speculation_with_penalties_and_bias_equals_plain():
    """Three sequences batched, each with its own penalties / bias, draft-simple at n_max 6: each
    text is its plain greedy text under the same settings (and differs from unpenalized text)."""
    def decode(engine: Engine) -> list[list[int]]:
        prompt = engine.target_model.tokenize(STACK)
        out: dict[int, list[int]] = {i: [] for i in range(len(SETTINGS))}
        reqs = [Request(prompt, N, tag=i, sampling=s, ignore_eos=True) for i, s in enumerate(SETTINGS)]
        for ev in drive(engine, reqs):
            out[ev.tag] += ev.tokens
        return [out[i] for i in range(len(SETTINGS))]

    with Engine.open(PairConfig(TARGET, ctx=CPP_CTX, parallel=3), plain=True) as e:
        want = decode(e)
        free = [t for ev in drive(e, [Request(e.target_model.tokenize(STACK), N, ignore_eos=True)]) for t in ev.tokens]
    with Engine.open(PairConfig(TARGET, DRAFT, n_max=6, parallel=3, ctx=CPP_CTX)) as e:
        got = decode(e)
        assert e.stats.tokens > 0
    assert got == want
    assert all(w != free for w in want)  # (the settings do change the text)
