"""The HTTP side: a Starlette application over a Scheduler.

Each request is validated and admitted here, on the event loop, before it reaches the engine:
a bad body, an unknown model or a prompt that cannot fit its slot gets a 4xx with OpenAI's
error body, a full queue a 503. Accepted requests become scheduler jobs; their tokens come back
as events and leave as one JSON body or as server-sent events (SSE).
"""

from __future__ import annotations

import asyncio
import logging
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace

import numpy as np
from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ggspec.errors import GGSpecError, InputError
from ggspec.server import protocol as p
from ggspec.server.chat import ChatTemplate, Message
from ggspec.server.metrics import CONTENT_TYPE_LATEST, Metrics
from ggspec.server.scheduler import Done, Draining, Failed, JobSpec, Overloaded, Scheduler, Tokens
from ggspec.server.text import TextStream
from ggspec.speculative.sampling import SamplerSettings

log = logging.getLogger("ggspec.server")
DONE = b"data: [DONE]\n\n"  # the stream's last event
DISCONNECT_POLL = 0.25  # seconds between checks for a vanished client while a whole answer is made


class ApiError(Exception):
    """An answer other than 200: status, one line, and OpenAI's error fields."""

    def __init__(self, status: int, message: str, param: str | None = None, kind: str = "invalid_request_error",
                 code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.kind, self.code = status, message, param, kind, code

    def response(self) -> JSONResponse:
        return JSONResponse(p.error_body(self.message, self.kind, self.param, self.code), status_code=self.status)


@dataclass
class Service:
    """What the routes need: the scheduler, the model's names and template, request defaults."""

    scheduler: Scheduler
    template: ChatTemplate
    model_id: str
    sampling: SamplerSettings  # for fields a request leaves out (the server's --temp, --top-k, ...)
    metrics: Metrics
    info: dict  # /v1/models "meta": the pair and its settings

    @property
    def engine(self):
        return self.scheduler.engine

    # --- admission -------------------------------------------------------------------------------

    def check_model(self, name: str | None) -> None:
        if name is not None and name != self.model_id:
            raise ApiError(404, f"the model '{name}' does not exist here: this server has '{self.model_id}'",
                           "model", code="model_not_found")

    def settings(self, req: p._Sampling) -> SamplerSettings:
        given = {"temp": req.temperature, "top_p": req.top_p, "top_k": req.top_k, "min_p": req.min_p}
        return replace(self.sampling, **{k: v for k, v in given.items() if v is not None})

    def tokens(self, req: p.CompletionRequest) -> np.ndarray:
        prompt = req.prompt[0] if isinstance(req.prompt, list) and isinstance(req.prompt[0], str) else req.prompt
        if isinstance(prompt, str):
            # special tokens written as text are parsed, as llama-server does
            return self.engine.target_model.tokenize(prompt, add_special=True, parse_special=True)
        ids = np.asarray(prompt, dtype=np.int64)
        n_vocab = self.engine.target_model.n_vocab
        if ids.max() >= n_vocab:
            raise ApiError(400, f"token id {int(ids.max())} is outside the vocabulary (0..{n_vocab - 1})", "prompt")
        return ids.astype(np.int32)

    def chat_tokens(self, req: p.ChatRequest) -> np.ndarray:
        text = self.template.render([Message(m.role, m.text) for m in req.messages])
        return self.engine.target_model.tokenize(text, add_special=not self.template.starts_with_bos(text),
                                                 parse_special=True)

    def admit(self, req: p._Sampling, prompt: np.ndarray, limit: int | None):
        """The scheduler job of an admitted request (InputError / Overloaded raised otherwise)."""
        budget = self.scheduler.budget(prompt, limit)
        sampling = self.settings(req)
        sampling.validate()
        return self.scheduler.submit(JobSpec(prompt, budget, sampling, req.seed, req.ignore_eos))


# --- routes ----------------------------------------------------------------------------------------


def _parse(model, raw: bytes):
    try:
        return model.model_validate_json(raw or b"null")
    except ValidationError as exc:
        message, param = p.validation_message(exc)
        raise ApiError(400, message, param) from None


async def completions(request: Request) -> Response:
    svc: Service = request.app.state.service
    req = _parse(p.CompletionRequest, await request.body())
    svc.check_model(req.model)
    return await _answer(request, svc, req, svc.tokens(req), req.max_tokens, chat=False)


async def chat_completions(request: Request) -> Response:
    svc: Service = request.app.state.service
    req = _parse(p.ChatRequest, await request.body())
    svc.check_model(req.model)
    return await _answer(request, svc, req, svc.chat_tokens(req), req.limit, chat=True)


async def _answer(request: Request, svc: Service, req, prompt: np.ndarray, limit: int | None, chat: bool) -> Response:
    job = svc.admit(req, prompt, limit)
    shape = p.Shape(chat, svc.model_id)
    text = TextStream(svc.engine.target_model.token_bytes, req.stops)
    if req.stream:
        return StreamingResponse(_sse(svc, job, shape, text, len(prompt), req.include_usage),
                                 media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
    try:
        finish, stats = await _collect(request, svc, job, text)
    except asyncio.CancelledError:
        svc.scheduler.cancel(job)
        raise
    if finish is None:  # the client left
        svc.scheduler.cancel(job)
        return Response(status_code=499)
    return JSONResponse(shape.whole(text.text, finish, p.usage(len(prompt), stats)))


async def _collect(request: Request, svc: Service, job, text: TextStream):
    """(finish reason, stats) of a whole answer; (None, None) once the client is gone."""
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
            if text.stopped:
                stopped = True
                svc.scheduler.cancel(job)
        elif isinstance(event, Done):
            if not stopped:
                text.finish()
            return ("stop" if stopped else event.reason), event.stats
        elif isinstance(event, Failed):
            raise ApiError(500, event.message, kind="server_error")


async def _sse(svc: Service, job, shape: p.Shape, text: TextStream, n_prompt: int, include_usage: bool):
    """Server-sent events: chunks as tokens arrive, a last chunk with the finish reason, usage
    when asked for, then [DONE]. A client that leaves cancels the job (Starlette cancels this
    generator when the connection closes)."""
    stopped = False
    try:
        if shape.chat:
            yield p.sse(shape.chunk(None, role=True))
        while True:  # the job's events end with its Done or Failed
            event = await job.events.get()
            if isinstance(event, Tokens) and not stopped:
                delta = text.push(event.tokens)
                if delta:
                    yield shape.text_event(delta)
                if text.stopped:
                    stopped = True
                    svc.scheduler.cancel(job)
            elif isinstance(event, Done):  # the rest of the answer in one write
                tail = "" if stopped else text.finish()
                end = [shape.text_event(tail)] if tail else []
                end.append(p.sse(shape.chunk(None, "stop" if stopped else event.reason)))
                if include_usage:
                    end.append(p.sse(shape.usage_chunk(p.usage(n_prompt, event.stats))))
                yield b"".join([*end, DONE])
                return
            elif isinstance(event, Failed):
                yield p.sse(p.error_body(event.message, "server_error")) + DONE
                return
    finally:
        svc.scheduler.cancel(job)  # a no-op once it finished


async def models(request: Request) -> Response:
    svc: Service = request.app.state.service
    return JSONResponse({"object": "list", "data": [{"id": svc.model_id, "object": "model", "created": 0,
                                                      "owned_by": "ggspec", "meta": svc.info}]})


async def health(request: Request) -> Response:
    svc: Service = request.app.state.service
    s = svc.scheduler
    body = {"status": "ok", "slots_idle": svc.engine.parallel - s.running, "slots_processing": s.running,
            "requests_waiting": s.waiting}
    return JSONResponse(body)


async def metrics(request: Request) -> Response:
    svc: Service = request.app.state.service
    return Response(svc.metrics.text(), media_type=CONTENT_TYPE_LATEST)


# --- errors ----------------------------------------------------------------------------------------


async def _api_error(request: Request, exc: ApiError) -> Response:
    if exc.status < 500:
        request.app.state.service.metrics.reject("invalid")
    return exc.response()


async def _input_error(request: Request, exc: InputError) -> Response:
    too_long = exc.field in ("max_tokens", "prompt")
    request.app.state.service.metrics.reject("too_long" if too_long else "invalid")
    param = {"temp": "temperature"}.get(exc.field, exc.field)
    return ApiError(400, str(exc), param, code="context_length_exceeded" if too_long else None).response()


async def _busy(request: Request, exc: GGSpecError) -> Response:
    draining = isinstance(exc, Draining)
    request.app.state.service.metrics.reject("draining" if draining else "overloaded")
    return ApiError(503, str(exc), kind="server_error", code="draining" if draining else "overloaded").response()


async def _http_error(request: Request, exc: HTTPException) -> Response:
    message = {404: f"no route {request.method} {request.url.path}",
               405: f"{request.method} is not allowed on {request.url.path}"}.get(exc.status_code, exc.detail)
    return ApiError(exc.status_code, message).response()


async def _unexpected(request: Request, exc: Exception) -> Response:
    log.exception("unexpected error answering %s %s", request.method, request.url.path)
    return ApiError(500, f"internal error: {exc.__class__.__name__}: {exc}", kind="server_error").response()


def create_app(service: Service) -> Starlette:
    """The application; its lifespan starts the scheduler's thread and, at shutdown (after the
    server stopped taking connections and the open ones finished), stops it."""

    @asynccontextmanager
    async def lifespan(app: Starlette):
        service.scheduler.start()
        try:
            yield
        finally:
            await asyncio.get_running_loop().run_in_executor(None, service.scheduler.stop)

    routes = [
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
    ]
    handlers = {ApiError: _api_error, InputError: _input_error, Overloaded: _busy, Draining: _busy,
                HTTPException: _http_error, Exception: _unexpected}
    app = Starlette(routes=routes, exception_handlers=handlers, lifespan=lifespan)
    app.state.service = service
    return app
