"""The draft's token picked on the device (llama.cpp's backend sampling: Context.pick_on_device).

Where a draft's head runs on a GPU, draft-simple and DFlash have greedy sequences' draft tokens
picked in the draft's own graph (the argmax, or the 10 largest logits when p_min needs their
confidence), so no vocabulary-wide row crosses to the host for them. On this CPU the default keeps
the host's argmax (faster here); the tests turn the picks on and check that they pick what the
host would: row by row on a context (a reduced head's rows too: patch 0016), and draft by draft in
the engine, a sampled sequence beside a greedy one.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from conftest import PROMPTS
from helpers.drafts import Recorder
from helpers.pairs import CPP_CTX as CTX
from helpers.pairs import DFLASH, DRAFT, TARGET

from ggspec.runtime import Batch, Context
from ggspec.speculative.engine import Engine
from ggspec.speculative.models import Models, PairConfig
from ggspec.speculative.request import Request
from ggspec.speculative.sampling import SamplerSettings
from ggspec.speculative.types.draft_vocab import DraftVocabOptions, draft_vocab_ids


@pytest.mark.parametrize("reduced", [False, True])
def test_the_device_picks_each_rows_argmax_and_top_10_as_the_host(reduced):
    """One sequence's output row picked as its argmax, two as their 10 largest logits, a fourth
    left full: the same batch through a context that keeps every row full gives those very
    columns and logits (a reduced head's picked rows past the first at its own width: patch 0016)."""
    with Models(PairConfig(target=TARGET, draft=DRAFT, ctx=CTX)) as models:
        if reduced:
            models.draft.set_draft_vocab(draft_vocab_ids(models.target, 300))
        params = replace(CTX, n_seq_max=4, kv_unified=True)
        full, picked = Context(models.draft, params), Context(models.draft, params)
        for ctx in (full, picked):
            if reduced:
                ctx.set_head_rows(models.draft)
        assert picked.pick_on_device(0, 0) and picked.pick_on_device(1, 10) and picked.pick_on_device(2, 10)
        for ctx in (full, picked):
            with Batch(ctx) as batch:
                for seq_id, text in enumerate(PROMPTS[:4]):
                    batch.add_tokens(models.target.tokenize(text), 0, seq_id, outputs="last")
                ctx.decode(batch)
        rows = full.logits()
        assert picked.picked_argmax(0) == rows[0].argmax()
        for r in (1, 2):
            cols, logits = picked.picked_top(r)
            top = np.argsort(rows[r])[-10:]
            assert set(cols.tolist()) == set(top.tolist())
            assert np.allclose(np.sort(logits), np.sort(rows[r][top]), atol=1e-4)
        assert np.allclose(picked.logits_view()[3], rows[3], atol=1e-4)  # the fourth: a full row
        assert picked.pick_on_device(1, None) and picked.picked_on_device(1) is None
        assert picked.picked_on_device(0) == 0 and picked.picked_on_device(2) == 10
        full.close()
        picked.close()


# (draft, type, p_min, reduced vocabulary, the second sequence sampled): a DFlash batch with a
# sampled sequence reads full rows for all (its greedy rows too), so its picks are read alone
CASES = [(DRAFT, "draft-simple", 0.0, 0, True), (DRAFT, "draft-simple", 0.3, 300, True),
         (DFLASH, "draft-dflash", 0.0, 0, False), (DFLASH, "draft-dflash", 0.3, 300, False),
         (DFLASH, "draft-dflash", 0.3, 0, True)]


@pytest.mark.parametrize("draft, spec_type, p_min, vocab, hot", CASES)
def test_picked_drafts_are_the_hosts(draft, spec_type, p_min, vocab, hot):
    """Two sequences at once, greedy ones picked on the device (a sampled one reads full rows):
    the drafts and the text equal those of full rows on the host, step for step."""
    cfg = PairConfig(target=TARGET, draft=draft, spec_type=spec_type, n_max=4, ctx=CTX, parallel=2, p_min=p_min,
                     spec_options={spec_type: DraftVocabOptions(vocab=vocab)})
    _picked_equals_host(cfg, hot, default=False)


@pytest.mark.gpu
@pytest.mark.parametrize("draft, spec_type, p_min", [(DRAFT, "draft-simple", 0.0), (DRAFT, "draft-simple", 0.3),
                                                      (DFLASH, "draft-dflash", 0.0), (DFLASH, "draft-dflash", 0.3)])
def test_a_head_on_the_gpu_picks_by_default_what_the_host_would(draft, spec_type, p_min, gpu_build):
    """Both models on the GPU: the picks are the default, and they draft what the host's rows do
    (scripts/device_check.sh runs this where a GPU is lent)."""
    cfg = PairConfig(target=TARGET, draft=draft, spec_type=spec_type, n_max=4, ctx=CTX, parallel=2, p_min=p_min,
                     n_gpu_layers=-1, n_gpu_layers_draft=-1)
    _picked_equals_host(cfg, hot=False, default=True)


def _picked_equals_host(cfg: PairConfig, hot: bool, default: bool) -> None:
    """The drafts and text of two sequences (the second sampled when `hot`) with the greedy ones'
    draft tokens picked on the device and with full rows on the host: equal. `default`: the
    engine picks on the device without being told."""
    second = SamplerSettings(temp=0.8, seed=3) if hot else None
    k = 10 if cfg.p_min else 0
    runs = []
    for on_device in (True, False):
        with Engine.open(cfg) as eng:
            assert eng.proposer.pick_on_device == default
            eng.proposer.pick_on_device = on_device
            rec = Recorder(eng.proposer)
            eng.proposer = rec
            prompts = [eng.target_model.tokenize(t) for t in PROMPTS[:2]]
            seqs = [eng.add(Request(prompts[0], 48, ignore_eos=True)),
                    eng.add(Request(prompts[1], 48, ignore_eos=True, sampling=second))]
            picked = {tuple(rec.inner.draft.picked_on_device(s.seq_id) for s in seqs) for _ in eng.run()}
            runs.append(([s.tokens for s in seqs], rec.log))
            assert picked == ({(k, None if hot else k)} if on_device else {(None, None)})
    assert runs[0] == runs[1]
    assert sum(len(d) for _, _, d in runs[0][1]) > 20
