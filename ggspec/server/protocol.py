"""OpenAI's request bodies, validated, and the bodies and stream chunks of the answers.

Requests are parsed from the raw JSON (pydantic, strict types): a field of the wrong type or a
value out of range is a 400 naming the field, never a 500. Fields the server does not know are
ignored, as llama-server and other OpenAI-compatible servers do. Features of the APIs that
ggspec does not implement yet (best_of, echo) are accepted only at their no-op values, so a
request is never silently answered as something else.

Chat requests (messages, tools, tool_choice, reasoning, the template's kwargs) go to llama.cpp's
own chat code (chat.py): the prompt, the tool-call grammar and the parsed answer are
llama-server's.

Constrained output (`grammar`, `json_schema`, `response_format`) becomes one GBNF grammar
(service.py), which llama.cpp's grammar sampler enforces on every verified row.

Speculation per request (ggspec's, in llama-server's names): `"speculative": false` decodes it
plainly; `speculative.n_max` / `speculative.n_min` bound its drafts within the server's;
`speculative.p_min` is its drafts' confidence cut-off; `speculative.type` names the types that
draft for it (one, or a comma list): the server's own, or any n-gram type (held on standby), or
"none".
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

MAX_STOPS = 4  # as OpenAI
# request fields an InputError of the engine or the chat template may name (the 400's `param`;
# the command line's flags never see these), by the engine's name where it differs
REQUEST_PARAMS = {"prompt": "prompt", "messages": "messages", "max_tokens": "max_tokens", "temp": "temperature",
                  "top_p": "top_p", "min_p": "min_p", "seed": "seed", "n_max": "speculative.n_max",
                  "n_min": "speculative.n_min", "p_min": "speculative.p_min", "spec_type": "speculative.type",
                  "grammar": "grammar", "content": "content", "n_probs": "n_probs",
                  "penalty_last_n": "repeat_last_n", "penalty_repeat": "repeat_penalty",
                  "penalty_freq": "frequency_penalty", "penalty_present": "presence_penalty",
                  "json_schema": "json_schema", "tools": "tools", "tool_choice": "tool_choice",
                  "chat_template_kwargs": "chat_template_kwargs",
                  "continue_final_message": "continue_final_message", "reasoning_budget": "reasoning_budget_tokens",
                  "reasoning_format": "reasoning_format", "t_max_predict_ms": "t_max_predict_ms"}
INT32_MAX = 2**31 - 1
SEED_MAX = 0xFFFFFFFE  # llama.cpp's seeds are uint32; 0xFFFFFFFF means "random" there
# fields accepted only at their no-op value: a 400 says so for any other
NOT_YET = frozenset({"best_of", "echo", "suffix", "repeat_penalty", "typical_p", "mirostat", "n_probs",
                     "dry_multiplier", "xtc_probability", "n_cmpl"})


class Body(BaseModel):
    """A request body: strict types, unknown fields ignored, numbers finite."""

    model_config = ConfigDict(extra="ignore", strict=True, populate_by_name=True, allow_inf_nan=False)


def _not_json(name: str):
    raise ValueError(f"{name} is not JSON")


def check_json(raw: bytes) -> None:
    """ValueError where a body is not strict JSON in a way the fast parser lets through: the
    literals NaN and Infinity (JavaScript's, not JSON's: llama-server refuses such a body) and
    nesting too deep to read. Only bodies holding those words pay for the second parse."""
    if b"NaN" in raw or b"Infinity" in raw:
        loads(raw)


def loads(raw: bytes):
    """A body parsed as strict JSON: ValueError for NaN / Infinity and for nesting too deep."""
    try:
        return json.loads(raw, parse_constant=_not_json)
    except RecursionError:
        raise ValueError("it is nested too deeply") from None


class StreamOptions(Body):
    include_usage: bool = False


class SchemaFormat(Body):
    name: str | None = None
    schema_: dict[str, Any] = Field(default_factory=dict, alias="schema")
    strict: bool | None = None


class ResponseFormat(Body):
    """OpenAI's response_format: text, any JSON object, or JSON following a schema (llama-server
    also takes the schema beside the type)."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: SchemaFormat | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")

    def wanted_schema(self) -> dict | None:
        """The JSON schema the answer must follow (None: free text)."""
        if self.type == "text":
            return None
        if self.type == "json_schema" and self.json_schema is not None and self.json_schema.schema_:
            return self.json_schema.schema_
        return self.schema_ or {"type": "object"}  # (an empty schema means any object, as llama-server)


