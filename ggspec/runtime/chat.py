"""llama.cpp's own chat code (common/chat), owned: what llama-server does with a chat request.

`ChatTemplates(model)` loads the model's Jinja templates (or a given source) with llama.cpp's
Jinja engine; `apply(request)` renders OpenAI-style messages with tools, a tool choice or a JSON
schema into a `ChatPrompt`: the prompt text, and the grammar (lazy, woken by its triggers) that
keeps tool calls and structured output well formed. `ChatParser` reads an answer's text back
into OpenAI's message (content, reasoning_content, tool_calls), again and again as text
arrives, with the deltas a stream sends. `json_schema_to_grammar` is llama.cpp's converter.

All of it goes through libggspec-common (patch 0017), so ggspec and llama-server of the same build
render, constrain and parse alike. The library speaks JSON text; a failure comes back as one
line and is raised here as a ChatError.
"""

from __future__ import annotations

import ctypes
import json
import re
from dataclasses import dataclass, field

from ggspec.errors import InputError
from ggspec.native import bindings
from ggspec.runtime.grammar import GrammarSpec, ReasoningBudget

# common_grammar_trigger_type (common/common.h)
TRIGGER_TOKEN, TRIGGER_WORD, TRIGGER_PATTERN, TRIGGER_PATTERN_FULL = range(4)


class ChatError(InputError):
    """llama.cpp's chat code refused a request (a template error, a malformed message or tool)."""


def _result(address: int | None) -> dict:
    """The JSON object a library call returned (its text freed), or its error raised."""
    lib = bindings.common_library()
    if not address:
        raise ChatError("the chat library returned nothing (out of memory?)")
    try:
        out = json.loads(ctypes.string_at(address).decode("utf-8", "replace"))
    finally:
        lib.ggspec_chat_string_free(address)
    if "error" in out:
        raise ChatError(out["error"], field="messages")
    return out


def _taken_error(err: ctypes.c_void_p) -> str:
    if not err.value:
        return "unknown error"
    try:
        return ctypes.string_at(err.value).decode("utf-8", "replace")
    finally:
        bindings.common_library().ggspec_chat_string_free(err.value)


def _one_line(message: str) -> str:
    """llama.cpp's Jinja errors quote the template over several lines: their `Error:` line."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    said = [line.removeprefix("Error: ") for line in lines if line.startswith("Error: ")]
    return said[-1] if said else (lines[0] if lines else "unknown error")


@dataclass(frozen=True)
class ChatPrompt:
    """A rendered chat request (common_chat_params): the prompt and what sampling and parsing
    need for it."""

    prompt: str
    format: int = 0
    format_name: str = "Content-only"
    grammar: str = ""
    grammar_lazy: bool = False
    grammar_triggers: list[dict] = field(default_factory=list)
    preserved_tokens: list[str] = field(default_factory=list)
    additional_stops: list[str] = field(default_factory=list)
    generation_prompt: str = ""
    parser: str = ""
    supports_thinking: bool = False
    thinking_start_tag: str = ""
    thinking_end_tags: list[str] = field(default_factory=list)

    def parser_params(self, reasoning_format: str, parse_tool_calls: bool, is_continuation: bool = False,
                      reasoning_in_content: bool = False) -> dict:
        """What a ChatParser of this prompt's answers needs (llama-server's chat_parser_params)."""
        return {"format": self.format, "reasoning_format": reasoning_format, "generation_prompt": self.generation_prompt,
                "parse_tool_calls": parse_tool_calls, "is_continuation": is_continuation, "parser": self.parser,
                "reasoning_in_content": reasoning_in_content}


class _Freed:
    """A handle of the shim's chat library (`_ptr`), freed once: by close() or at garbage
    collection; `_free` names the library's function that frees it."""

    _free = ""
    _ptr = None

    def close(self) -> None:
        if self._ptr:
            getattr(self._lib, self._free)(self._ptr)
            self._ptr = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 (interpreter shutdown)
            pass


class ChatTemplates(_Freed):
    """A model's chat templates in llama.cpp's Jinja engine (`source`: a template's text instead)."""

    _free = "ggspec_chat_templates_free"

    def __init__(self, model, source: str | None = None) -> None:
        lib = bindings.common_library()
        err = ctypes.c_void_p()
        ptr = lib.ggspec_chat_templates_init(model.ptr, (source or "").encode("utf-8"), ctypes.byref(err))
        if not ptr:
            raise ChatError(f"llama.cpp cannot read this chat template: {_taken_error(err)}", field="chat_template")
        self._ptr, self._lib = ptr, lib
        self.info = _result(lib.ggspec_chat_templates_info(ptr))

    @property
    def source(self) -> str:
        return self.info["source"]

    @property
    def caps(self) -> dict[str, bool]:
        return self.info["caps"]

    def apply(self, request: dict) -> ChatPrompt:
        """`request`: messages (OpenAI's), tools, tool_choice, json_schema (text), grammar,
        parallel_tool_calls, add_generation_prompt, continue_final_message, reasoning_format,
        enable_thinking, chat_template_kwargs ({key: JSON text}); see patch 0017."""
        try:
            out = _result(self._lib.ggspec_chat_apply(self._ptr, json.dumps(request).encode("utf-8")))
        except ChatError as exc:
            raise ChatError(f"the chat template refused these messages: {_one_line(str(exc))}",
                            field="messages") from None
        return ChatPrompt(**out)



