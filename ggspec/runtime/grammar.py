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

It may also carry llama.cpp's reasoning budget (`ReasoningBudget`: common/reasoning-budget.cpp
through patch 0017, llama-server's `reasoning_budget_*`): once a thinking block starts, at most so
many tokens before it ends, after which a message and the end tag are forced token by token. The
two constrain together as llama.cpp's common_sampler has them: the budget first, then the grammar,
which (when lazy) sleeps while a thinking block is open and hears the block's end tag when it
closes. A spec with a budget and no GBNF is a budget alone.
"""

from __future__ import annotations

import ctypes
import math
import re
from dataclasses import dataclass

import numpy as np

from ggspec.errors import ClosedError, GGSpecError, InputError

TOKEN_DATA = np.dtype([("id", "<i4"), ("logit", "<f4"), ("p", "<f4")], align=True)  # llama_token_data
# common_reasoning_budget_state: the budget lets a lazy grammar apply only while idle or done
BUDGET_IDLE, BUDGET_DONE = 0, 4
# llama.cpp's GBNF parser recurses once per parenthesised group, with no limit: 200,000 nested
# groups overflow the stack and kill the process. Bounded here, before it runs (the grammars
# llama.cpp's JSON-schema converter writes nest a few levels; rules refer to each other by name)
MAX_GBNF_NESTING = 256
MAX_GBNF_BYTES = 4 << 20
# what the nesting count skips: string literals, character classes, comments
_NOT_GROUPS = re.compile(r'"(?:\\.|[^"\\])*"|\[(?:\\.|[^\]\\])*\]|#[^\n]*')


class GrammarDeadEnd(GGSpecError):
    """The grammar allows no token at all here (or not the one given): the request cannot go on."""


@dataclass(frozen=True)
class ReasoningBudget:
    """llama.cpp's reasoning budget, as llama-server builds it for a request (all as tokens): once
    `start` is generated, at most `tokens` more until one of `ends`; then `forced` (a message, then
    the first end tag) token by token. `tokens` -1: no limit (the block still holds a lazy grammar
    back). `prefill`: the template's generation prompt, accepted first (a prompt that opens the
    block starts the count)."""

    start: tuple[int, ...]
    ends: tuple[tuple[int, ...], ...]
    forced: tuple[int, ...]
    tokens: int = -1
    prefill: tuple[int, ...] = ()


@dataclass(frozen=True)
class GrammarSpec:
    """A grammar with what a chat template's grammar adds (module docstring)."""

    gbnf: str
    lazy: bool = False
    trigger_patterns: tuple[str, ...] = ()  # regexes over the accepted text (std::regex, ECMAScript)
    trigger_tokens: tuple[int, ...] = ()
    prefill: tuple[int, ...] = ()  # accepted first
    budget: ReasoningBudget | None = None  # a reasoning budget beside (or instead of) the GBNF


def nesting(gbnf: str) -> int:
    """The deepest nesting of parenthesised groups in a GBNF text (strings, classes, comments
    skipped)."""
    groups = np.frombuffer(re.sub(r"[^()]", "", _NOT_GROUPS.sub("", gbnf)).encode("ascii"), dtype=np.uint8)
    return int(np.cumsum(np.where(groups == ord("("), 1, -1)).max(initial=0))


def check_gbnf(gbnf: str) -> None:
    """InputError for a grammar llama.cpp's parser must not see: too large, or nested too deeply."""
    size = len(gbnf.encode("utf-8"))
    if size > MAX_GBNF_BYTES:
        raise InputError(f"the grammar is {size} bytes: at most {MAX_GBNF_BYTES} are read", field="grammar")
    if (depth := nesting(gbnf)) > MAX_GBNF_NESTING:
        raise InputError(f"the grammar nests {depth} groups deep: at most {MAX_GBNF_NESTING} are read",
                         field="grammar")


