"""A grammar constraint: llama.cpp's grammar sampler (GBNF), owned.

`Grammar(model, gbnf)` parses a GBNF grammar against a model's vocabulary. It answers which
tokens may come next (`allows`, `mask`, `greedy`) and moves on as tokens are accepted
(`accept`); `clone` copies its state, so a verify walk can try drafted tokens without touching
the sequence's own. An end-of-generation token is allowed only where the grammar is complete,
as in llama.cpp.

Accepting a token the grammar does not allow would abort inside llama.cpp, so `accept` checks
first and raises instead.

A `GrammarSpec` adds what a chat template's grammar needs (runtime/chat.py): laziness (the
grammar waits, allowing anything, until a trigger pattern or token appears in the accepted text,
then constrains from there) and the tokens it is fed first (the template's generation prompt).
A woken grammar checks the text it buffered and may refuse it: that accept goes through patch
0017's ggspec_sampler_accept, which turns llama.cpp's exception into a refusal.
"""

from __future__ import annotations

import ctypes
import math
from dataclasses import dataclass

import numpy as np

from ggspec.errors import ClosedError, GGSpecError, InputError

TOKEN_DATA = np.dtype([("id", "<i4"), ("logit", "<f4"), ("p", "<f4")], align=True)  # llama_token_data


class GrammarDeadEnd(GGSpecError):
    """The grammar allows no token at all here (or not the one given): the request cannot go on."""


@dataclass(frozen=True)
class GrammarSpec:
    """A grammar with what a chat template's grammar adds (module docstring)."""

    gbnf: str
    lazy: bool = False
    trigger_patterns: tuple[str, ...] = ()  # regexes over the accepted text (std::regex, ECMAScript)
    trigger_tokens: tuple[int, ...] = ()
    prefill: tuple[int, ...] = ()  # accepted first


class Grammar:
    def __init__(self, model, gbnf: str | GrammarSpec, root: str = "root", *, _ptr=None) -> None:
        self._lc, self._model = model.lc, model
        self._accept_safe = _safe_accept()
        if _ptr is None:
            spec = gbnf if isinstance(gbnf, GrammarSpec) else GrammarSpec(gbnf)
            _ptr = self._init(spec, root)
            self._ptr = _ptr
            for t in spec.prefill:
                if not self._accept_safe(_ptr, t):
                    self.close()
                    raise InputError("the grammar does not accept the chat template's generation prompt",
                                     field="grammar")
        self._ptr = _ptr
        # one candidate, asked about for almost every token: built once (a ctypes array per call
        # cost more than the grammar's own work)
        self._cell = self._lc.llama_token_data()
        self._one = ctypes.byref(self._lc.llama_token_data_array(ctypes.pointer(self._cell), 1, -1, False))

    def _init(self, spec: GrammarSpec, root: str):
        if not spec.gbnf.strip():
            raise InputError("the grammar is empty", field="grammar")
        gbnf, start = spec.gbnf.encode("utf-8"), root.encode("utf-8")
        if spec.lazy:
            patterns = [p.encode("utf-8") for p in spec.trigger_patterns]
            tokens = (self._lc.llama_token * len(spec.trigger_tokens))(*spec.trigger_tokens)
            ptr = self._lc.llama_sampler_init_grammar_lazy_patterns(
                self._model.vocab, gbnf, start, (ctypes.c_char_p * len(patterns))(*patterns), len(patterns),
                tokens, len(spec.trigger_tokens))
        else:
            ptr = self._lc.llama_sampler_init_grammar(self._model.vocab, gbnf, start)
        if not ptr:
            raise InputError(f"llama.cpp cannot parse this grammar (GBNF, start symbol '{root}'): see "
                             "llama.cpp's grammars/README.md", field="grammar")
        return ptr

    @property
    def ptr(self):
        if self._ptr is None:
            raise ClosedError("this Grammar is closed")
        return self._ptr

    def clone(self) -> "Grammar":
        return Grammar(self._model, "", _ptr=self._lc.llama_sampler_clone(self.ptr))

    def _apply(self, cells: np.ndarray) -> None:
        lc = self._lc
        arr = lc.llama_token_data_array(ctypes.cast(cells.ctypes.data, lc.llama_token_data_p), len(cells), -1, False)
        lc.llama_sampler_apply(self.ptr, ctypes.byref(arr))

    def allows(self, token: int) -> bool:
        cell = self._cell
        cell.id, cell.logit = token, 0.0
        self._lc.llama_sampler_apply(self.ptr, self._one)
        return cell.logit != -math.inf

    def mask(self, logits: np.ndarray) -> np.ndarray:
        """A copy of one row of logits with every token the grammar forbids at -inf."""
        cells = np.empty(len(logits), dtype=TOKEN_DATA)
        cells["id"] = np.arange(len(logits), dtype=np.int32)
        cells["logit"] = logits
        self._apply(cells)
        return cells["logit"]

    def greedy(self, logits: np.ndarray) -> int:
        """The argmax of a row among the tokens allowed: the row's own argmax when it is allowed
        (almost always: no whole-vocabulary pass), else the masked row's."""
        token = int(logits.argmax())
        if self.allows(token):
            return token
        masked = self.mask(logits)
        token = int(masked.argmax())
        if not np.isfinite(masked[token]):
            raise GrammarDeadEnd("the grammar allows no token here")
        return token

    def accept(self, token: int) -> None:
        if not self.allows(token) or not self._accept_safe(self.ptr, token):
            raise GrammarDeadEnd(f"the grammar does not allow token {token} here")

    def cut(self, tokens: list[int]) -> int:
        """How many leading tokens the grammar allows in turn (this grammar is left as it was)."""
        walk = self.clone()
        try:
            for i, t in enumerate(tokens):
                if not walk.allows(t) or not walk._accept_safe(walk.ptr, t):
                    return i
            return len(tokens)
        finally:
            walk.close()

    def close(self) -> None:
        if self._ptr is not None:
            self._lc.llama_sampler_free(self._ptr)
            self._ptr = None

    def __del__(self) -> None:  # a sequence cancelled mid-step still frees its grammar
        try:
            self.close()
        except Exception:  # noqa: BLE001 (interpreter shutdown)
            pass


def _safe_accept():
    """llama_sampler_accept that refuses instead of throwing (patch 0017)."""
    from ggspec.native import bindings  # (loaded by then: a Grammar needs a loaded model)

    return bindings.common_library().ggspec_sampler_accept
