"""A chat request -> its prompt, grammar and parser, as llama-server makes them.

A Jinja template (the model's own, a file, or chatml for a model without one) is rendered by
llama.cpp's own chat code through runtime.chat: tools, tool_choice, a JSON schema, reasoning
and the template's kwargs included, so the prompt, the tool-call grammar and the parser of the
answer are llama-server's (oaicompat_chat_params_parse, server-common.cpp). A built-in template
name other than chatml is rendered by `llama_chat_apply_template` (llama-server's --no-jinja
path): plain messages only.
"""

from __future__ import annotations

import ctypes
import json
from dataclasses import dataclass, replace
from pathlib import Path

from ggspec.errors import InputError
from ggspec.runtime.chat import (ChatParser, ChatPrompt, ChatTemplates, generation_prompt_ids, grammar_spec,
                                 preserved_ids, reasoning_budget)
from ggspec.runtime.grammar import GrammarSpec

REASONING_FORMAT = "deepseek"  # llama-server's default (common.h): thinking into reasoning_content
REASONING_FORMATS = ("none", "auto", "deepseek", "deepseek-legacy")


@dataclass(frozen=True)
class Reasoning:
    """The server's reasoning settings, which a request's own fields override (llama-server's
    --reasoning-format, --reasoning-budget, --reasoning-budget-message): how thinking is parsed
    out of an answer, and how many tokens a thinking block may hold (-1: no limit) before the
    message and the end tag are forced."""

    format: str = REASONING_FORMAT
    budget: int = -1
    message: str = ""

    def validate(self) -> None:
        if self.format not in REASONING_FORMATS:
            raise InputError(f"{self.format}: expected one of {', '.join(REASONING_FORMATS)}", field="reasoning_format")
        if self.budget < -1:
            raise InputError(f"the reasoning budget must be -1 (no limit) or at least 0 (got {self.budget})",
                             field="reasoning_budget")


def builtin_names(lc) -> list[str]:
    """llama.cpp's built-in template names."""
    n = lc.llama_chat_builtin_templates((ctypes.c_char_p * 1)(), 0)
    names = (ctypes.c_char_p * n)()
    lc.llama_chat_builtin_templates(names, n)
    return sorted(name.decode() for name in names)


@dataclass
class ChatJob:
    """What one chat request becomes: its prompt text, the grammar its answer follows (None:
    free), stop strings the template adds, tokens shown although special, and how to read
    the answer back (None: as plain text)."""

    prompt: str
    grammar: GrammarSpec | str | None
    stops: list[str]
    shown: frozenset[int]
    parser_params: dict | None

    def parser(self) -> ChatParser | None:
        return None if self.parser_params is None else ChatParser(self.parser_params)


