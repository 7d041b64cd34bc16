"""The reduced draft vocabulary of a model drafter: which N tokens its output head scores.

draft-simple, the DFlash types borrowing their target's head, and chained draft-mtp can score
only N rows of their output matrix (patches 0011 and 0014: a compacted copy of those rows, built
once per set of weights); the target still verifies against its whole vocabulary, so greedy
output is unchanged, and at T > 0 the draft's distribution is the reduced one, which rejection
sampling accepts as it is.

"The N most common tokens", counted in a reference text that every machine running ggspec has:
the source files of the running Python's standard library (code, comments and docstrings; about
1.3 million tokens with a 262k vocabulary), tokenized with the target's own tokenizer. Ties and
tokens the text never produces follow in id order, and every end-of-generation token is added so
a draft can still end a sequence. Deterministic for a given target file and Python version, and
cached per target file in `$GGSPEC_HOME/vocab/`.

Measured on Gemma 3 270M's 262,144-token vocabulary (`scripts/vocab_coverage.py`): its own greedy
text on the twelve bench prompts has 0.8 % of its tokens outside the 32,768 most common ones
counted this way, 23 % outside the 32,768 lowest ids (SentencePiece ids are not in frequency
order), so the count, not the id order, is what keeps acceptance.
"""

from __future__ import annotations

import hashlib
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ggspec.errors import InputError
from ggspec.native.paths import ggspec_home
from ggspec.speculative.types.draft_type import DraftType, Options, option, type_names

CORPUS_VERSION = 1
CORPUS_BYTES = 4 << 20  # enough text for the counts to settle; tokenizing it takes seconds


def corpus_files() -> list[Path]:
    """The reference text: the standard library's top-level .py files, in name order."""
    return sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))


def _cache_path(model) -> Path:
    st = Path(model.path).stat()
    key = f"{Path(model.path).resolve()}|{st.st_size}|{st.st_mtime_ns}|{CORPUS_VERSION}|{sys.version_info[:2]}"
    return ggspec_home() / "vocab" / f"{hashlib.sha256(key.encode()).hexdigest()[:16]}.npy"


def frequency_order(model) -> np.ndarray:
    """Every token id of the model, most common in the reference text first (see the module)."""
    path = _cache_path(model)
    if path.is_file():
        order = np.load(path)
        if len(order) == model.n_vocab:
            return order
    counts = np.zeros(model.n_vocab, dtype=np.int64)
    read = 0
    for f in corpus_files():
        if read >= CORPUS_BYTES:
            break
        text = f.read_text(encoding="utf-8", errors="replace")
        read += len(text)
        np.add.at(counts, model.tokenize(text, add_special=False), 1)
    order = np.argsort(-counts, kind="stable").astype(np.int32)  # ties: lowest id first
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.npy")
    np.save(tmp, order)
    tmp.replace(path)
    return order


def draft_vocab_ids(model, n: int) -> np.ndarray:
    """The n most common tokens (see the module) plus every end-of-generation token, in that order."""
    if n >= model.n_vocab:
        return np.arange(model.n_vocab, dtype=np.int32)
    ids = frequency_order(model)[:n]
    chosen = set(ids.tolist())
    eog = [t for t in range(model.n_vocab) if t not in chosen and model.is_eog(t)]
    return np.concatenate([ids, np.asarray(eog, dtype=np.int32)]).astype(np.int32)


@dataclass(frozen=True)
class DraftVocabOptions(Options):
    """The options of the model drafters whose head can score a reduced vocabulary."""

    vocab: int = option(0, "spec_draft_vocab", ("--spec-draft-vocab",),
                        "draft-simple, plain draft-dflash, and draft-mtp with --spec-draft-chain: the draft's "
                        "head scores only the N tokens most common in the standard library's source (plus "
                        "end-of-generation tokens); the target still verifies all. 0: all.", low=None, high=None)

    def validate(self) -> None:
        if self.vocab < 0:
            raise InputError(f"the draft vocabulary must be at least 0 tokens (got {self.vocab})",
                             field="spec_draft_vocab")

    def check_unused(self, running: tuple[DraftType, ...]) -> None:
        """Given for a type that does not run: refused unless one that runs scores it too."""
        if self.vocab and not any(issubclass(t.options, DraftVocabOptions) for t in running):
            raise InputError(f"a reduced draft vocabulary applies to draft-simple, draft-dflash / dspark and chained "
                             f"draft-mtp, not to {type_names(running)}", field="spec_draft_vocab")


def give_draft_vocab(head, n: int, counted=None) -> None:
    """Give `head` (a Model) the reduced vocabulary of the n most common tokens of `counted`'s
    vocabulary (draft_vocab_ids; default the head's own): its compacted rows, built only when the
    model holds another set. A dry model (the memory fit's) has no weights to compact: its
    contexts are measured with the whole head, from above."""
    if head.dry:
        return
    ids = draft_vocab_ids(counted or head, n)
    ids = ids[ids < head.n_vocab]
    if head.draft_vocab is None or not np.array_equal(head.draft_vocab, ids):
        head.set_draft_vocab(ids)


def set_draft_head(ctx, head, n: int, counted=None) -> None:
    """Make `ctx` score `head`'s output matrix reduced to n tokens (give_draft_vocab); n = 0
    leaves the full head."""
    if n and not head.dry:
        give_draft_vocab(head, n, counted)
        ctx.set_head_rows(head)
