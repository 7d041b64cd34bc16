"""Recurrent rollback on the hybrid target: every kept rollback is exact, and the llama.cpp trap
(rolling back a whole last batch "succeeds" with a wrong state) cannot be reached via Context."""

from __future__ import annotations

import numpy as np
import pytest

from ggspec.errors import LlamaError
from ggspec.runtime import Batch, Context, ContextParams, Model

N_RS = 4
PROMPT = [10, 20, 30, 40, 50, 60, 70, 80]
BLOCK = [11, 22, 33, 44, 55]  # verify-like block of N_RS + 1 tokens


def _params(n_rs_seq=N_RS) -> ContextParams:
    return ContextParams(n_ctx=256, n_batch=64, n_ubatch=64, type_k="f32", type_v="f32",
                         flash_attn="off", n_rs_seq=n_rs_seq)


def _logits_after(ctx: Context, tokens: list[int], pos0: int) -> np.ndarray:
    with Batch(ctx) as b:
        b.add_tokens(tokens, pos0, outputs="last")
        ctx.decode(b)
    return ctx.logits()[-1]


@pytest.fixture(scope="module")
def hybrid_model(hybrid_pair, build_info):
    with Model(hybrid_pair.target) as m:
        assert m.is_recurrent
        yield m


@pytest.mark.parametrize("r", range(1, N_RS + 1))
def test_kept_rollback_is_exact(hybrid_model, r):
    """Decode prompt + block, roll back r tokens, continue: same logits as never decoding them."""
    keep = len(BLOCK) - r
    with Context(hybrid_model, _params()) as ctx:
        _logits_after(ctx, PROMPT, 0)
        _logits_after(ctx, BLOCK, len(PROMPT))
        ctx.truncate(len(PROMPT) + keep)
        got = _logits_after(ctx, [99], len(PROMPT) + keep)
    with Context(hybrid_model, _params()) as ref:
        want = _logits_after(ref, PROMPT + BLOCK[:keep] + [99], 0)
    np.testing.assert_allclose(got, want, atol=1e-3)
    assert got.argmax() == want.argmax()


def test_whole_batch_rollback_is_refused(hybrid_model):
    with Context(hybrid_model, _params()) as ctx:
        _logits_after(ctx, PROMPT, 0)
        _logits_after(ctx, BLOCK[:3], len(PROMPT))
        with pytest.raises(LlamaError, match="recurrent state before a batch"):
            ctx.truncate(len(PROMPT))  # r == 3 == rows of the last batch


def test_rollback_beyond_planes_is_refused(hybrid_model):
    with Context(hybrid_model, _params(n_rs_seq=2)) as ctx:
        _logits_after(ctx, PROMPT, 0)
        _logits_after(ctx, BLOCK, len(PROMPT))
        with pytest.raises(LlamaError, match="2 recurrent planes"):
            ctx.truncate(len(PROMPT) + 1)  # r == 4 > 2 planes


def test_the_trap_exists_in_raw_llama_cpp(hybrid_model):
    """Why the guard exists: raw seq_rm of the whole last batch returns true, state is wrong."""
    lc = hybrid_model.lc
    with Context(hybrid_model, _params()) as ctx:
        _logits_after(ctx, PROMPT, 0)
        _logits_after(ctx, BLOCK[:3], len(PROMPT))
        assert lc.llama_memory_seq_rm(ctx.memory, 0, len(PROMPT), -1)  # claims success
        got = _logits_after(ctx, [99], len(PROMPT))
    with Context(hybrid_model, _params()) as ref:
        want = _logits_after(ref, PROMPT + [99], 0)
    assert not np.allclose(got, want, atol=1e-3), "the trap is gone: revisit Context.truncate"
