"""Start and stop the server: load the pair, serve with uvicorn, drain on SIGINT / SIGTERM.

Everything that can fail on the user's input (models, settings, the chat template) fails before
the port is opened. On SIGINT or SIGTERM uvicorn stops accepting connections and lets the open
requests finish (at most `drain_timeout` seconds, then they are cancelled); the engine's thread
stops, the contexts and models are freed, and the process exits 0. A second signal ends the drain.
"""

from __future__ import annotations

import gc
import signal
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ggspec.server.chat import Reasoning
from ggspec.speculative.engine import Engine, Serving
from ggspec.speculative.models import PairConfig


@dataclass
class ServeOptions:
    host: str = "127.0.0.1"
    port: int = 8080
    model_id: str = "ggspec"
    max_queue: int = 64
    chat_template: str | None = None  # a llama.cpp built-in template name
    chat_template_file: Path | None = None
    reasoning: Reasoning = Reasoning()  # the thinking format and budget a request does not give
    drain_timeout: float = 30.0
    plain: bool = False  # no drafting (the A/B baseline)
    drafter: str = ""  # why it drafts with what it does (/props): given, detected, a lone model's default
    prompt_cache: bool = True  # a slot keeps its cells for a later prompt with the same beginning
    cache_ram_mib: int = 8192  # host memory for cells a new prompt overwrites (-1: no limit, 0: off)
    ctx_checkpoints: int = 32  # a hybrid target's checkpoints per slot (llama-server's --ctx-checkpoints)
    prefill_chunk: int = 512  # prompt rows a step decodes while others generate (0: every prompt whole)
    log_level: str = "warning"  # uvicorn's
    api_keys: tuple[str, ...] = ()  # a request must bring one of these (none: open)
    tls: tuple[Path, Path] | None = None  # (PEM key, PEM certificate): HTTPS
    ui: bool = True  # llama.cpp's web UI at / (built on the first serve where it is not yet)


class _Stop(Exception):
    """A signal that uvicorn passed on after its graceful shutdown."""


def build_service(engine: Engine, options: ServeOptions):
    """The application's Service over an open engine."""
    from ggspec.server.app import Service
    from ggspec.server.chat import ChatTemplate
    from ggspec.server.metrics import Metrics
    from ggspec.server.scheduler import Scheduler

    template = ChatTemplate(engine.target_model, options.chat_template, options.chat_template_file, options.reasoning)
    scheduler = Scheduler(engine, options.max_queue)
    metrics = Metrics(options.model_id, lambda: scheduler.waiting, lambda: scheduler.running, engine.parallel)
    scheduler.metrics = metrics
    cfg = engine.cfg
    info = {"target": str(cfg.target), "draft": None if options.plain or cfg.draft is None else str(cfg.draft),
            "speculative": engine.speculative, "spec_type": engine.plan.spec_type, "drafter": options.drafter,
            "request_types": list(engine.request_types), "n_max": engine.n_max,
            "adaptive": engine.draft_length is not None, "plain_by_cost": engine.plain_by_cost,
            "tree_budget": None if engine.tree_rule is None else ("auto" if engine.tree_rule.auto else engine.tree_rule.cap),
            "parallel": engine.parallel, "n_ctx_slot": engine.capacity, "n_vocab": engine.target_model.n_vocab,
            "prompt_cache": engine.prompt_cache, "cache_ram_mib": options.cache_ram_mib if engine.store is not None else 0,
            "ctx_checkpoints": engine.slots.max_checkpoints, "prefill_chunk": engine.serving.prefill_rows or 0,
            "chat_template": template.source, "build": build_info()}
    return Service(scheduler, template, options.model_id, cfg.sampling, metrics, info)


def web_ui_site(log: Callable[[str], None]) -> Path | None:
    """llama.cpp's web UI, built now where it is not yet (its progress logged); None, with one
    line saying why, where it cannot be: the server then answers the API only."""
    from ggspec.native import web_ui
    from ggspec.native.errors import BuildError

    try:
        return web_ui.ensure(log=log)
    except BuildError as exc:
        log(f"warning: no web UI at / ({exc}); the API is served (--no-ui: no page)")
        return None


def build_info() -> str:
    """This build's name in /props (llama-server's build_info): ggspec's build key and patches."""
    from ggspec.native.bindings import current_build

    info = current_build()
    return f"ggspec {info.key} (llama.cpp + {len(info.patches)} patches)"


def serve(cfg: PairConfig, options: ServeOptions, log: Callable[[str], None] = print) -> None:
    import uvicorn

    from ggspec.server.app import create_app

    # the first token comes from the prefill, as llama-server's: a request's first chunk does not
    # wait for a whole draft-and-verify step; and a drafter's table outlives requests, as its
    cache_ram = None if options.cache_ram_mib < 0 else options.cache_ram_mib * 2**20
    serving = Serving(prompt_cache=options.prompt_cache, cache_ram=cache_ram, first_token_from_prefill=True,
                      keep_draft_state=True, standby_types=True,  # (llama-server's behaviours)
                      ctx_checkpoints=options.ctx_checkpoints, prefill_rows=options.prefill_chunk or None)
    with Engine.open(cfg, plain=options.plain, serving=serving) as engine:
        for w in engine.warnings:
            log(f"warning: {w}")
        service = build_service(engine, options)  # (its option errors first, alone on their line)
        for n in engine.notes:
            log(f"note: {n}")
        site = web_ui_site(log) if options.ui else None
        key, cert = options.tls or (None, None)
        config = uvicorn.Config(create_app(service, options.api_keys, site), host=options.host, port=options.port,
                                log_level=options.log_level, access_log=False, lifespan="on",
                                timeout_graceful_shutdown=options.drain_timeout,
                                ssl_keyfile=None if key is None else str(key),
                                ssl_certfile=None if cert is None else str(cert))
        server = uvicorn.Server(config)
        # everything loaded so far lives as long as the server: out of the collector's sight, a
        # full collection (which may run on the engine's thread, in the middle of a step) only
        # walks what requests allocate (vLLM's engine does the same)
        gc.collect()
        gc.freeze()
        length = f"auto ≤ {engine.n_max}" if engine.draft_length is not None else f"n_max {engine.n_max}"
        spec = ("plain decoding (no draft length pays here)" if engine.plain_by_cost
                else f"speculative ({engine.plan.spec_type}, {length})" if engine.speculative else "plain decoding")
        scheme = "https" if options.tls else "http"
        keyed = f", {len(options.api_keys)} API key{'s' if len(options.api_keys) != 1 else ''}" if options.api_keys else ""
        log(f"serving '{options.model_id}' on {scheme}://{options.host}:{options.port}/v1  ({spec}{keyed}, {engine.parallel} "
            f"slot{'s' if engine.parallel != 1 else ''} of {engine.capacity} tokens, chat template: {service.template.source}); Ctrl-C stops")
        if site is not None:
            log(f"llama.cpp's web UI: {scheme}://{options.host}:{options.port}/")
        previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}

        def stop(signum, _frame) -> None:
            raise _Stop(signum)

        for sig in previous:  # uvicorn raises the signal again once it has shut down
            signal.signal(sig, stop)
        try:
            server.run()
        except _Stop:
            pass
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        tot = service.metrics.totals
        log(f"stopped: {sum(tot.requests.values())} requests answered, {tot.generation_tokens} tokens generated")
