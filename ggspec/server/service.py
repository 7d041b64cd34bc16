"""What every route shares: the Service (scheduler, template, defaults), admission, and errors.

Errors leave in llama-server's body, `{"error": {"code": <HTTP status>, "message", "type"}}`, with
the request field at fault added as `param` (OpenAI's name for it): a client written for either
server reads it. A request is admitted here, on the event loop, before it reaches the engine: a
bad body, an unknown model or a prompt that cannot fit its slot is a 4xx, a full queue a 503.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass, field, replace

import numpy as np
from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse

from ggspec.errors import InputError
from ggspec.runtime.chat import ChatError, json_schema_to_grammar, reasoning_budget
from ggspec.runtime.grammar import Grammar, GrammarSpec
from ggspec.server import protocol as p
from ggspec.server.chat import ChatJob, ChatTemplate
from ggspec.server.metrics import Metrics
from ggspec.server.scheduler import Done, Failed, Scheduler, Tokens
from ggspec.server.text import TextStream
from ggspec.speculative.types import registry
from ggspec.speculative.sampling import SamplerSettings
from ggspec.speculative import request as engine_request
from ggspec.speculative.request import DraftLimits

# llama-server's error types by HTTP status (server-common.cpp, format_error_response)
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 500: "server_error", 501: "not_supported_error", 503: "unavailable_error"}
CONTEXT_ERROR = "exceed_context_size_error"
DISCONNECT_POLL = 0.25  # seconds between checks for a vanished client while a whole answer is made


class ApiError(Exception):
    """An answer other than 200: status, one line, the field at fault, and extra error fields."""

    def __init__(self, status: int, message: str, param: str | None = None, kind: str | None = None,
                 **extra) -> None:
        super().__init__(message)
        self.status, self.message, self.param = status, message, param
        self.kind = kind or ERROR_TYPES.get(status, "server_error")
        self.extra = extra

    def response(self) -> JSONResponse:
        return JSONResponse(p.error_body(self.status, self.message, self.kind, self.param, **self.extra),
                            status_code=self.status)


def parse(model: type[BaseModel], raw: bytes):
    """A request body as `model`, or a 400 naming the field at fault."""
    try:
        p.check_json(raw)
    except ValueError as exc:
        raise ApiError(400, f"the body is not valid JSON: {exc}") from None
    try:
        return model.model_validate_json(raw or b"null")
    except ValidationError as exc:
        message, param = p.validation_message(exc)
        raise ApiError(400, message, param) from None


def tokenize_mixed(model, prompt: str | list, add_special: bool, parse_special: bool, field: str = "prompt") -> np.ndarray:
    """Text, token ids, or a list mixing both, as llama-server's tokenize_mixed: only a text
    that comes first gets the BOS token (`add_special`); ids outside the vocabulary are a 400."""
    if isinstance(prompt, str):
        return model.tokenize(prompt, add_special=add_special, parse_special=parse_special)
    out: list[int] = []
    for i, part in enumerate(prompt):
        if isinstance(part, str):
            out += model.tokenize(part, add_special=add_special and i == 0, parse_special=parse_special).tolist()
        elif not 0 <= part < model.n_vocab:
            raise ApiError(400, f"token id {part} is outside the vocabulary (0..{model.n_vocab - 1})", field)
        else:
            out.append(part)
    return np.asarray(out, dtype=np.int32)


@dataclass
class Service:
    """What the routes need: the scheduler, the model's names and template, request defaults."""

    scheduler: Scheduler
    template: ChatTemplate
    model_id: str
    sampling: SamplerSettings  # for fields a request leaves out (the server's --temp, --top-k, ...)
    metrics: Metrics
    info: dict  # /v1/models "meta" and /props "speculative": the pair and its settings
    # chat completions in progress by id, and whether each may have its thinking ended from outside
    # (reasoning_control): what POST /v1/chat/completions/control looks up
    live: dict[str, tuple[list, bool]] = field(default_factory=dict)

    @property
    def engine(self):
        return self.scheduler.engine

    # --- admission -------------------------------------------------------------------------------

    def check_model(self, name: str | None) -> None:
        if name is not None and name != self.model_id:
            raise ApiError(404, f"the model '{name}' does not exist here: this server has '{self.model_id}'",
                           "model")

    def settings(self, req: p.Sampling) -> SamplerSettings:
        given = {"temp": req.temperature, "top_p": req.top_p, "top_k": req.top_k, "min_p": req.min_p,
                 "penalty_repeat": req.repeat_penalty, "penalty_last_n": req.repeat_last_n,
                 "penalty_freq": req.frequency_penalty, "penalty_present": req.presence_penalty}
        settings = replace(self.sampling, **{k: v for k, v in given.items() if v is not None})
        if req.logit_bias:
            settings = replace(settings, logit_bias=self.logit_bias(req.logit_bias))
        return settings

    def logit_bias(self, given: dict | list) -> tuple[tuple[int, float], ...]:
        """(token, bias) pairs from OpenAI's {"id": bias} or llama-server's [[id or text, bias]]
        (a text biases each of its tokens; a bias of false forbids the token)."""
        model = self.engine.target_model
        pairs = given.items() if isinstance(given, dict) else given
        out = []
        for key, bias in pairs:
            value = -math.inf if bias is False else 0.0 if bias is True else float(bias)
            if isinstance(key, str) and not key.lstrip("-").isdigit():
                ids = model.tokenize(key, add_special=False, parse_special=False).tolist()
            else:
                ids = [int(key)]
            for t in ids:
                if not 0 <= t < model.n_vocab:
                    raise ApiError(400, f"token id {t} is outside the vocabulary (0..{model.n_vocab - 1})", "logit_bias")
                out.append((t, value))
        return tuple(out)

    def speculation(self, req: p.Speculation) -> tuple[bool, DraftLimits | None]:
        """Whether a request speculates, and its own speculation (None: the server's): its draft
        lengths, confidence cut-off and the types that draft for it (any the server holds: its
        own and the n-gram types on standby)."""
        eng = self.engine
        kind = req.spec_type
        if req.speculative is False or kind == "none":
            return False, None
        types = None
        if kind is not None:
            try:
                types = registry.spec_types(kind)
            except InputError as exc:
                raise ApiError(400, str(exc), "speculative.type") from None
            held = eng.request_types
            if not set(types) <= set(held):
                have = f"drafts with {', '.join(held)}" if held else "does not speculate (it was started plain)"
                raise ApiError(400, f"this server {have}: a request may name those or 'none', not '{kind}'",
                               "speculative.type")
            types = None if types == eng.plan.kinds else types
        if req.n_max is None and req.n_min is None and req.p_min is None and types is None:
            return True, None
        if not eng.speculative and req.n_max:
            raise ApiError(400, "this server does not speculate (it was started plain)", "speculative.n_max")
        return True, DraftLimits(eng.n_max if req.n_max is None else req.n_max, req.n_min or 0, req.p_min, types)

    def tokens(self, prompt) -> np.ndarray:
        """A prompt's tokens: text (special tokens written as text are parsed, as llama-server
        does), token ids, or llama-server's mixed list of both."""
        return tokenize_mixed(self.engine.target_model, prompt, add_special=True, parse_special=True)

    def chat(self, req) -> ChatJob:
        """A chat request rendered by the chat template (its prompt, grammar, stops, parser)."""
        try:
            return self.template.render(req)
        except ChatError as exc:
            raise ApiError(400, str(exc), p.REQUEST_PARAMS.get(exc.field, exc.field)) from None

    def chat_tokens(self, text: str) -> np.ndarray:
        return self.engine.target_model.tokenize(text, add_special=not self.template.starts_with_bos(text),
                                                 parse_special=True)

    def admit(self, req, prompt: np.ndarray, limit: int | None, seed: int | None = None, n_probs: int = 0,
              chat: ChatJob | None = None):
        """The scheduler job of an admitted request (InputError / Overloaded raised otherwise);
        a chat request's grammar is its template's (`chat`). The engine checks the request whole
        (Engine.check) before it waits in the queue."""
        budget = self.scheduler.budget(prompt, limit)
        speculate, limits = self.speculation(req)
        grammar = chat.grammar if chat is not None else self.grammar(req)
        request = engine_request.Request(prompt, budget, seed=req.seed if seed is None else seed,
                                         sampling=self.settings(req), speculate=speculate, limits=limits,
                                         grammar=grammar, n_probs=n_probs, **req.request_fields())
        request = self.engine.check(request)
        if grammar is not None:  # parsed now: a grammar llama.cpp cannot read is a 400 before the queue
            Grammar(self.engine.target_model, grammar).close()
        return self.scheduler.submit(request)

    def grammar(self, req: p.Constrained) -> str | GrammarSpec | None:
        """The GBNF grammar a (non-chat) request's output must follow: its own `grammar`, or its
        JSON schema (`json_schema`, `response_format`) through llama.cpp's converter, as
        llama-server; with llama.cpp's reasoning budget where the request gives its tags
        (`reasoning_budget_*`)."""
        if req.grammar:
            gbnf = req.grammar
        elif (schema := req.wanted_schema()) is None:
            gbnf = None
        else:
            try:
                gbnf = json_schema_to_grammar(schema)
            except ChatError as exc:
                raise ApiError(400, str(exc), "json_schema" if req.json_schema is not None else "response_format") from None
        tokens = req.reasoning_budget_tokens
        budget = reasoning_budget(self.engine.target_model, req.reasoning_budget_start_tag, req.end_tags,
                                  req.reasoning_budget_message,
                                  self.template.reasoning.budget if tokens is None or tokens == -1 else tokens, False)
        return gbnf if budget is None else GrammarSpec(gbnf or "", budget=budget)


async def collect(request: Request, svc: Service, job, text: TextStream, tokens: list[int] | None = None,
                  probs: list | None = None):
    """(finish reason, stats) of a whole answer, its text in `text` (its token ids appended to
    `tokens`, their TokenProbs to `probs`); (None, None) once the client is gone. The finish
    reason is OpenAI's: "stop" at an end-of-generation token or a stop string, "length" at the
    budget or a full slot."""
    stopped = False
    while True:
        try:
            event = await asyncio.wait_for(job.events.get(), DISCONNECT_POLL)
        except TimeoutError:
            if await request.is_disconnected():
                return None, None
            continue
        if isinstance(event, Tokens) and not stopped:
            text.push(event.tokens)
            if tokens is not None:
                tokens += event.tokens
            if probs is not None:
                probs += event.probs
            if text.stopped:
                stopped = True
                svc.scheduler.cancel(job)
        elif isinstance(event, Done):
            if not stopped:
                text.finish()
            return ("stop" if stopped else event.reason), event.stats
        elif isinstance(event, Failed):
            raise ApiError(500, event.message)
