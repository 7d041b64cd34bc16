"""The reduced draft vocabulary of a chained MTP head: which N tokens it scores.

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
from pathlib import Path

import numpy as np

from ggspec.native.paths import ggspec_home

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
