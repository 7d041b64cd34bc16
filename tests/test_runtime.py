"""Runtime wrappers and the pure pieces of the loop."""

from __future__ import annotations

import numpy as np
import pytest

from ggspec.catalogue.tiny import write_tiny_pair
from ggspec.errors import LlamaError
from ggspec.files import file_sha256
from ggspec.runtime import Batch, Context, ContextParams, Model
from ggspec.speculative.driver import generate_spec
from ggspec.speculative.engine import Engine
from ggspec.speculative.models import Models, PairConfig
from ggspec.speculative.request import Request
from ggspec.speculative.sequence import Sequence
from ggspec.speculative.stats import summarize
from ggspec.speculative.verifier import accept_greedy


@pytest.fixture(scope="module")
def dense_model(dense_pair, build_info):
    with Model(dense_pair.target) as m:
        yield m


def test_tokenizer_round_trip(dense_model):
    text = "def f(x):\n    return x * 2  # double\n"
    tokens = dense_model.tokenize(text)
    assert len(tokens) < len(text)  # merges make multi-byte tokens
    assert dense_model.detokenize(tokens) == text


def test_batch_refuses_overflow(dense_model):
    with Context(dense_model, ContextParams(n_ctx=256, n_batch=32, n_ubatch=32)) as ctx, Batch(ctx) as b:
        b.add_tokens(np.arange(30), 0)
        with pytest.raises(LlamaError, match="batch overflow"):
            b.add_tokens(np.arange(3), 30)


def test_logits_are_copies(dense_model):
    with Context(dense_model, ContextParams(n_ctx=256)) as ctx, Batch(ctx) as b:
        ctx.decode(b.add_tokens([1, 2, 3], 0, outputs="all"))
        first = ctx.logits()
        assert first.shape == (3, dense_model.n_vocab)
        ctx.decode(b.clear().add_tokens([4], 3, outputs="all"))
        assert ctx.logits().shape == (1, dense_model.n_vocab)
        assert np.isfinite(first).all() and not np.shares_memory(first, ctx.logits_view())


def test_layer_inputs_shape(dense_model, dense_pair):
    with Context(dense_model, ContextParams(n_ctx=256)) as ctx, Batch(ctx) as b:
        ctx.enable_layer_inputs([1, 3])
        ctx.decode(b.add_tokens([5, 6, 7, 8], 0))
        rows = ctx.layer_inputs([1, 3], 4)
        assert rows.shape == (4, 2 * dense_model.n_embd) and np.isfinite(rows).all()
        assert not np.array_equal(rows[:, :128], rows[:, 128:])  # two different layers


def test_layer_input_rows_go_straight_into_a_batch(dense_pair, build_info):
    """The shim's zero-copy filler injects exactly what a copy through numpy would."""
    cfg = PairConfig(target=dense_pair.target, draft=dense_pair.draft, n_max=7)
    with Models(cfg) as models, Engine(models, cfg) as a, Engine(models, cfg) as b:
        layers = a.plan.meta.target_layers
        prompt = a.target_model.tokenize("def main():\n    print('hi')\n")
        n = len(prompt)
        drafts = []
        for sp, zero_copy in ((a, False), (b, True)):
            with Batch(sp.target) as tb, Batch(sp.draft_ctx) as db:
                sp.target.decode(tb.add_tokens(prompt, 0, outputs="last"))
                if zero_copy:
                    db.add_layer_inputs(sp.target, layers, 1, n - 1, 1)  # rows 1.. only: row offsets count
                else:
                    db.add_embd_rows(sp.target.layer_inputs(layers, n)[1:], 1)
                sp.draft_ctx.decode(db)
            drafts.append(sp.proposer.propose([Sequence(0, Request(prompt, 8), id_last=int(prompt[-1]), pos=n)], 7)[0].tokens)
            drafts.append(sp.draft_ctx.logits().copy())
        assert np.array_equal(drafts[0], drafts[2]) and np.array_equal(drafts[1], drafts[3])


