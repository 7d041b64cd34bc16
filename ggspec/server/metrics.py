"""The server's Prometheus metrics, named in the style of vLLM's (`vllm:spec_decode_*`).

Counters grow on the engine thread (prometheus_client is thread-safe); the gauges read the
scheduler's queue and slots when /metrics is scraped. Time shares: `ggspec:step_seconds_total`
by phase (prefill, draft, verify, inject, replay, other); a phase's share is its rate over the
sum of all phases' rates.
"""

from __future__ import annotations

from prometheus_client import (
    CONTENT_TYPE_LATEST,  # noqa: F401  (re-exported for the app)
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)

from ggspec.speculative.stats import Step, count_positions

disable_created_metrics()  # no `*_created` series: they double the page and nobody graphs them

_LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0)
_ITL_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)


class Metrics:
    def __init__(self, model: str, waiting, running, slots: int) -> None:
        """`waiting` / `running`: callables giving the queue length and busy slots."""
        self.registry = r = CollectorRegistry()
        labels = {"model_name": model}
        self._labels = labels
        self._children: dict[tuple, object] = {}

        def counter(name: str, doc: str, extra: tuple[str, ...] = ()) -> Counter:
            return Counter(name, doc, ("model_name", *extra), registry=r)

        self.requests = counter("ggspec:request_success", "Requests finished, by finish reason (stop, length, abort).",
                                ("finished_reason",))
        self.rejected = counter("ggspec:request_rejected", "Requests refused before decoding, by reason "
                                "(invalid, too_long, overloaded, draining).", ("reason",))
        self.prompt_tokens = counter("ggspec:prompt_tokens", "Prompt tokens of admitted requests.")
        self.cached_tokens = counter("ggspec:prefix_cache_hit_tokens", "Prompt tokens the prompt cache held "
                                                                       "(not decoded again).")
        self.generation_tokens = counter("ggspec:generation_tokens", "Tokens generated.")
        self.steps = counter("ggspec:engine_steps", "Engine transactions (one draft and one verify call for every "
                                                    "active sequence).")
        self.drafts = counter("ggspec:spec_decode_num_drafts", "Sequence steps that verified a draft.")
        self.draft_tokens = counter("ggspec:spec_decode_num_draft_tokens", "Draft tokens verified.")
        self.accepted_tokens = counter("ggspec:spec_decode_num_accepted_tokens", "Draft tokens accepted.")
        self.accepted_per_pos = counter("ggspec:spec_decode_num_accepted_tokens_per_pos",
                                        "Draft tokens accepted at each draft position (0 = the first).", ("position",))
        self.drafted_per_pos = counter("ggspec:spec_decode_num_draft_tokens_per_pos",
                                       "Draft tokens verified at each draft position (0 = the first).", ("position",))
        self.replays = counter("ggspec:spec_decode_num_replays", "Sequence steps whose rollback replayed the "
                                                                 "committed tokens (no recurrent plane held the state).")
        self.seconds = counter("ggspec:step_seconds", "Engine wall time by phase.", ("phase",))
        self.ttft = Histogram("ggspec:time_to_first_token_seconds", "From arrival to the first generated token.",
                              ("model_name",), buckets=_LATENCY_BUCKETS, registry=r)
        self.itl = Histogram("ggspec:inter_token_latency_seconds", "Time between a request's successive tokens "
                             "(a step's tokens arrive together: the gap over their count).",
                             ("model_name",), buckets=_ITL_BUCKETS, registry=r)
        self.e2e = Histogram("ggspec:e2e_request_latency_seconds", "From arrival to the last token.",
                             ("model_name",), buckets=_LATENCY_BUCKETS, registry=r)
        for name, doc, fn in (("ggspec:num_requests_waiting", "Requests queued for a slot.", waiting),
                              ("ggspec:num_requests_running", "Requests in the engine.", running)):
            Gauge(name, doc, ("model_name",), registry=r).labels(**labels).set_function(fn)
        Gauge("ggspec:num_slots", "Parallel sequence slots.", ("model_name",), registry=r).labels(**labels).set(slots)

    def _child(self, metric, **labels):
        """A metric's child for these labels, looked up once (`labels()` takes a lock and builds
        a key every call; this runs many times a step)."""
        key = (id(metric), *sorted(labels.items()))
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(**self._labels, **labels)
        return child

    def _inc(self, metric: Counter, amount: float = 1.0, **labels) -> None:
        if amount:
            self._child(metric, **labels).inc(amount)

    def reject(self, reason: str) -> None:
        self._inc(self.rejected, reason=reason)

    def finished(self, reason: str, seconds: float) -> None:
        self._inc(self.requests, finished_reason=reason)
        self._child(self.e2e).observe(seconds)

    def first_token(self, seconds: float) -> None:
        self._child(self.ttft).observe(seconds)

    def tokens_after(self, seconds: float, n: int) -> None:
        """n tokens arrived `seconds` after the request's previous ones."""
        h = self._child(self.itl)
        for _ in range(n):
            h.observe(seconds / n)

    def engine_step(self, results: list[tuple[object, Step]]) -> None:
        """One `Engine.step()`: its prefills, then its transaction (every sequence's step of one
        transaction carries the transaction's shared times: counted once). Summed first, then
        one increment per series."""
        transaction = None
        generated = drafts = drafted = accepted = replays = 0
        per_pos_drafted: list[int] = []
        per_pos_accepted: list[int] = []
        for _, step in results:
            generated += len(step.tokens)
            if step.kind == "prefill":
                self._inc(self.prompt_tokens, step.n_prompt)
                self._inc(self.cached_tokens, step.n_cached)
                self._inc(self.seconds, step.t_total, phase="prefill")
                continue
            transaction = transaction or step
            replays += step.replayed
            if step.drafted:
                drafts += 1
                drafted += step.drafted
                accepted += step.accepted
                count_positions(per_pos_drafted, step.drafted)
                count_positions(per_pos_accepted, step.accepted)
        self._inc(self.generation_tokens, generated)
        self._inc(self.drafts, drafts)
        self._inc(self.draft_tokens, drafted)
        self._inc(self.accepted_tokens, accepted)
        self._inc(self.replays, replays)
        for i, n in enumerate(per_pos_drafted):
            self._inc(self.drafted_per_pos, n, position=str(i))
        for i, n in enumerate(per_pos_accepted):
            self._inc(self.accepted_per_pos, n, position=str(i))
        if transaction is not None:
            t = transaction
            self._inc(self.steps)
            parts = {"draft": t.t_draft, "verify": t.t_verify, "inject": t.t_inject, "replay": t.t_replay,
                     "other": t.t_overhead}
            for phase, seconds in parts.items():
                self._inc(self.seconds, seconds, phase=phase)

    def text(self) -> bytes:
        return generate_latest(self.registry)

