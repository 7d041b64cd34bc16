"""Prompt texts for distillation: built in (this Python's standard library: its sources for code,
its reference topics and docstrings for prose), or the user's JSONL file.

Every 16th built-in text is held out (never a training prompt), so held-out measurements can use
them; the benchmark's built-in prompts are not in this corpus at all.
"""

from __future__ import annotations

import ast
import json
import sysconfig
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ggspec.errors import InputError
from ggspec.files import check_text, read_text

HOLD_OUT_EVERY = 16
MIN_DOCSTRING = 300  # characters: shorter docstrings are mostly signatures, not prose


@dataclass(frozen=True)
class Text:
    text: str
    kind: str  # "code" | "prose" | a user category
    source: str


def _stdlib_sources() -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = ("test", "idlelib", "site-packages", "lib2to3", "tkinter", "turtledemo", "ensurepip")
    return sorted(p for p in root.rglob("*.py") if not set(p.relative_to(root).parts) & set(skip))


def _docstrings(source: str) -> list[str]:
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    nodes = [tree] + [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))]
    docs = (ast.get_docstring(n, clean=True) for n in nodes)
    return [d for d in docs if d and len(d) >= MIN_DOCSTRING]


def builtin_texts() -> list[Text]:
    """Code and prose from this interpreter's standard library, in a fixed order."""
    import pydoc_data.topics

    texts: list[Text] = []
    for name in sorted(pydoc_data.topics.topics):
        texts.append(Text(pydoc_data.topics.topics[name], "prose", f"pydoc:{name}"))
    for path in _stdlib_sources():
        try:
            source = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        if len(source) < 500:
            continue
        texts.append(Text(source, "code", f"stdlib:{path.name}"))
        texts.extend(Text(d, "prose", f"doc:{path.name}") for d in _docstrings(source))
    return texts


def split(texts: list[Text]) -> tuple[list[Text], list[Text]]:
    """(training texts, held-out texts): every HOLD_OUT_EVERY-th text is held out."""
    train = [t for i, t in enumerate(texts) if i % HOLD_OUT_EVERY != HOLD_OUT_EVERY - 1]
    held = [t for i, t in enumerate(texts) if i % HOLD_OUT_EVERY == HOLD_OUT_EVERY - 1]
    return train, held


def read_jsonl(path: Path) -> list[Text]:
    """A JSONL file of {"text": str} or {"prompt": str}, optionally with "category"."""
    texts = []
    for n, line in enumerate(read_text(path, f"--data {path}").splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except (json.JSONDecodeError, RecursionError):
            raise InputError(f"--data {path}:{n}: not JSON") from None
        text = obj.get("text", obj.get("prompt")) if isinstance(obj, dict) else None
        if not isinstance(text, str) or not text:
            raise InputError(f"--data {path}:{n}: expected an object with a non-empty string \"text\" or \"prompt\"")
        check_text(text, f"--data {path}:{n}")
        kind = obj.get("category", "user")
        texts.append(Text(text, kind if isinstance(kind, str) and kind else "user", f"{path.name}:{n}"))
    if not texts:
        raise InputError(f"--data {path}: no texts in the file")
    return texts


def sample_prompts(texts: list[Text], tokenize: Callable[[str], np.ndarray], n: int, prompt_len: int,
                   seed: int, bos: int | None) -> list[np.ndarray]:
    """n prompts of at most prompt_len tokens: a window starting at a random line of a random
    text (code and prose alternate when both are present), after the target's BOS if it uses one."""
    rng = np.random.default_rng(seed)
    by_kind: dict[str, list[Text]] = {}
    for t in texts:
        by_kind.setdefault(t.kind, []).append(t)
    kinds = sorted(by_kind)
    body = prompt_len - (bos is not None)
    prompts: list[np.ndarray] = []
    attempts = 0
    while len(prompts) < n:
        attempts += 1
        if attempts > 20 * n + 100:
            raise InputError("the prompt texts are too short to cut prompts from", field="data")
        pool = by_kind[kinds[len(prompts) % len(kinds)]]
        text = pool[int(rng.integers(len(pool)))].text
        start = 0
        if len(text) > 8 * prompt_len:  # from the start of a random line
            start = text.find("\n", int(rng.integers(len(text) - 4 * prompt_len))) + 1
        ids = tokenize(text[start:start + 8 * prompt_len])
        if len(ids) < min(8, body):
            continue
        ids = ids[:body]
        prompts.append(np.concatenate([[bos], ids]).astype(np.int32) if bos is not None else ids.astype(np.int32))
    return prompts