def test_layer_input_rows_need_extracted_layers(dense_model):
    with Context(dense_model, ContextParams(n_ctx=256)) as ctx, Batch(ctx) as b:
        ctx.decode(b.add_tokens([5, 6, 7, 8], 0))
        with Batch(ctx) as other, pytest.raises(LlamaError, match="not extracted"):
            other.add_layer_inputs(ctx, [1], 0, 2, 0)
        ctx.enable_layer_inputs([1])
        ctx.decode(b.clear().add_tokens([5, 6, 7, 8], 4))
        with Batch(ctx) as other, pytest.raises(LlamaError, match="the last decode had 4"):
            other.add_layer_inputs(ctx, [1], 3, 2, 0)  # llama.cpp would read past its buffer


@pytest.mark.parametrize("draft, target, want", [
    ([5, 6, 7], [5, 6, 7, 8], 3),
    ([5, 6, 7], [5, 9, 7, 8], 1),
    ([5, 6, 7], [1, 6, 7, 8], 0),
    ([], [4], 0),
])
def test_accept_greedy(draft, target, want):
    assert accept_greedy(np.array(draft, dtype=np.int32), np.array(target, dtype=np.int32)) == want


def test_step_stats_are_consistent(dense_pair, build_info):
    cfg = PairConfig(target=dense_pair.target, draft=dense_pair.draft, n_max=7)
    with Engine.open(cfg) as sp:
        prompt = sp.target_model.tokenize("import os\n")
        steps = list(generate_spec(sp, prompt, 64, ignore_eos=True))
    stats = summarize(steps)
    assert steps[0].kind == "prefill" and stats.n_generated == 64
    for s in steps[1:]:
        assert 0 <= s.accepted <= s.drafted <= 7
        assert len(s.tokens) <= s.accepted + 1
        assert s.t_total >= s.t_draft + s.t_verify + s.t_inject
    assert stats.tau == stats.committed_spec / stats.spec_steps
    assert sum(stats.accept_hist) == stats.spec_steps
    assert abs(sum(stats.time_shares().values()) - 1) < 1e-9


def test_n_max_is_clamped_to_the_block_size(dense_pair, build_info):
    with Engine.open(PairConfig(target=dense_pair.target, draft=dense_pair.draft, n_max=15)) as sp:
        assert sp.n_max == 7 and "at most 7" in sp.warnings[0]


def test_fixtures_are_deterministic(tmp_path, dense_pair):
    again = write_tiny_pair(tmp_path, "dense")
    assert file_sha256(again.target) == file_sha256(dense_pair.target)
    assert file_sha256(again.draft) == file_sha256(dense_pair.draft)


@pytest.mark.parametrize("kind", ["dense", "hybrid"])
def test_draft_cache_holds_exactly_the_committed_positions(kind, request, build_info):
    """Before every draft, the draft cache covers positions 0..P-1 (P = id_last's position)."""
    from ggspec.bench.forced import ForcedAcceptance, cycle_lengths
    from ggspec.speculative.driver import generate_greedy

    pair = request.getfixturevalue(f"{kind}_pair")
    with Engine.open(PairConfig(target=pair.target, draft=pair.draft, n_max=7)) as sp:
        prompt = sp.target_model.tokenize("for i in range(10):")
        ref = [t for s in generate_greedy(sp, prompt, 48, ignore_eos=True) for t in s.tokens]
        sp.reset()
        forced = ForcedAcceptance(sp.proposer, np.concatenate([prompt, ref]), cycle_lengths(7),
                                  sp.target_model.n_vocab)
        seen = []

        def propose(seqs, n):
            (seq,) = seqs
            pos = seq.pos
            assert sp.draft_ctx.pos_max(seq.seq_id) == pos - 1  # flushed: every committed row, nothing else
            assert sp.target.pos_max(seq.seq_id) == pos - 1  # the target holds the same committed prefix
            seen.append(pos)
            out = ForcedAcceptance.propose(forced, seqs, n)
            assert sp.draft_ctx.pos_max(seq.seq_id) == pos - 1  # the noise block was removed
            return out

        forced.propose = propose
        list(generate_spec(sp, prompt, 48, proposer=forced, ignore_eos=True))
        assert len(seen) > 5


def test_one_attention_setting_for_plain_and_verifying_contexts(dense_model):
    """`auto` is llama.cpp's own choice for every context (speculative text must be computed as
    plain text is): flash attention on for the CPU too."""
    from ggspec.runtime.context import resolve_flash_attn

    assert resolve_flash_attn("auto") == "auto" and resolve_flash_attn("off") == "off"
    with Context(dense_model, ContextParams(n_ctx=256)) as ctx:
        assert ctx.flash_attn == "auto"
