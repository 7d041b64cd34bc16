"""llama-server's own endpoints, so that tools written for it (web UIs, benchmark scripts,
editors' completion plugins) work against ggspec serve unchanged:

- POST /completion (and /completions): its native completion, whole or streamed (`data: {...}`
  events, the last one with `"stop": true` and the request's `timings`);
- POST /tokenize, /detokenize, /apply-template;
- GET /props (the server's defaults, with ggspec's `speculative` settings), /slots.

Shapes follow llama_protocol.py; admission and errors are the OpenAI endpoints' (service.py).
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ggspec.server import llama_protocol as lp
from ggspec.server import protocol as p
from ggspec.server.scheduler import Done, Failed, Tokens
from ggspec.server.service import ApiError, Service, collect, parse, tokenize_mixed
from ggspec.server.text import TextStream


def _service(request: Request) -> Service:
    return request.app.state.service


# --- /completion -----------------------------------------------------------------------------------


class _Answer:
    """One /completion request's fixed parts and what its final object says."""

    def __init__(self, svc: Service, req: lp.CompletionRequest, prompt) -> None:
        self.svc, self.req, self.prompt = svc, req, prompt
        self.text = TextStream(svc.engine.target_model.token_bytes, req.stops)
        self.tokens: list[int] = []
        self.probs: list = []  # TokenProbs of each token (n_probs)

    def settings(self, job) -> dict:
        request = job.request
        sampling = request.sampling if job.seq is None else replace(request.sampling, seed=job.seq.seed)
        limits = request.limits  # (as the engine checked it: its own, or the engine's)
        eng = self.svc.engine
        kind = ",".join(limits.types) if limits.types else eng.plan.spec_type
        speculative = {"type": kind if request.speculate else "none",
                       "n_max": limits.n_max if request.speculate else 0, "n_min": limits.n_min,
                       "p_min": eng.cfg.p_min if limits.p_min is None else limits.p_min}
        return lp.generation_settings(sampling, self.req.n_predict, self.req.stream, self.req.ignore_eos, speculative,
                                      self.req.n_probs)

    def final(self, job, reason: str, stats, content: str) -> dict:
        stop_type = "word" if self.text.stopped else lp.STOP_TYPES.get(reason, "none")
        model = self.svc.engine.target_model
        return {"index": 0, "content": content, "tokens": self.tokens if self.req.return_tokens else [],
                "id_slot": job.seq.seq_id if job.seq is not None else -1, "stop": True, "model": self.svc.model_id,
                "tokens_predicted": stats.n_generated, "tokens_evaluated": len(self.prompt),
                "generation_settings": self.settings(job), "prompt": _special_text(model, self.prompt),
                "has_new_line": "\n" in self.text.text, "truncated": False, "stop_type": stop_type,
                "stopping_word": self.text.stop_word, "tokens_cached": len(self.prompt) + max(stats.n_generated - 1, 0),
                "timings": p.timings(stats),
                **({"completion_probabilities": lp.probs_json(model.token_bytes, self.probs)}
                   if self.req.n_probs and not self.req.stream else {})}


async def completion(request: Request) -> Response:
    svc = _service(request)
    req = parse(lp.CompletionRequest, await request.body())
    prompt = svc.tokens(req.prompt)
    if req.n_predict == 0:  # the prompt alone: llama-server evaluates it and generates nothing
        svc.scheduler.budget(prompt, 1)
        return JSONResponse({"index": 0, "content": "", "tokens": [], "stop": True, "stop_type": "limit",
                             "tokens_predicted": 0, "tokens_evaluated": len(prompt), "model": svc.model_id})
    job = svc.admit(req, prompt, req.limit, seed=req.request_seed, n_probs=req.n_probs)
    answer = _Answer(svc, req, prompt)
    if req.stream:
        return StreamingResponse(_events(svc, job, answer), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})
    try:
        reason, stats = await collect(request, svc, job, answer.text, answer.tokens, answer.probs)
    except asyncio.CancelledError:
        svc.scheduler.cancel(job)
        raise
    if reason is None:  # the client left
        svc.scheduler.cancel(job)
        return Response(status_code=499)
    return JSONResponse(answer.final(job, reason, stats, answer.text.text))


async def _events(svc: Service, job, answer: _Answer):
    """llama-server's stream: a `data: {...}` event per step's text, then the final object."""
    n_predicted = 0
    try:
        while True:
            event = await job.events.get()
            if isinstance(event, Tokens) and not answer.text.stopped:
                delta = answer.text.push(event.tokens)
                answer.tokens += event.tokens
                n_predicted += len(event.tokens)
                if delta or answer.req.return_tokens or answer.req.n_probs:
                    chunk = lp.completion_chunk(delta, event.tokens if answer.req.return_tokens else [],
                                                job.seq.seq_id, n_predicted, len(answer.prompt))
                    if answer.req.n_probs:
                        chunk["completion_probabilities"] = lp.probs_json(svc.engine.target_model.token_bytes,
                                                                          event.probs)
                    yield p.sse(chunk)
                if answer.text.stopped:
                    svc.scheduler.cancel(job)
            elif isinstance(event, Done):
                tail = "" if answer.text.stopped else answer.text.finish()
                yield p.sse(answer.final(job, event.reason, event.stats, tail))
                return
            elif isinstance(event, Failed):
                yield p.sse(p.error_body(500, event.message, "server_error"))
                return
    finally:
        svc.scheduler.cancel(job)  # a no-op once it finished


# --- tokens and templates --------------------------------------------------------------------------


