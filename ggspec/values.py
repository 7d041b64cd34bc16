"""Predicates for values read from files (GGUF metadata, saved benchmarks): JSON and GGUF both
have booleans that Python counts as integers, and neither may pass for a number."""

from __future__ import annotations

from typing import Any


def is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def is_number(v: Any) -> bool:
    """An int or a float (NaN and infinities included: callers say whether those are allowed)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool)