class Constrained(Body):
    """Grammar-constrained output: a GBNF `grammar`, a `json_schema`, or a `response_format`."""

    grammar: str | None = None  # llama.cpp's extension
    json_schema: dict[str, Any] | None = None  # llama.cpp's extension
    response_format: ResponseFormat | None = None
    # llama-server's reasoning budget (a chat request takes its tags from the template)
    reasoning_budget_tokens: Annotated[int, Field(ge=-1, le=INT32_MAX)] | None = None  # -1: the server's
    reasoning_budget_start_tag: str | None = None
    reasoning_budget_end_tags: list[str] | None = None
    reasoning_budget_end_tag: str | None = None
    reasoning_budget_message: str | None = None

    @property
    def end_tags(self) -> list[str] | None:
        """The budget's end tags (llama-server: the list wins over the single tag)."""
        if self.reasoning_budget_end_tags is not None:
            return self.reasoning_budget_end_tags
        return None if self.reasoning_budget_end_tag is None else [self.reasoning_budget_end_tag]

    @field_validator("json_schema")
    @classmethod
    def _one_constraint(cls, v, info):
        if v is not None and info.data.get("grammar"):
            raise ValueError("give a grammar or a json_schema, not both")
        return v

    def wanted_schema(self) -> dict | None:
        if self.json_schema is not None:
            return self.json_schema or {"type": "object"}
        return None if self.response_format is None else self.response_format.wanted_schema()


class Speculation(Body):
    """Speculation per request (module docstring)."""

    speculative: bool | None = None
    n_max: Annotated[int, Field(ge=0)] | None = Field(None, alias="speculative.n_max")
    n_min: Annotated[int, Field(ge=0)] | None = Field(None, alias="speculative.n_min")
    p_min: Annotated[float, Field(ge=0.0, le=1.0)] | None = Field(None, alias="speculative.p_min")
    spec_type: str | None = Field(None, alias="speculative.type")


Bias = float | bool  # llama-server's: false means never this token


class Penalties(Body):
    """llama.cpp's logit bias and repetition penalties (OpenAI's presence / frequency penalties,
    llama-server's repeat_penalty and repeat_last_n); None: the server's."""

    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repeat_penalty: Annotated[float, Field(ge=0.0)] | None = None
    repeat_last_n: Annotated[int, Field(ge=-1)] | None = None
    # OpenAI's {"token id": bias}, or llama-server's [[token id or text, bias], ...]
    logit_bias: dict[str, Bias] | list[tuple[int | str, Bias]] | None = None


class Generation(Body):
    """Per-request options that reach the engine's Request as they are (`request_fields`): a new
    one is its field here, its field and check in speculative/request.py, and where it acts."""

    ignore_eos: bool = False  # llama.cpp's extension: generate max_tokens whatever the tokens are
    # llama.cpp's extension: False decodes the whole prompt (a cached prompt's last token is decoded
    # alone, and llama.cpp's arithmetic depends on the batch: the text can differ, as in llama-server)
    cache_prompt: bool = True
    # llama-server's: once a line has ended, stop when this many ms have passed since the first
    # token (<= 0: no limit; for code completion)
    t_max_predict_ms: int = -1

    def request_fields(self) -> dict:
        """These options as the engine's Request names them."""
        return {"ignore_eos": self.ignore_eos, "cached": self.cache_prompt, "t_max_predict_ms": self.t_max_predict_ms}


class Sampling(Speculation, Constrained, Penalties, Generation):
    """Fields both OpenAI endpoints take."""

    model: str | None = None
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    top_k: int | None = None  # llama.cpp's extension (<= 0: the whole vocabulary)
    min_p: Annotated[float, Field(ge=0.0, le=1.0)] | None = None  # llama.cpp's extension
    seed: Annotated[int, Field(ge=0, le=SEED_MAX)] | None = None
    stop: str | Annotated[list[str], Field(max_length=MAX_STOPS)] | None = None
    n: Annotated[int, Field(ge=1, le=16)] = 1  # completions of the prompt, each its own sequence
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None  # OpenAI's end-user id: accepted, unused

    @property
    def stops(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class CompletionRequest(Sampling):
    prompt: str | Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)] | Annotated[
        list[str], Field(min_length=1, max_length=1)]
    echo: Literal[False] = False
    best_of: Literal[1] = 1
    logprobs: Annotated[int, Field(ge=0, le=20)] | None = None  # the likeliest n per token

    @property
    def n_probs(self) -> int:
        return 0 if self.logprobs is None else max(self.logprobs, 1)

    @property
    def top_n(self) -> int:
        return self.logprobs or 0
    suffix: None = None


