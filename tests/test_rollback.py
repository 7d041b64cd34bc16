"""Recurrent rollback on the hybrid target (patch 0002): every kept rollback is exact, every other
one is refused without changing anything, the conv-state fix holds, and the delta-net op keeps
exactly the states its snapshot map asks for."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest

from ggspec.errors import LlamaError
from ggspec.runtime import Batch, Context, ContextParams, Model
from ggspec.speculative.planes import kept_counts

PROMPT = [10, 20, 30, 40, 50, 60, 70, 80]
BLOCK = [11, 22, 33, 44, 55, 66, 77, 88]  # a verify-sized batch (n_max 7 + 1)


def _params(n_rs_seq: int) -> ContextParams:
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


@pytest.fixture(scope="module")
def reference(hybrid_model):
    """Logits after PROMPT + BLOCK[:k] + [99], decoded from scratch, for every k."""
    out = {}
    for k in range(len(BLOCK) + 1):
        with Context(hybrid_model, _params(0)) as ref:
            out[k] = _logits_after(ref, PROMPT + BLOCK[:k] + [99], 0)
    return out


LAYOUTS = [(8, -1), (4, -1), (3, 0), (3, 1), (4, 0), (4, 1), (4, 2), (5, 3), (6, 2)]


@pytest.mark.parametrize("planes, lead", LAYOUTS)
def test_every_kept_rollback_is_exact_and_others_are_refused(hybrid_model, reference, planes, lead):
    for k in range(len(BLOCK) + 1):  # keep k tokens of the batch
        with Context(hybrid_model, _params(planes - 1)) as ctx:
            if lead >= 0:
                ctx.set_rs_layout(planes, lead)
            kept = ctx.rs_kept_counts(len(BLOCK))
            assert set(kept) == kept_counts(planes, lead, len(BLOCK))  # the Python mirror agrees
            _logits_after(ctx, PROMPT, 0)
            _logits_after(ctx, BLOCK, len(PROMPT))
            end = ctx.pos_max()
            if k in kept:
                ctx.truncate(len(PROMPT) + k)
                got = _logits_after(ctx, [99], len(PROMPT) + k)
                np.testing.assert_allclose(got, reference[k], atol=1e-3, err_msg=f"k={k}")
                assert got.argmax() == reference[k].argmax()
            else:
                assert not ctx.can_truncate(len(PROMPT) + k)
                with pytest.raises(LlamaError, match="no recurrent state plane"):
                    ctx.truncate(len(PROMPT) + k)
                # llama.cpp itself refuses too, and changes nothing
                assert not ctx.lc.llama_memory_seq_rm(ctx.memory, 0, len(PROMPT) + k, -1)
                assert ctx.pos_max() == end


def test_the_whole_batch_trap_is_closed(hybrid_model, reference):
    """Unpatched llama.cpp 'succeeded' rolling back a whole batch with a wrong state. Now the
    default layout refuses it, and a layout with an input plane serves it exactly."""
    with Context(hybrid_model, _params(4)) as ctx:
        _logits_after(ctx, PROMPT, 0)
        _logits_after(ctx, BLOCK[:3], len(PROMPT))
        assert not ctx.lc.llama_memory_seq_rm(ctx.memory, 0, len(PROMPT), -1)
    with Context(hybrid_model, _params(4)) as ctx:
        ctx.set_rs_layout(5, 0)
        _logits_after(ctx, PROMPT, 0)
        _logits_after(ctx, BLOCK, len(PROMPT))
        ctx.truncate(len(PROMPT))  # back to the input plane
        np.testing.assert_allclose(_logits_after(ctx, [99], len(PROMPT)), reference[0], atol=1e-3)


def test_conv_state_survives_a_short_batch(hybrid_model):
    """Seed 001's fix: after a long batch and a short one, rolling back into a state only the
    long batch's planes hold must restore its conv state too. Unpatched, the short batch
    overwrote every conv plane (21 of 24 such rollbacks came back wrong, logits off by up to 107)."""
    n_rs, long_len = 8, 12
    long_b = [(7 * i + 3) % 500 + 5 for i in range(long_len)]
    checked = 0
    for m in (1, 2, 3):
        short_b = [(70 + m + 11 * i) % 500 + 5 for i in range(m)]
        end = long_len + m - 1
        for p in range(end - 1, long_len - 2 - n_rs, -1):
            held = long_len <= p <= end - 1 or m <= long_len - 1 - p <= n_rs
            with Context(hybrid_model, _params(n_rs)) as ctx:
                _logits_after(ctx, long_b, 0)
                _logits_after(ctx, short_b, long_len)
                assert ctx.can_truncate(p + 1) == held, (m, p)
                if not held:
                    continue
                ctx.truncate(p + 1)
                got = _logits_after(ctx, [99, 98], p + 1)
            with Context(hybrid_model, _params(0)) as ref:
                want = _logits_after(ref, (long_b + short_b)[:p + 1] + [99, 98], 0)
            np.testing.assert_allclose(got, want, atol=1e-3, err_msg=f"m={m} p={p}")
            checked += 1
    assert checked >= 20


def test_setter_rejects_impossible_layouts(hybrid_model):
    from ggspec.errors import InputError

    with Context(hybrid_model, _params(3)) as ctx:
        with pytest.raises(InputError, match="out of range"):
            ctx.set_rs_layout(5, 0)  # more planes than the context has
        with pytest.raises(InputError, match="lead"):
            ctx.set_rs_layout(4, 3)  # lead must leave a newest and an input plane


def test_delta_net_snapshot_map_op(build_info, tmp_path):
    """ggml-level: every snapshot slot holds the state after its token (compiled against the build)."""
    tree = Path(build_info.root) / "llama.cpp"
    exe = tmp_path / "test_gdn_snapshot_map"
    src = Path(__file__).parent / "native" / "test_gdn_snapshot_map.c"
    lib = build_info.lib_dir
    subprocess.run(["cc", "-O2", "-std=c11", str(src), f"-I{tree}/ggml/include", f"-L{lib}", "-lggml",
                    "-lggml-base", "-lggml-cpu", "-lm", f"-Wl,-rpath,{lib}", "-o", str(exe)], check=True)
    proc = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert " 0 failed" in proc.stdout, proc.stdout
