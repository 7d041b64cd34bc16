"""A small byte-level BPE with Qwen2's pre-tokenizer, so llama.cpp's `qwen2` pre-type matches."""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

EOS = "<|endoftext|>"
MASK = "<|MASK|>"
SPECIALS = [EOS, MASK]

# Qwen2's tokenizer.json regex; llama.cpp applies the same one for pre-type "qwen2".
QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)


@dataclass(frozen=True)
class Vocab:
    tokens: list[str]  # id -> token text (GPT-2 byte-to-unicode form)
    merges: list[str]  # "a b", in merge order
    eos: int
    mask: int

    def token_types(self) -> list[int]:
        # llama.h LLAMA_TOKEN_TYPE_NORMAL = 1, CONTROL = 3
        return [3 if t in SPECIALS else 1 for t in self.tokens]


def train_tokenizer(texts: list[str], vocab_size: int) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIALS, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(texts, trainer)
    return tok


def vocab_of(tok: Tokenizer) -> Vocab:
    model = json.loads(tok.to_str())["model"]
    by_id = sorted(model["vocab"].items(), key=lambda kv: kv[1])
    tokens = [t for t, _ in by_id]
    assert [i for _, i in by_id] == list(range(len(tokens)))
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    return Vocab(tokens=tokens, merges=merges, eos=tokens.index(EOS), mask=tokens.index(MASK))


def encode(tok: Tokenizer, texts: list[str], eos: int) -> np.ndarray:
    """The texts' token ids back to back, each followed by `eos`."""
    ids: list[int] = []
    for t in texts:
        ids += tok.encode(t).ids
        ids.append(eos)
    return np.asarray(ids, dtype=np.int32)