class Grammar:
    def __init__(self, model, gbnf: str | GrammarSpec, root: str = "root", *, _ptrs=None) -> None:
        self._lc, self._model = model.lc, model
        self._common = _common()
        self._closed = False
        if _ptrs is None:
            spec = gbnf if isinstance(gbnf, GrammarSpec) else GrammarSpec(gbnf)
            self._lazy = spec.lazy
            self._ptr = self._budget = None
            self._ptr = self._init(spec, root) if spec.budget is None or spec.gbnf.strip() else None
            for t in spec.prefill if self._ptr is not None else ():
                if not self._common.ggspec_sampler_accept(self._ptr, t):
                    self.close()
                    raise InputError("the grammar does not accept the chat template's generation prompt",
                                     field="grammar")
            if spec.budget is not None:
                self._budget = self._init_budget(spec.budget)
        else:
            self._ptr, self._budget, self._lazy = _ptrs
        # one candidate, asked about for almost every token: built once (a ctypes array per call
        # cost more than the grammar's own work)
        self._cell = self._lc.llama_token_data()
        self._one = ctypes.byref(self._lc.llama_token_data_array(ctypes.pointer(self._cell), 1, -1, False))

    def _init(self, spec: GrammarSpec, root: str):
        if not spec.gbnf.strip():
            raise InputError("the grammar is empty", field="grammar")
        check_gbnf(spec.gbnf)
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

    def _init_budget(self, b: ReasoningBudget):
        if not b.start or not b.ends or not all(b.ends):
            self.close()
            raise InputError("a reasoning budget needs its start tag and end tags", field="reasoning_budget")
        tok = self._lc.llama_token
        ends = [t for e in b.ends for t in e]
        ptr = self._common.ggspec_reasoning_budget_init(
            self._model.vocab, (tok * len(b.start))(*b.start), len(b.start), (tok * len(ends))(*ends),
            (ctypes.c_int32 * len(b.ends))(*map(len, b.ends)), len(b.ends), (tok * len(b.forced))(*b.forced),
            len(b.forced), b.tokens)
        if not ptr:
            self.close()
            raise InputError("llama.cpp refused this reasoning budget", field="reasoning_budget")
        ptr = ctypes.cast(ptr, self._lc.llama_sampler_p_ctypes)
        for t in b.prefill:
            self._lc.llama_sampler_accept(ptr, t)
        return ptr

    @property
    def ptr(self):
        """The grammar sampler (None: a reasoning budget alone)."""
        if self._closed:
            raise ClosedError("this Grammar is closed")
        return self._ptr

    def clone(self) -> Grammar:
        clone = self._lc.llama_sampler_clone
        return Grammar(self._model, "", _ptrs=(None if self.ptr is None else clone(self._ptr),
                                               None if self._budget is None else clone(self._budget), self._lazy))

    def _grammar_applies(self) -> bool:
        """common_sampler's grammar_should_apply: a lazy grammar sleeps inside a thinking block."""
        if self.ptr is None:
            return False
        if self._budget is None or not self._lazy:
            return True
        return self._common.ggspec_reasoning_budget_state(self._budget) in (BUDGET_IDLE, BUDGET_DONE)

    def _apply(self, cells: np.ndarray) -> None:
        lc = self._lc
        arr = ctypes.byref(lc.llama_token_data_array(ctypes.cast(cells.ctypes.data, lc.llama_token_data_p),
                                                     len(cells), -1, False))
        if self._budget is not None:
            lc.llama_sampler_apply(self._budget, arr)
        if self._grammar_applies():
            lc.llama_sampler_apply(self._ptr, arr)

    def allows(self, token: int) -> bool:
        cell = self._cell
        cell.id, cell.logit = token, 0.0
        if self._budget is not None:
            self._lc.llama_sampler_apply(self._budget, self._one)
        if self._grammar_applies():
            self._lc.llama_sampler_apply(self._ptr, self._one)
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
        if not self._accept(token):
            raise GrammarDeadEnd(f"the grammar does not allow token {token} here")

    def _accept(self, token: int) -> bool:
        """Accept a token where allowed (False where not), as common_sampler_accept: the budget
        hears it first; a lazy grammar asleep in the thinking block hears, once the block ends,
        the end tag that ended it (which may wake it)."""
        if not self.allows(token):
            return False
        applies = self._grammar_applies()
        if self._budget is not None:
            self._lc.llama_sampler_accept(self._budget, token)
            if self._ptr is not None and not applies and \
                    self._common.ggspec_reasoning_budget_state(self._budget) == BUDGET_DONE:
                for t in self._end_match():
                    if not self._common.ggspec_sampler_accept(self._ptr, t):
                        return False
        return not applies or self._common.ggspec_sampler_accept(self._ptr, token)

    @property
    def has_budget(self) -> bool:
        return self._budget is not None

    def end_reasoning(self) -> bool:
        """End the thinking block now (llama-server's reasoning_end control): a budget counting
        down starts forcing its message and end tag. Whether it did (False in any other state)."""
        return self._budget is not None and bool(self._common.ggspec_reasoning_budget_force(self._budget))

    def _end_match(self) -> list[int]:
        out = (self._lc.llama_token * 64)()
        n = self._common.ggspec_reasoning_budget_end_match(self._budget, out, len(out))
        return list(out[:min(n, len(out))])

    def cut(self, tokens: list[int]) -> int:
        """How many leading tokens the grammar allows in turn (this grammar is left as it was)."""
        walk = self.clone()
        try:
            for i, t in enumerate(tokens):
                if not walk._accept(t):
                    return i
            return len(tokens)
        finally:
            walk.close()

    def close(self) -> None:
        for name in ("_ptr", "_budget"):
            ptr = getattr(self, name, None)
            if ptr is not None:
                self._lc.llama_sampler_free(ptr)
                setattr(self, name, None)
        self._closed = True

    def __del__(self) -> None:  # a sequence cancelled mid-step still frees its grammar
        try:
            self.close()
        except Exception:  # noqa: BLE001 (interpreter shutdown)
            pass


def _common():
    """libggspec-common (patch 0017): an accept that refuses instead of throwing, the reasoning
    budget sampler."""
    from ggspec.native import bindings  # (loaded by then: a Grammar needs a loaded model)

    return bindings.common_library()


