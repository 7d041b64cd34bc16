"""A reduced draft vocabulary for draft-simple and DFlash (patch 0014, `--spec-draft-vocab N`).

The draft's head scores only the rows of the N most common tokens (ggspec.speculative.types.draft_vocab):
its logits are exactly those columns of the full head's, drafts are always among those tokens, and
greedy output stays equal to plain greedy output (the target verifies against its full
vocabulary), alone, three at once and sampled; options that cannot apply are refused in one line.
The chained MTP head's reduced vocabulary (patch 0011) is tested in test_mtp.py.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import PROMPTS, run_cli
from helpers.drafts import Recorder, spec_equals_plain, three_at_once_equal_plain
from helpers.pairs import CPP_CTX as CTX
from helpers.pairs import DFLASH, DRAFT, TARGET

from ggspec.errors import InputError
from ggspec.runtime import Batch, Context
from ggspec.speculative.driver import generate_spec
from ggspec.speculative.engine import Engine
from ggspec.speculative.models import Models, PairConfig
from ggspec.speculative.sampling import SamplerSettings
from ggspec.speculative.types.draft_vocab import DraftVocabOptions, draft_vocab_ids

N_VOCAB_DRAFT = 300  # of the tiny pair's 1024 tokens


def _cfg(draft=DRAFT, spec_type: str = "draft-simple", vocab: int = N_VOCAB_DRAFT, **kw) -> PairConfig:
    return PairConfig(target=TARGET, draft=draft, spec_type=spec_type, n_max=5, ctx=CTX,
                      spec_options={spec_type: DraftVocabOptions(vocab=vocab)}, **kw)


def test_a_reduced_head_scores_exactly_those_columns_of_the_full_head():
    """The same batch through two contexts of the draft model: the reduced one's logits are the
    full one's columns of the chosen tokens (to float rounding: the product of another width is
    tiled otherwise), and its rows are that wide."""
    with Models(_cfg()) as models:
        ids = draft_vocab_ids(models.target, N_VOCAB_DRAFT)
        models.draft.set_draft_vocab(ids)
        full, reduced = Context(models.draft, CTX), Context(models.draft, CTX)
        reduced.set_head_rows(models.draft)
        assert reduced.n_logits == len(ids) and np.array_equal(reduced.logit_ids, ids)
        tokens = models.target.tokenize(PROMPTS[0])
        rows = []
        for ctx in (full, reduced):
            with Batch(ctx) as batch:
                batch.add_tokens(tokens, 0, 0, outputs="all")
                ctx.decode(batch)
            rows.append(ctx.logits())
        assert rows[1].shape == (len(tokens), len(ids))
        assert np.allclose(rows[1], rows[0][:, ids], rtol=1e-5, atol=1e-5)
        assert np.array_equal(reduced.argmax_rows(), ids[rows[1].argmax(axis=1)])
        # another set on the model (another engine's size) leaves this context its own rows
        other = Context(models.draft, CTX)
        models.draft.set_draft_vocab(draft_vocab_ids(models.target, 100))
        other.set_head_rows(models.draft)
        for ctx in (reduced, other):
            ctx.clear()
            with Batch(ctx) as batch:
                batch.add_tokens(tokens, 0, 0, outputs="all")
                ctx.decode(batch)
        assert np.array_equal(reduced.logits(), rows[1])
        assert np.allclose(other.logits(), rows[0][:, other.logit_ids], rtol=1e-5, atol=1e-5)
        assert other.n_logits < len(ids)
        other.close()
        reduced.set_head_rows(None)  # the full head again
        assert reduced.n_logits == models.draft.n_vocab and reduced.logit_ids is None
        full.close()
        reduced.close()


@pytest.mark.parametrize("draft, spec_type", [(DRAFT, "draft-simple"), (DFLASH, "draft-dflash")])
def test_a_reduced_vocabulary_changes_the_drafts_never_the_output(draft, spec_type):
    with Engine.open(_cfg(draft, spec_type)) as eng:
        allowed = set(draft_vocab_ids(eng.target_model, N_VOCAB_DRAFT).tolist())
        same, log = spec_equals_plain(eng, PROMPTS[:4], 48)
        assert same
        assert any(d for _, _, d in log) and all(set(d) <= allowed for _, _, d in log)
    with Engine.open(_cfg(draft, spec_type, parallel=3)) as eng:
        three_at_once_equal_plain(eng, 32)


def test_sampled_drafts_come_from_the_reduced_vocabulary():
    """At T > 0 the draft's distribution is the reduced one, over token ids (not its columns):
    every draft is a chosen token, and a seeded run is reproducible."""
    with Engine.open(_cfg(sampling=SamplerSettings(temp=0.8, seed=7))) as eng:
        allowed = set(draft_vocab_ids(eng.target_model, N_VOCAB_DRAFT).tolist())
        rec = Recorder(eng.proposer)
        list(generate_spec(eng, eng.target_model.tokenize(PROMPTS[1]), 40, ignore_eos=True, proposer=rec))
        assert any(d for _, _, d in rec.log) and all(set(d) <= allowed for _, _, d in rec.log)
    args = ("run", "-m", str(TARGET), "-md", str(DRAFT), "--spec-draft-vocab", str(N_VOCAB_DRAFT),
            "--temp", "0.8", "--seed", "7", "-p", PROMPTS[1], "-n", "40", "-t", "1")
    first, again = run_cli(*args), run_cli(*args)
    assert first.returncode == 0, first.stderr
    assert first.stdout == again.stdout and first.stdout.strip()


def test_options_that_cannot_apply_are_refused_in_one_line():
    with pytest.raises(InputError, match="at least 0 tokens"):
        _cfg(vocab=-1).validate()
    with pytest.raises(InputError, match="applies to draft-simple, draft-dflash / dspark and chained draft-mtp, "
                                         "not to ngram-simple"):
        Engine.open(PairConfig(target=TARGET, spec_type="ngram-simple", ctx=CTX,
                               spec_options={"draft-simple": DraftVocabOptions(vocab=100)}))
    res = run_cli("run", "-m", str(TARGET), "--spec-type", "ngram-simple", "--spec-draft-vocab", "100",
                  "-p", PROMPTS[0], "-n", "8")
    assert res.returncode != 0 and "Traceback" not in res.stderr
    assert "--spec-draft-vocab: a reduced draft vocabulary applies to draft-simple" in res.stderr


def test_cli_runs_draft_simple_with_a_reduced_vocabulary():
    res = run_cli("run", "-m", str(TARGET), "-md", str(DRAFT), "--spec-draft-vocab", str(N_VOCAB_DRAFT),
                  "--spec-draft-n-max", "5", "-p", PROMPTS[2], "-n", "32", "-t", "1", "--check")
    assert res.returncode == 0, res.stderr
    assert "check: identical to plain greedy" in res.stderr