class ContentPart(Body):
    type: Literal["text"]
    text: str


class ChatMessage(Body):
    """One message of OpenAI's chat API: a tool's result (role "tool") and an assistant's tool
    calls included; llama.cpp's chat code reads the rest of its shape."""

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None

    @property
    def text(self) -> str:
        if self.content is None:
            return ""
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)

    def as_json(self) -> dict:
        """The message as sent (fields left out stay out: llama-server tells them apart)."""
        return self.model_dump(mode="json", exclude_unset=True)


class ChatFields(Body):
    """What a chat template is rendered from (/v1/chat/completions, /apply-template)."""

    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    tools: list[dict[str, Any]] | None = None
    # "none" / "auto" / "required", or OpenAI's {"type": "function", "function": {"name": ...}}
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    reasoning_format: Literal["none", "auto", "deepseek", "deepseek-legacy"] | None = None
    reasoning_effort: str | None = None
    thinking_budget_tokens: Annotated[int, Field(ge=-1, le=INT32_MAX)] | None = None  # (reasoning_budget_tokens')
    reasoning_control: bool = False  # its thinking may be ended by POST /v1/chat/completions/control
    add_generation_prompt: bool = True
    continue_final_message: bool | str | None = None


class ChatRequest(Sampling, ChatFields):
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    logprobs: bool | None = None
    top_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None

    @field_validator("top_logprobs")
    @classmethod
    def _needs_logprobs(cls, v, info):
        if v is not None and not info.data.get("logprobs"):
            raise ValueError("top_logprobs requires logprobs to be set to true")  # (llama-server's words)
        return v

    @property
    def n_probs(self) -> int:
        return max(self.top_logprobs or 0, 1) if self.logprobs else 0

    @property
    def top_n(self) -> int:
        return self.top_logprobs or 0

    @field_validator("max_completion_tokens")
    @classmethod
    def _one_limit(cls, v, info):
        if v is not None and info.data.get("max_tokens") is not None:
            raise ValueError("give max_tokens or max_completion_tokens, not both")
        return v

    @property
    def limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


def validation_message(exc: ValidationError) -> tuple[str, str | None]:
    """The first problem of a failed validation as (one line, the parameter's name)."""
    errors = exc.errors(include_url=False)
    # a union (prompt, stop) reports every branch: the one that got furthest says what is wrong
    e = min(errors, key=lambda e: (e["type"].endswith("_type"), -len(e["loc"])))
    loc = ".".join(str(p) for p in e["loc"] if not isinstance(p, str) or not p.startswith(("function-", "list[",
                                                                                           "str", "int", "literal",
                                                                                           "constrained-", "union[")))
    if e["type"] == "json_invalid":
        return f"the body is not valid JSON: {e['msg'].removeprefix('Invalid JSON: ')}", None
    if e["type"] == "extra_forbidden":
        return f"unknown or unsupported parameter '{loc}'", loc or None
    if e["type"] == "missing":
        return f"'{loc}' is required", loc or None
    if e["type"] in ("model_type", "model_attributes_type") and not loc:
        return "the body must be a JSON object", None
    msg = e["msg"].removeprefix("Value error, ")
    if e["type"] == "too_long" and loc == "prompt":
        msg = "one prompt per request (n = 1)"
    if loc.split(".")[0] in NOT_YET and e["type"] in ("literal_error", "too_long", "none_required", "model_type",
                                                       "model_attributes_type", "missing", "extra_forbidden"):
        msg = f"not supported by this server yet (only its no-op value: {msg[0].lower() + msg[1:]})"
    return f"'{loc}': {msg}" if loc else msg, loc or None


# --- answers ---------------------------------------------------------------------------------------


def error_body(status: int, message: str, kind: str, param: str | None = None, **extra) -> dict:
    """llama-server's error body (its `code` is the HTTP status), with the field at fault as
    OpenAI's `param` and any extra fields (a context overflow's n_prompt_tokens and n_ctx)."""
    return {"error": {"code": status, "message": message, "type": kind, "param": param, **extra}}


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def usage(n_prompt: int, stats, n_cached: int | None = None) -> dict:
    """OpenAI's usage (cached_tokens: prompt tokens the prompt cache held) plus the request's
    speculative figures: drafted and accepted draft tokens, speculative steps and τ (tokens
    committed per speculative step). Several completions: their statistics merged, the prompt
    (and what the cache held of it) counted once."""
    cached = stats.n_cached if n_cached is None else n_cached
    return {"prompt_tokens": n_prompt, "completion_tokens": stats.n_generated,
            "total_tokens": n_prompt + stats.n_generated, "prompt_tokens_details": {"cached_tokens": cached},
            "draft_tokens": stats.drafted, "accepted_tokens": stats.accepted, "spec_steps": stats.spec_steps,
            "tau": round(stats.tau, 4)}


