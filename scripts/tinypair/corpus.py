"""The training text: the running interpreter's own standard library, present on every machine.

Top-level `*.py` files of the stdlib, sorted by name; every 16th file (0, 16, 32, ...) is held
out and never seen in training, so evaluation uses text the pair has not learned verbatim.
"""

from __future__ import annotations

import sysconfig
from pathlib import Path

HELDOUT_EVERY = 16


def stdlib_files() -> list[Path]:
    return sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))


def split(files: list[Path]) -> tuple[list[Path], list[Path]]:
    """(train, held-out)."""
    held = [f for i, f in enumerate(files) if i % HELDOUT_EVERY == 0]
    train = [f for i, f in enumerate(files) if i % HELDOUT_EVERY != 0]
    return train, held


def read_texts(files: list[Path]) -> list[str]:
    return [f.read_text(encoding="utf-8", errors="replace") for f in files]


def heldout_prompts(n: int, n_chars: int = 240, seed: int = 0) -> list[str]:
    """n prompts cut from held-out files at line starts, deterministic for a given stdlib."""
    import random

    _, held = split(stdlib_files())
    rng = random.Random(seed)
    prompts = []
    texts = [t for t in read_texts(held) if len(t) > 4 * n_chars]
    while len(prompts) < n:
        text = texts[len(prompts) % len(texts)]
        start = text.find("\n", rng.randrange(0, len(text) - 2 * n_chars)) + 1
        prompts.append(text[start:start + n_chars])
    return prompts
