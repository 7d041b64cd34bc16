"""The sampler transforms against llama.cpp's own samplers, on random logits."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from ggspec.errors import InputError
from ggspec.speculative.sampling import SamplerSettings, distribution, sample


def _llama_cpp(lc, logits: np.ndarray, s: SamplerSettings) -> dict[int, float]:
    """Apply llama.cpp's chain (top-k, top-p, min-p, temperature) and softmax what is left."""
    chain = lc.llama_sampler_chain_init(lc.llama_sampler_chain_default_params())
    lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_top_k(s.top_k))
    lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_top_p(s.top_p, 1))
    lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_min_p(s.min_p, 1))
    lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_temp(s.temp))
    data = (lc.llama_token_data * len(logits))(*[lc.llama_token_data(i, float(v), 0.0) for i, v in enumerate(logits)])
    arr = lc.llama_token_data_array(data, len(logits), -1, False)
    lc.llama_sampler_apply(chain, ctypes.byref(arr))
    lc.llama_sampler_free(chain)
    kept = {data[i].id: data[i].logit for i in range(arr.size)}
    top = max(kept.values())
    w = {t: np.exp(v - top) for t, v in kept.items()}
    total = sum(w.values())
    return {t: v / total for t, v in w.items()}


@pytest.mark.parametrize("s", [
    SamplerSettings(),  # llama.cpp's defaults: top-k 40, top-p 0.95, min-p 0.05, temp 0.8
    SamplerSettings(temp=1.0, top_k=0, top_p=1.0, min_p=0.0),
    SamplerSettings(temp=0.7, top_k=10, top_p=1.0, min_p=0.0),
    SamplerSettings(temp=1.3, top_k=0, top_p=0.5, min_p=0.0),
    SamplerSettings(temp=0.5, top_k=0, top_p=1.0, min_p=0.2),
    SamplerSettings(temp=1.0, top_k=100, top_p=0.9, min_p=0.01),
])
def test_distribution_equals_llama_cpp_samplers(s, lc):
    rng = np.random.default_rng(0)
    for scale in (1.0, 3.0, 8.0):
        logits = (rng.standard_normal(512) * scale).astype(np.float32)
        want = _llama_cpp(lc, logits, s)
        got = distribution(logits, s)
        assert set(np.flatnonzero(got)) == set(want), (scale, sorted(set(np.flatnonzero(got)) ^ set(want))[:10])
        for t, p in want.items():
            assert got[t] == pytest.approx(p, rel=1e-4, abs=1e-7)


def test_greedy_is_a_point_mass_and_sample_inverts_the_cdf():
    logits = np.array([[0.1, 2.0, 1.9], [5.0, -1.0, 4.0]])
    p = distribution(logits, SamplerSettings(temp=0))
    assert p.tolist() == [[0, 1, 0], [1, 0, 0]]
    q = np.array([0.2, 0.0, 0.5, 0.3])
    assert [sample(q, u) for u in (0.0, 0.19, 0.2, 0.69, 0.7, 0.999)] == [0, 0, 2, 2, 3, 3]


@pytest.mark.parametrize("field, kw", [("temp", {"temp": float("nan")}), ("top_p", {"top_p": 1.5}),
                                       ("min_p", {"min_p": -0.1}), ("seed", {"seed": -1})])
def test_bad_settings_name_their_field(field, kw):
    with pytest.raises(InputError) as err:
        SamplerSettings(**kw).validate()
    assert err.value.field == field


@pytest.mark.parametrize("top_k,top_p,min_p", [(40, 0.95, 0.05), (0, 0.9, 0.0), (5, 1.0, 0.1), (64, 0.5, 0.2)])
def test_one_row_and_many_rows_agree(top_k, top_p, min_p):
    """The engine computes one row at a time (verify rows, plain steps) and whole draft blocks at
    once: two code paths, one distribution."""
    s = SamplerSettings(temp=0.8, top_k=top_k, top_p=top_p, min_p=min_p)
    logits = (np.random.default_rng(top_k).standard_normal((5, 64)) * 3).astype(np.float32)
    together = distribution(logits, s)
    alone = np.stack([distribution(row, s) for row in logits])
    assert np.allclose(together, alone, rtol=0, atol=1e-12)
    assert np.allclose(together.sum(axis=1), 1.0)