async def tokenize(request: Request) -> Response:
    svc = _service(request)
    req = parse(lp.TokenizeRequest, await request.body())
    if req.content is None:
        return JSONResponse({"tokens": []})
    model = svc.engine.target_model
    ids = tokenize_mixed(model, req.content, req.add_special, req.parse_special, field="content").tolist()
    if not req.with_pieces:
        return JSONResponse({"tokens": ids})
    return JSONResponse({"tokens": [{"id": t, "piece": _piece(model.special_piece(t))} for t in ids]})


def _piece(data: bytes) -> str | list[int]:
    """A token's text, or its bytes where they are not whole UTF-8 (as llama-server)."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return list(data)


async def detokenize(request: Request) -> Response:
    svc = _service(request)
    req = parse(lp.DetokenizeRequest, await request.body())
    model = svc.engine.target_model
    bad = [t for t in req.tokens if not 0 <= t < model.n_vocab]
    if bad:
        raise ApiError(400, f"token id {bad[0]} is outside the vocabulary (0..{model.n_vocab - 1})", "tokens")
    return JSONResponse({"content": _special_text(model, req.tokens)})


def _special_text(model, ids) -> str:
    """Token ids as text with their control tokens written out, as llama-server shows a prompt."""
    return b"".join(model.special_piece(int(t)) for t in ids).decode("utf-8", "replace")


async def apply_template(request: Request) -> Response:
    svc = _service(request)
    req = parse(lp.ApplyTemplateRequest, await request.body())
    return JSONResponse({"prompt": svc.chat(req).prompt})


# --- the server's state ----------------------------------------------------------------------------


def _defaults(svc: Service) -> dict:
    eng = svc.engine
    speculative = {"type": eng.plan.spec_type or "none", "n_max": eng.n_max if eng.speculative else 0,
                   "n_min": eng.cfg.n_min, "p_min": eng.cfg.p_min}
    return lp.generation_settings(svc.sampling, -1, False, False, speculative)


async def props(request: Request) -> Response:
    svc = _service(request)
    eng = svc.engine
    template = svc.template
    return JSONResponse({
        "default_generation_settings": {"params": _defaults(svc), "n_ctx": eng.capacity},
        "total_slots": eng.parallel, "model_alias": svc.model_id, "model_path": str(eng.cfg.target),
        "modalities": {"vision": False, "video": False, "audio": False},
        "endpoint_slots": True, "endpoint_props": False, "endpoint_metrics": True,
        "chat_template": template.text, "chat_template_caps": template.caps, "bos_token": template.bos,
        "eos_token": template.eos,
        "build_info": svc.info["build"], "is_sleeping": False,
        # ggspec's: the pair, its draft type (and why), lengths, plain by cost or not; what its
        # drafters keep across requests (suffix's global trie), as it stands
        "speculative": {**svc.info, "kept": eng.proposer.memory() if eng.proposer is not None else None},
    })


async def slots(request: Request) -> Response:
    svc = _service(request)
    eng = svc.engine
    busy = {job.seq.seq_id: job for job in svc.scheduler.jobs() if job.seq is not None}
    out = []
    for i in range(eng.parallel):
        job = busy.get(i)
        seq = job.seq if job is not None else None
        out.append({
            "id": i, "n_ctx": eng.capacity, "speculative": eng.speculative, "is_processing": job is not None,
            "params": _defaults(svc) if job is None else {**_defaults(svc), "n_predict": job.request.n_predict},
            "next_token": [{"has_next_token": seq is not None and not seq.done,
                            "n_remain": seq.left if seq is not None else -1,
                            "n_decoded": len(seq.tokens) if seq is not None else 0}],
            "cache": _slot_cache(eng, i, seq),
        })
    return JSONResponse(out)


def _slot_cache(eng, slot: int, seq) -> dict:
    """What the prompt cache holds for a slot (ggspec's): a busy slot's prompt tokens that came
    from its cells and how many of its prompt are decoded, a free slot's cells kept for a later
    prompt; a hybrid target's checkpoints of its recurrent state and their bytes."""
    points = list(eng.slots.checkpoints.get(slot, ()))  # (a copy: the engine thread changes them)
    held = eng.slots.cached.get(slot)
    return {"n_cached": seq.n_cached if seq is not None else 0,
            "n_prefilled": seq.prefilled if seq is not None else 0,
            "n_tokens_kept": 0 if seq is not None or held is None else len(held),
            "checkpoints": [c.n_tokens for c in points], "checkpoint_bytes": sum(len(c.state) for c in points)}


async def tools_disabled(request: Request) -> Response:
    """GET/POST /tools: llama-server's built-in tools, which it answers 403 unless started with
    them (as ggspec always is: it has none); its web UI asks on every message."""
    return JSONResponse({"error": {"message": "this feature is disabled", "type": "feature_disabled"}}, status_code=403)


async def streams_lookup(request: Request) -> Response:
    """POST /v1/streams/lookup: llama-server's resumable streams of the conversations named.
    ggspec keeps none (a stream lives as long as its connection): always none, which its web UI
    reads as nothing to resume."""
    return JSONResponse([])


def routes() -> list[Route]:
    return [
        *(Route(path, completion, methods=["POST"]) for path in ("/completion", "/completions")),
        Route("/tokenize", tokenize, methods=["POST"]),
        Route("/detokenize", detokenize, methods=["POST"]),
        Route("/apply-template", apply_template, methods=["POST"]),
        Route("/props", props, methods=["GET"]),
        Route("/slots", slots, methods=["GET"]),
        Route("/tools", tools_disabled, methods=["GET", "POST"]),
        Route("/v1/streams/lookup", streams_lookup, methods=["POST"]),
    ]