class ChatTemplate:
    """`render(request)` gives a ChatJob; `source` says where the template came from (for
    /v1/models and the start-up line), `text` is the template itself (a built-in one's name)."""

    def __init__(self, model, name: str | None = None, path: Path | None = None,
                 reasoning: Reasoning = Reasoning()) -> None:
        """`model`: the target (runtime.Model); `name`: a llama.cpp built-in template;
        `path`: a Jinja template file. Neither: the model's own, else chatml."""
        self.reasoning = reasoning
        if name is not None and path is not None:
            raise InputError("give a built-in template name or a template file, not both", field="chat_template")
        self._lc, self._model = model.lc, model
        self.bos = self._special_text(self._lc.llama_vocab_bos(model.vocab))
        self.eos = self._special_text(self._lc.llama_vocab_eos(model.vocab))
        self._jinja: ChatTemplates | None = None
        self._builtin: str | None = None
        if path is not None:
            self._jinja = ChatTemplates(model, _read(path))
            self.source = f"file {path}"
        elif name is not None and name != "chatml":  # (llama-server renders "chatml" as its Jinja source)
            names = builtin_names(self._lc)
            if name not in names:
                raise InputError(f"unknown built-in chat template '{name}' (llama.cpp has: {', '.join(names)})",
                                 field="chat_template")
            self._builtin, self.source = name, f"built-in {name}"
        else:
            self._jinja = ChatTemplates(model, name)
            own = name is None and self._jinja.info["explicit"]
            self.source = ("the model's (GGUF tokenizer.chat_template)" if own
                           else "chatml (the model has no chat template; llama-server's)" if name is None
                           else "chatml (llama-server's)")
        # (llama-server's /props shows a built-in template by its name)
        self.text = self._jinja.source if self._jinja is not None else self._builtin
        self.supports_thinking = self._jinja is not None and self._jinja.info["supports_thinking"]

    @property
    def caps(self) -> dict[str, bool]:
        return {} if self._jinja is None else self._jinja.caps

    def _special_text(self, token: int) -> str:
        if token < 0:
            return ""
        text = self._lc.llama_vocab_get_text(self._model.vocab, token)
        return text.decode("utf-8", "replace") if text else ""

    def render(self, req) -> ChatJob:
        """A chat request (protocol.ChatRequest or ApplyTemplateRequest) as a ChatJob."""
        if self._jinja is None:
            return self._render_builtin(req)
        inputs, parse_tools = chat_inputs(req, self.caps, self.supports_thinking, self.reasoning.format)
        prompt = self._jinja.apply(inputs)
        grammar = self._with_budget(grammar_spec(self._model, prompt) or getattr(req, "grammar", None) or None,
                                    prompt, req)
        params = prompt.parser_params(inputs["reasoning_format"], parse_tools,
                                      is_continuation="continue_final_message" in inputs,
                                      reasoning_in_content=getattr(req, "stream", False)
                                      and inputs["reasoning_format"] == "deepseek-legacy")
        return ChatJob(prompt.prompt, grammar, list(prompt.additional_stops), preserved_ids(self._model, prompt),
                       params)

    def _with_budget(self, grammar: GrammarSpec | str | None, prompt: ChatPrompt, req) -> GrammarSpec | str | None:
        """The grammar with llama.cpp's reasoning budget over the template's thinking block, where
        llama-server makes one: the request's reasoning_budget_tokens (or thinking_budget_tokens),
        else the server's; the message likewise."""
        tokens = getattr(req, "reasoning_budget_tokens", None)
        tokens = getattr(req, "thinking_budget_tokens", None) if tokens is None else tokens
        tokens = self.reasoning.budget if tokens is None or tokens == -1 else tokens
        message = getattr(req, "reasoning_budget_message", None)
        lazy = isinstance(grammar, GrammarSpec) and grammar.lazy
        budget = reasoning_budget(self._model, prompt.thinking_start_tag, prompt.thinking_end_tags,
                                  self.reasoning.message if message is None else message, tokens, lazy,
                                  generation_prompt_ids(self._model, prompt),
                                  bool(getattr(req, "reasoning_control", False)))
        if budget is None:
            return grammar
        if isinstance(grammar, GrammarSpec):
            return replace(grammar, budget=budget)
        return GrammarSpec(grammar or "", budget=budget)

    def starts_with_bos(self, text: str) -> bool:
        """Whether the rendered text already holds the BOS token (then tokenizing adds none)."""
        return bool(self.bos) and text.startswith(self.bos)

    def _render_builtin(self, req) -> ChatJob:
        if getattr(req, "tools", None):
            raise InputError(f"tools need a Jinja chat template, not the built-in '{self._builtin}'", field="tools")
        lc = self._lc
        keep = [(m.role.encode(), (m.text or "").encode()) for m in req.messages]  # alive during the call
        chat = (lc.llama_chat_message * len(keep))(*[lc.llama_chat_message(r, c) for r, c in keep])
        size = 2 * sum(len(r) + len(c) for r, c in keep) + 256
        for _ in range(2):
            buf = ctypes.create_string_buffer(size)
            n = lc.llama_chat_apply_template(self._builtin.encode(), chat, len(keep), True, buf, size)
            if n < 0:
                raise InputError(f"llama.cpp's '{self._builtin}' chat template cannot render these messages",
                                 field="messages")
            if n <= size:
                text = buf.raw[:n].decode("utf-8", "replace")
                return ChatJob(text, getattr(req, "grammar", None), [], frozenset(), None)
            size = n  # the first call said how much room it needs
        raise InputError("the chat template's output did not fit its buffer", field="messages")


