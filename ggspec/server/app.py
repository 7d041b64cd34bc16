"""The HTTP side: a Starlette application over a Scheduler.

OpenAI's endpoints are here (/v1/completions, /v1/chat/completions, /v1/models), llama-server's
own ones in llama_routes.py, admission and errors in service.py. Accepted requests become
scheduler jobs; their tokens come back as events and leave as one JSON body or as server-sent
events (SSE).
"""

from __future__ import annotations

import asyncio
import logging
from contextlib import asynccontextmanager
from pathlib import Path

import numpy as np
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from ggspec.errors import ContextOverflow, GGSpecError, InputError
from ggspec.runtime.chat import ChatError
from ggspec.server import llama_protocol as lp
from ggspec.server import llama_routes
from ggspec.server import protocol as p
from ggspec.server.access import ApiKeys
from ggspec.server.chat import ChatJob
from ggspec.server.metrics import CONTENT_TYPE_LATEST
from ggspec.server.scheduler import Done, Draining, Failed, Overloaded, Tokens
from ggspec.server.service import CONTEXT_ERROR, ApiError, Service, collect, parse
from ggspec.server.text import TextStream
from ggspec.speculative.driver import request_seed
from ggspec.speculative.stats import merge

log = logging.getLogger("ggspec.server")
DONE = b"data: [DONE]\n\n"  # the stream's last event


# --- routes ----------------------------------------------------------------------------------------


async def completions(request: Request) -> Response:
    svc: Service = request.app.state.service
    req = parse(p.CompletionRequest, await request.body())
    svc.check_model(req.model)
    prompt = req.prompt[0] if isinstance(req.prompt, list) and isinstance(req.prompt[0], str) else req.prompt
    return await _answer(request, svc, req, svc.tokens(prompt), req.max_tokens, None)


async def chat_completions(request: Request) -> Response:
    svc: Service = request.app.state.service
    req = parse(p.ChatRequest, await request.body())
    svc.check_model(req.model)
    chat = svc.chat(req)
    return await _answer(request, svc, req, svc.chat_tokens(chat.prompt), req.limit, chat)