def timings(stats) -> dict:
    """llama-server's `timings` of one request (server_slot_stats::to_json): its prompt (cached
    tokens apart) and its generation after the first token, with draft_n / draft_n_accepted once
    it drafted."""
    n_prompt = stats.n_prompt - stats.n_cached
    prompt_ms, gen_ms = stats.t_prompt * 1e3, stats.t_decode * 1e3
    out = {"cache_n": stats.n_cached, "prompt_n": n_prompt, "prompt_ms": prompt_ms,
           "prompt_per_token_ms": prompt_ms / n_prompt if n_prompt else 0.0,
           "prompt_per_second": 1e3 * n_prompt / prompt_ms if prompt_ms > 0 else 0.0,
           "predicted_n": stats.n_generated, "predicted_ms": gen_ms,
           "predicted_per_token_ms": gen_ms / stats.n_decoded if stats.n_decoded else 0.0,
           "predicted_per_second": 1e3 * stats.n_decoded / gen_ms if gen_ms > 0 else 0.0}
    if stats.drafted:
        out.update(draft_n=stats.drafted, draft_n_accepted=stats.accepted)
    return out


def sse(obj) -> bytes:
    """One server-sent event carrying a JSON object."""
    return b"data: " + json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


_MARK = "\x00ggspec-text\x00"  # stands for a chunk's text while its event is rendered once


class Shape:
    """The fixed parts of one response (id, object names, model, creation time) for one endpoint."""

    def __init__(self, chat: bool, model: str) -> None:
        self.chat, self.model = chat, model
        self.id = new_id("chatcmpl" if chat else "cmpl")
        self.created = int(time.time())
        # a text chunk's event is the same bytes each time but for the text: rendered once here,
        # split where the text goes (a streamed answer sends one per engine step)
        head, mark, tail = sse(self.chunk(_MARK)).partition(json.dumps(_MARK, ensure_ascii=False).encode())
        self._text_event = (head, tail) if mark else None

    def text_event(self, text: str) -> bytes:
        """`sse(self.chunk(text))`, without building and encoding the whole object."""
        if self._text_event is None:
            return sse(self.chunk(text))
        head, tail = self._text_event
        return head + json.dumps(text, ensure_ascii=False).encode() + tail

    def _head(self, obj: str) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def choice(self, index: int, text: str, finish: str, logprobs: list | None = None,
               message: dict | None = None) -> dict:
        """One whole choice (`logprobs` in llama-server's form, on both endpoints; a chat
        answer's `message` as its template's parser read it)."""
        lp = None if logprobs is None else {"content": logprobs}
        if self.chat:
            return {"index": index, "message": message or {"role": "assistant", "content": text}, "logprobs": lp,
                    "finish_reason": finish}
        return {"index": index, "text": text, "logprobs": lp, "finish_reason": finish}

    def whole(self, choices: list[dict], use: dict, times: dict) -> dict:
        obj = "chat.completion" if self.chat else "text_completion"
        return {**self._head(obj), "choices": choices, "usage": use, "timings": times}

    def chunk(self, text: str | None, finish: str | None = None, *, role: bool = False,
              logprobs: list | None = None, index: int = 0) -> dict:
        lp = None if logprobs is None else {"content": logprobs}
        if self.chat:
            delta = {"role": "assistant", "content": ""} if role else ({} if text is None else {"content": text})
            choice = {"index": index, "delta": delta, "logprobs": lp, "finish_reason": finish}
            return {**self._head("chat.completion.chunk"), "choices": [choice]}
        choice = {"index": index, "text": text or "", "logprobs": lp, "finish_reason": finish}
        return {**self._head("text_completion"), "choices": [choice]}

    def delta_chunk(self, delta: dict, index: int = 0) -> dict:
        """A chat chunk carrying one parser delta (content, reasoning_content or a tool call's part)."""
        choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": None}
        return {**self._head("chat.completion.chunk"), "choices": [choice]}

    def usage_chunk(self, use: dict) -> dict:
        return {**self._head("chat.completion.chunk" if self.chat else "text_completion"), "choices": [],
                "usage": use}