def chat_inputs(req, caps: dict[str, bool], supports_thinking: bool,
                default_format: str = REASONING_FORMAT) -> tuple[dict, bool]:
    """The inputs of common_chat_templates_apply for a request, decided as llama-server's
    oaicompat_chat_params_parse decides them, and whether tool calls are parsed out of the answer."""
    messages = [m.as_json() for m in req.messages]
    check_messages(messages)
    tools = list(getattr(req, "tools", None) or [])
    choice = getattr(req, "tool_choice", None) or "auto"
    if isinstance(choice, dict):  # OpenAI's named function: that tool, required (llama-server: auto)
        name = (choice.get("function") or {}).get("name")
        tools = [t for t in tools if (t.get("function") or {}).get("name") == name]
        if not tools:
            raise InputError(f"tool_choice names '{name}', which is not among the tools", field="tool_choice")
        choice = "required"
    grammar = getattr(req, "grammar", None)
    if tools and choice != "none" and grammar:
        raise InputError("Cannot use custom grammar constraints with tools.", field="grammar")
    inputs: dict = {"messages": messages, "tools": tools, "tool_choice": choice,
                    "add_generation_prompt": getattr(req, "add_generation_prompt", True),
                    "reasoning_format": getattr(req, "reasoning_format", None) or default_format,
                    "enable_thinking": supports_thinking}
    schema = req.wanted_schema() if hasattr(req, "wanted_schema") else None
    if schema is not None:
        inputs["json_schema"] = json.dumps(schema)
    if getattr(req, "parallel_tool_calls", None) is not None:
        inputs["parallel_tool_calls"] = req.parallel_tool_calls
    continuation = getattr(req, "continue_final_message", None)
    if continuation is True or continuation in ("content", "reasoning_content"):  # (common_chat_continuation_parse)
        inputs["continue_final_message"] = continuation
    elif messages[-1]["role"] == "assistant":  # llama-server's prefill_assistant: the answer goes on
        if len(messages) >= 2 and messages[-2]["role"] == "assistant":
            raise InputError("Cannot have 2 or more assistant messages at the end of the list.", field="messages")
        inputs["continue_final_message"], inputs["add_generation_prompt"] = True, False
    if "continue_final_message" in inputs:
        if inputs["add_generation_prompt"]:
            raise InputError("Cannot set both add_generation_prompt and continue_final_message to true.",
                             field="continue_final_message")
        if messages[-1]["role"] == "assistant" and messages[-1].get("tool_calls"):
            raise InputError("Cannot continue an assistant message that contains tool calls.", field="messages")
    kwargs = {k: json.dumps(v) for k, v in (getattr(req, "chat_template_kwargs", None) or {}).items()}
    thinking = kwargs.get("enable_thinking")
    if thinking in ("true", "false"):
        inputs["enable_thinking"] = thinking == "true"
    elif thinking is not None and thinking.startswith('"'):
        raise InputError('invalid type for "enable_thinking" (expected boolean, got string)',
                         field="chat_template_kwargs")
    effort = getattr(req, "reasoning_effort", None)
    if effort == "none":
        inputs["enable_thinking"] = False
        kwargs.pop("reasoning_effort", None)
    elif effort:
        kwargs["reasoning_effort"] = json.dumps(effort)
    inputs["chat_template_kwargs"] = kwargs
    return inputs, bool(tools) and choice != "none"


def check_messages(messages: list[dict]) -> None:
    """llama-server's checks of a message list, before the template sees it."""
    for m in messages:
        if m["role"] != "assistant" and "content" not in m:
            raise InputError("All non-assistant messages must contain 'content'", field="messages")
        if m["role"] == "assistant" and "content" not in m and "tool_calls" not in m:
            raise InputError("Assistant message must contain either 'content' or 'tool_calls'!", field="messages")


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read the chat template file {path}: {getattr(exc, 'strerror', None) or exc}",
                         field="chat_template_file") from None