async def _answer(request: Request, svc: Service, req, prompt: np.ndarray, limit: int | None,
                  chat: ChatJob | None) -> Response:
    """`chat`: a chat request's rendering (its answers are read back by its parser)."""
    jobs = _admit_all(svc, req, prompt, limit, chat)
    shape = p.Shape(chat is not None, svc.model_id)
    if chat is not None:  # (POST /v1/chat/completions/control finds it by its id)
        svc.live[shape.id] = (jobs, bool(getattr(req, "reasoning_control", False)))
    texts = [_text_stream(svc, req, chat) for _ in jobs]
    logprobs = _logprobs(svc, req)
    if req.stream:
        parsers = [chat.parser() if chat is not None else None for _ in jobs]
        return StreamingResponse(_sse(svc, jobs, shape, texts, len(prompt), req.include_usage, logprobs, parsers),
                                 media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
    try:
        return await _whole(request, svc, jobs, shape, texts, logprobs, len(prompt), chat)
    finally:
        svc.live.pop(shape.id, None)


async def _whole(request: Request, svc: Service, jobs: list, shape: p.Shape, texts: list[TextStream], logprobs,
                 n_prompt: int, chat: ChatJob | None) -> Response:
    """A whole (not streamed) answer of every choice."""
    probs = [[] if logprobs else None for _ in jobs]
    try:
        ends = await asyncio.gather(*(collect(request, svc, job, text, probs=pr)
                                      for job, text, pr in zip(jobs, texts, probs)))
    except BaseException:
        _cancel(svc, jobs)
        raise
    if any(finish is None for finish, _ in ends):  # the client left
        _cancel(svc, jobs)
        return Response(status_code=499)
    choices = []
    for i, (text, (finish, _), pr) in enumerate(zip(texts, ends, probs)):
        message = _read_back(chat, text.text)
        choices.append(shape.choice(i, text.text, _finish(finish, message), logprobs(pr) if logprobs else None,
                                    message))
    stats = [st for _, st in ends]
    return JSONResponse(shape.whole(choices, _usage(n_prompt, stats), p.timings(stats[0])))


def _text_stream(svc: Service, req, chat: ChatJob | None) -> TextStream:
    """A choice's text: the request's stop strings and the template's; tokens the template
    preserves are shown although special (a tool call's `<tool_call>`), as llama-server."""
    model = svc.engine.target_model
    if chat is None:
        return TextStream(model.token_bytes, req.stops)
    shown = chat.shown
    piece = (lambda t: model.special_piece(t) if t in shown else model.token_bytes(t)) if shown else model.token_bytes
    return TextStream(piece, req.stops + chat.stops)


def _read_back(chat: ChatJob | None, text: str) -> dict | None:
    """A chat answer as OpenAI's message (content, reasoning_content, tool_calls), parsed by the
    template's parser; None for a completion."""
    if chat is None:
        return None
    parser = chat.parser()
    if parser is None:
        return {"role": "assistant", "content": text}
    try:
        parser.update(text, partial=False)
        message = parser.message
        if not any(message.get(k) for k in ("content", "reasoning_content", "tool_calls")):
            return {"role": "assistant", "content": text}  # llama-server's: an empty parse is the text as it is
        return message
    except ChatError as exc:  # (llama-server fails such a request; ggspec gives the text as it is)
        log.warning("cannot parse a chat answer (%s); sending it as plain content", exc)
        return {"role": "assistant", "content": text}
    finally:
        parser.close()


def _finish(finish: str, message: dict | None) -> str:
    """OpenAI's finish reason: "tool_calls" where an answer that ended by itself called tools."""
    return "tool_calls" if finish == "stop" and message and message.get("tool_calls") else finish


def _admit_all(svc: Service, req, prompt: np.ndarray, limit: int | None, chat: ChatJob | None) -> list:
    """One job per choice (`n`), each with its own seed (the request's + i; a random one each
    when none is set), or none at all when one cannot be admitted."""
    base = req.seed if req.seed is not None else svc.sampling.seed
    jobs = []
    try:
        for i in range(req.n):
            jobs.append(svc.admit(req, prompt, limit, seed=request_seed(base, i), n_probs=req.n_probs, chat=chat))
    except BaseException:
        _cancel(svc, jobs)
        raise
    return jobs


def _cancel(svc: Service, jobs: list) -> None:
    for job in jobs:
        svc.scheduler.cancel(job)


def _usage(n_prompt: int, stats: list) -> dict:
    return p.usage(n_prompt, merge(stats), n_cached=stats[0].n_cached)


def _logprobs(svc: Service, req):
    """The request's `logprobs` as a function of its tokens' TokenProbs (None: not asked for):
    llama-server's completion_probabilities, each with the `top_n` likeliest tokens."""
    if not req.n_probs:
        return None
    token_bytes, n = svc.engine.target_model.token_bytes, req.top_n
    return lambda probs: [{**e, "top_logprobs": e["top_logprobs"][:n]} for e in lp.probs_json(token_bytes, probs)]


def _merged(jobs: list) -> tuple[asyncio.Queue, list[asyncio.Task]]:
    """One queue of every job's events, each tagged with its choice's index (a task per job, that
    ends with its Done or Failed)."""
    events: asyncio.Queue = asyncio.Queue()

    async def forward(i: int, job) -> None:
        while True:
            event = await job.events.get()
            await events.put((i, event))
            if isinstance(event, (Done, Failed)):
                return

    return events, [asyncio.create_task(forward(i, job)) for i, job in enumerate(jobs)]


async def _sse(svc: Service, jobs: list, shape: p.Shape, texts: list[TextStream], n_prompt: int,
               include_usage: bool, logprobs=None, parsers: list | None = None):
    """Server-sent events: chunks as tokens arrive (each choice's with its index), a last chunk
    per choice with its finish reason, usage when asked for, then [DONE]. A chat answer's text
    goes through its parser (`parsers`), whose deltas the chunks carry: content, reasoning,
    tool calls, as llama-server streams them. A client that leaves cancels the jobs (Starlette
    cancels this generator when the connection closes)."""
    events, tasks = _merged(jobs)
    stopped = [False] * len(jobs)
    done: dict[int, object] = {}
    fast = len(jobs) == 1 and logprobs is None  # one choice of text: the pre-rendered chunk
    parsers = parsers or [None] * len(jobs)
    messages: list[dict | None] = [None] * len(jobs)

    def chunks(i: int, text: str, final: bool, probs=None) -> list[bytes]:
        """The events of new text of choice i (through its parser, if any)."""
        parser = parsers[i]
        if parser is None:
            if fast:
                return [shape.text_event(text)] if text else []
            if not text and probs is None:
                return []
            return [p.sse(shape.chunk(text, index=i, logprobs=probs))]
        try:
            deltas = parser.update(text, partial=not final)
            messages[i] = parser.message
        except ChatError as exc:  # (as _read_back: the text as it is from here on)
            log.warning("cannot parse a chat answer (%s); streaming it as plain content", exc)
            parsers[i] = None
            return chunks(i, text, final, probs)
        out = [shape.text_event(d["content"]) if fast and d.keys() == {"content"} else p.sse(shape.delta_chunk(d, index=i))
               for d in deltas]
        if probs is not None:
            out.append(p.sse(shape.chunk(None, index=i, logprobs=probs)))
        return out

    try:
        if shape.chat:
            for i in range(len(jobs)):
                yield p.sse(shape.chunk(None, role=True, index=i))
        while len(done) < len(jobs):  # every job's events end with its Done or Failed
            i, event = await events.get()
            text = texts[i]
            if isinstance(event, Tokens) and not stopped[i]:
                delta = text.push(event.tokens)
                out = chunks(i, delta, False, None if logprobs is None else logprobs(event.probs))
                if out:
                    yield b"".join(out)
                if text.stopped:
                    stopped[i] = True
                    svc.scheduler.cancel(jobs[i])
            elif isinstance(event, Done):  # the rest of this choice in one write
                done[i] = event.stats
                tail = "" if stopped[i] else text.finish()
                end = chunks(i, tail, True)
                finish = _finish("stop" if stopped[i] else event.reason, messages[i])
                end.append(p.sse({**shape.chunk(None, finish, index=i), "timings": p.timings(event.stats)}))
                yield b"".join(end)
            elif isinstance(event, Failed):
                yield p.sse(p.error_body(500, event.message, "server_error")) + DONE
                return
        if include_usage:
            yield p.sse(shape.usage_chunk(_usage(n_prompt, [done[i] for i in range(len(jobs))])))
        yield DONE
    finally:
        svc.live.pop(shape.id, None)
        for task in tasks:
            task.cancel()
        _cancel(svc, jobs)  # a no-op for the finished ones
        for parser in parsers:
            if parser is not None:
                parser.close()


async def chat_control(request: Request) -> Response:
    """POST /v1/chat/completions/control, llama-server's: {"id": a chat completion's id, "action":
    "reasoning_end"} ends its thinking block now (the request asked for `reasoning_control`); the
    answer is {"success": bool} with a message where it did nothing."""
    svc: Service = request.app.state.service
    try:
        body = p.loads(await request.body())
    except ValueError as exc:
        raise ApiError(400, f"the body is not valid JSON: {exc}") from None
    body = body if isinstance(body, dict) else {}
    cmpl_id, action = body.get("id"), body.get("action")
    if not isinstance(cmpl_id, str) or not cmpl_id:
        raise ApiError(400, "missing completion id", "id")
    if action != "reasoning_end":
        raise ApiError(400, "unknown control action", "action")
    jobs, control = svc.live.get(cmpl_id, ([], False))
    running = [job for job in jobs if job.seq is not None and not job.seq.done]
    if not running:
        return JSONResponse({"success": False, "message": "no active completion for this id"})
    if not control:
        return JSONResponse({"success": False, "message": "reasoning control not enabled for this completion"})
    for job in running:
        svc.scheduler.end_reasoning(job)
    return JSONResponse({"success": True})


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
    too_long = isinstance(exc, ContextOverflow)
    request.app.state.service.metrics.reject("too_long" if too_long else "invalid")
    param = p.REQUEST_PARAMS.get(exc.field, exc.field)
    if too_long:  # llama-server's type and fields
        return ApiError(400, str(exc), param, CONTEXT_ERROR, n_prompt_tokens=exc.n_prompt, n_ctx=exc.n_ctx).response()
    return ApiError(400, str(exc), param).response()


async def _busy(request: Request, exc: GGSpecError) -> Response:
    draining = isinstance(exc, Draining)
    request.app.state.service.metrics.reject("draining" if draining else "overloaded")
    return ApiError(503, str(exc)).response()


async def _http_error(request: Request, exc: HTTPException) -> Response:
    message = {404: f"no route {request.method} {request.url.path}",
               405: f"{request.method} is not allowed on {request.url.path}"}.get(exc.status_code, exc.detail)
    return ApiError(exc.status_code, message).response()


async def _unexpected(request: Request, exc: Exception) -> Response:
    log.exception("unexpected error answering %s %s", request.method, request.url.path)
    return ApiError(500, f"internal error: {exc.__class__.__name__}: {exc}").response()


def create_app(service: Service, api_keys: tuple[str, ...] = (), ui: Path | None = None) -> Starlette:
    """The application; its lifespan starts the scheduler's thread and, at shutdown (after the
    server stopped taking connections and the open ones finished), stops it. With `api_keys`,
    a request must bring one of them (server.access); `ui`: llama.cpp's web UI, built
    (native.web_ui), served at / (its files open without a key, as llama-server's)."""

    @asynccontextmanager
    async def lifespan(app: Starlette):
        service.scheduler.start()
        try:
            yield
        finally:
            await asyncio.get_running_loop().run_in_executor(None, service.scheduler.stop)

    routes = [
        Route("/v1/completions", completions, methods=["POST"]),
        *(Route(path, chat_completions, methods=["POST"]) for path in ("/v1/chat/completions", "/chat/completions")),
        Route("/v1/chat/completions/control", chat_control, methods=["POST"]),
        *(Route(path, models, methods=["GET"]) for path in ("/v1/models", "/models")),
        *(Route(path, health, methods=["GET"]) for path in ("/health", "/v1/health")),
        Route("/metrics", metrics, methods=["GET"]),
        *llama_routes.routes(),
    ]
    if ui is not None:  # last: every API route wins over a file of the same name
        routes.append(Mount("/", app=StaticFiles(directory=ui, html=True), name="ui"))
    handlers = {ApiError: _api_error, InputError: _input_error, Overloaded: _busy, Draining: _busy,
                HTTPException: _http_error, Exception: _unexpected}
    pages = frozenset() if ui is None else frozenset({"/", *(f"/{p.relative_to(ui).as_posix()}" for p in ui.rglob("*")
                                                               if p.is_file())})
    middleware = [Middleware(ApiKeys, keys=api_keys, open_paths=pages,
                             on_refused=lambda: service.metrics.reject("unauthorized"))] if api_keys else []
    app = Starlette(routes=routes, exception_handlers=handlers, lifespan=lifespan, middleware=middleware)
    app.state.service = service
    return app