class ChatParser(_Freed):
    """One answer's text read back as OpenAI's message, as llama-server's task_result_state."""

    _free = "ggspec_chat_stream_free"

    def __init__(self, params: dict) -> None:
        lib = bindings.common_library()
        err = ctypes.c_void_p()
        ptr = lib.ggspec_chat_stream_init(json.dumps(params).encode("utf-8"), ctypes.byref(err))
        if not ptr:
            raise ChatError(f"cannot read this chat parser: {_taken_error(err)}")
        self._ptr, self._lib = ptr, lib
        self.message: dict = {"role": "assistant", "content": ""}

    def update(self, text: str, partial: bool) -> list[dict]:
        """Adds `text` to the answer; the stream deltas it makes (OpenAI's chunk deltas). The
        message so far is `self.message`."""
        out = _result(self._lib.ggspec_chat_stream_update(self._ptr, text.encode("utf-8"), partial))
        if out["message"].get("role"):
            self.message = out["message"]
        return out["deltas"]



def json_schema_to_grammar(schema: dict) -> str:
    """llama.cpp's converter of a JSON schema to GBNF (common/json-schema-to-grammar.cpp)."""
    lib = bindings.common_library()
    try:
        return _result(lib.ggspec_json_schema_to_grammar(json.dumps(schema).encode("utf-8")))["grammar"]
    except ChatError as exc:
        raise ChatError(f"cannot turn this JSON schema into a grammar: {exc}", field="json_schema") from None


_REGEX_SPECIAL = re.compile(r"[.^$|()*+?\[\]{}\\]")


def regex_escape(text: str) -> str:
    """common's regex_escape: llama.cpp's own escaping of a trigger word."""
    return _REGEX_SPECIAL.sub(lambda m: "\\" + m.group(0), text)


def preserved_ids(model, prompt: ChatPrompt) -> frozenset[int]:
    """The preserved tokens that are one token each: their text is kept in the answer (special
    tokens are otherwise not shown), as llama-server."""
    ids = (model.tokenize(t, add_special=False, parse_special=True) for t in prompt.preserved_tokens)
    return frozenset(int(i[0]) for i in ids if len(i) == 1)


def grammar_spec(model, prompt: ChatPrompt) -> GrammarSpec | None:
    """The grammar sampler a rendered chat request asks for, built as llama-server builds it
    (server-schema.cpp's grammar_triggers, common/sampling.cpp): a trigger word that is one
    preserved token triggers on that token; the template's generation prompt is fed to a grammar
    that is not lazy, so it starts past what the template already wrote."""
    if not prompt.grammar:
        return None
    preserved = preserved_ids(model, prompt)
    patterns, tokens = [], []
    for t in prompt.grammar_triggers:
        kind, value = t["type"], t["value"]
        if kind == TRIGGER_WORD:
            ids = model.tokenize(value, add_special=False, parse_special=True)
            if len(ids) == 1:
                if int(ids[0]) not in preserved:
                    raise ChatError(f"grammar trigger word should be marked as preserved token: {value}")
                tokens.append(int(ids[0]))
            else:
                patterns.append(regex_escape(value))
        elif kind == TRIGGER_PATTERN:
            patterns.append(value)
        elif kind == TRIGGER_PATTERN_FULL:
            anchored = "^$" if not value else ("" if value[0] == "^" else "^") + value + ("" if value[-1] == "$" else "$")
            patterns.append(anchored)
        elif kind == TRIGGER_TOKEN:
            tokens.append(int(t["token"]))
    if prompt.grammar_lazy and not patterns and not tokens:
        raise ChatError("no triggers set for lazy grammar")
    prefill = generation_prompt_ids(model, prompt) if not prompt.grammar_lazy else ()
    return GrammarSpec(prompt.grammar, lazy=prompt.grammar_lazy, trigger_patterns=tuple(patterns),
                       trigger_tokens=tuple(tokens), prefill=prefill)


def generation_prompt_ids(model, prompt: ChatPrompt) -> tuple[int, ...]:
    """The template's generation prompt as the tokens common_sampler_init feeds its samplers."""
    if not prompt.generation_prompt:
        return ()
    ids = model.tokenize(prompt.generation_prompt, add_special=False, parse_special=True).tolist()
    # some tokenizers put a space before the first special token: not part of the prompt
    if ids and model.special_piece(ids[0])[:1].isspace() and not prompt.generation_prompt[0].isspace():
        ids = ids[1:]
    return tuple(ids)


def reasoning_budget(model, start: str | None, ends: list[str] | None, message: str | None, tokens: int,
                     lazy: bool, prefill: tuple[int, ...] = (), control: bool = False) -> ReasoningBudget | None:
    """llama.cpp's reasoning budget for a request, as llama-server makes it (server-schema.cpp's
    reasoning_budget_* handlers, common_sampler_init): the tags tokenized with special tokens
    parsed; forced, the message then the first end tag, only where a message field was given
    (None: nothing is forced, llama-server's handler does not run); made only where both tags
    exist and a budget is set (`tokens` >= 0), a lazy grammar needs the thinking block held back
    or the request may end its thinking from outside (`control`: reasoning_control). None: no budget."""
    def tok(text: str) -> tuple[int, ...]:
        return tuple(model.tokenize(text, add_special=False, parse_special=True).tolist())

    start_ids = tok(start) if start else ()
    end_ids = tuple(tok(e) for e in ends or () if e)
    if not start_ids or not end_ids or not (lazy or tokens >= 0 or control):
        return None
    forced = () if message is None else tok(message) + end_ids[0] if message else end_ids[0]
    return ReasoningBudget(start_ids, end_ids, forced, tokens, prefill)
