"""The server's Prometheus metrics, named in the style of vLLM's (`vllm:spec_decode_*`).

The engine thread only adds to plain numbers (`Totals`, histograms as bucket counts): a
prometheus_client Counter takes a lock and a Histogram walks its buckets in Python on every
call, which cost ~0.27 ms of each engine step at one sequence (a quarter of the step's Python,
measured). The families are built from those numbers when /metrics is scraped (a custom
collector); the gauges read the scheduler's queue and slots then too. Every number has one
writer (the engine thread, or the event loop for rejections), so no lock is needed.

Time shares: `ggspec:step_seconds_total` by phase (prefill, draft, verify, inject, replay, other);
a phase's share is its rate over the sum of all phases' rates.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest  # noqa: F401 (re-exported)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from ggspec.speculative.stats import Step, bump, count_positions

_LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0)
_ITL_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)
_ITL_DOC = "Time between a request's successive tokens (a step's tokens arrive together: the gap over their count)."
PHASES = ("prefill", "draft", "verify", "inject", "replay", "other")
FINISH_REASONS = ("stop", "length", "abort")
REJECT_REASONS = ("invalid", "too_long", "overloaded", "draining", "unauthorized")


class Buckets:
    """A histogram as plain numbers: counts per bucket (the last one past every bound)."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float, n: int = 1) -> None:
        """n observations of `value` (Prometheus buckets are `le`: a value on a bound counts there)."""
        self.counts[bisect_left(self.bounds, value)] += n
        self.sum += value * n

    def cumulative(self) -> list[tuple[str, int]]:
        out, total = [], 0
        for bound, n in zip((*map(str, self.bounds), "+Inf"), self.counts):
            total += n
            out.append((bound, total))
        return out


@dataclass
class Totals:
    """Everything the counters show, as numbers the engine thread adds to."""

    requests: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FINISH_REASONS, 0))
    rejected: dict[str, int] = field(default_factory=lambda: dict.fromkeys(REJECT_REASONS, 0))
    prompt_tokens: int = 0
    cached_tokens: int = 0
    generation_tokens: int = 0
    steps: int = 0
    drafts: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    replays: int = 0
    drafted_per_pos: list[int] = field(default_factory=list)
    accepted_per_pos: list[int] = field(default_factory=list)
    chosen_k: list[int] = field(default_factory=list)  # the adaptive length: sequence steps by verified drafts
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))
    ttft: Buckets = field(default_factory=lambda: Buckets(_LATENCY_BUCKETS))
    itl: Buckets = field(default_factory=lambda: Buckets(_ITL_BUCKETS))
    e2e: Buckets = field(default_factory=lambda: Buckets(_LATENCY_BUCKETS))


# (attribute, metric name, help) of the counters with no label but the model's
_PLAIN_COUNTERS = (
    ("prompt_tokens", "ggspec:prompt_tokens", "Prompt tokens of admitted requests."),
    ("cached_tokens", "ggspec:prefix_cache_hit_tokens", "Prompt tokens the prompt cache held (not decoded again)."),
    ("generation_tokens", "ggspec:generation_tokens", "Tokens generated."),
    ("steps", "ggspec:engine_steps", "Engine transactions (one draft and one verify call for every active sequence)."),
    ("drafts", "ggspec:spec_decode_num_drafts", "Sequence steps that verified a draft."),
    ("draft_tokens", "ggspec:spec_decode_num_draft_tokens", "Draft tokens verified."),
    ("accepted_tokens", "ggspec:spec_decode_num_accepted_tokens", "Draft tokens accepted."),
    ("replays", "ggspec:spec_decode_num_replays",
     "Sequence steps whose rollback replayed the committed tokens (no recurrent plane held the state)."),
)


class Metrics:
    def __init__(self, model: str, waiting: Callable[[], int], running: Callable[[], int], slots: int) -> None:
        """`waiting` / `running`: callables giving the queue length and busy slots."""
        self.model = model
        self.totals = Totals()
        self._waiting, self._running, self._slots = waiting, running, slots
        self.registry = CollectorRegistry()
        self.registry.register(self)

    # --- the engine thread (and the event loop for rejections) -----------------------------------

    def reject(self, reason: str) -> None:
        self.totals.rejected[reason] += 1

    def finished(self, reason: str, seconds: float) -> None:
        self.totals.requests[reason] += 1
        self.totals.e2e.observe(seconds)

    def first_token(self, seconds: float) -> None:
        self.totals.ttft.observe(seconds)

    def tokens_after(self, seconds: float, n: int) -> None:
        """n tokens arrived `seconds` after the request's previous ones."""
        self.totals.itl.observe(seconds / n, n)

    def engine_step(self, results: list[tuple[object, Step]]) -> None:
        """One `Engine.step()`: its prefills, then its transaction (every sequence's step of one
        transaction carries the transaction's shared times: counted once)."""
        tot = self.totals
        transaction = None
        for _, step in results:
            tot.generation_tokens += len(step.tokens)
            if step.kind == "prefill":
                tot.prompt_tokens += step.n_prompt
                tot.cached_tokens += step.n_cached
                tot.seconds["prefill"] += step.t_total
                continue
            transaction = transaction or step
            tot.replays += step.replayed
            if step.k is not None:
                bump(tot.chosen_k, step.k)
            if step.drafted:
                tot.drafts += 1
                tot.draft_tokens += step.drafted
                tot.accepted_tokens += step.accepted
                count_positions(tot.drafted_per_pos, step.drafted)
                count_positions(tot.accepted_per_pos, step.accepted)
        if transaction is not None:
            t, seconds = transaction, tot.seconds
            tot.steps += 1
            seconds["draft"] += t.t_draft
            seconds["verify"] += t.t_verify
            seconds["inject"] += t.t_inject
            seconds["replay"] += t.t_replay
            seconds["other"] += t.t_overhead

    # --- scraping (prometheus_client calls collect() for generate_latest) -------------------------

    def collect(self) -> Iterator[Metric]:
        tot, model = self.totals, [self.model]

        def counter(name: str, doc: str, label: str | None = None, values: dict | None = None):
            fam = CounterMetricFamily(name, doc, labels=["model_name", *([label] if label else [])])
            for key, value in (values or {}).items():
                fam.add_metric([*model, key], value)
            return fam

        yield counter("ggspec:request_success", "Requests finished, by finish reason (stop, length, abort).",
                      "finished_reason", tot.requests)
        yield counter("ggspec:request_rejected", "Requests refused before decoding, by reason "
                      "(invalid, too_long, overloaded, draining, unauthorized).", "reason", tot.rejected)
        for attr, name, doc in _PLAIN_COUNTERS:
            fam = counter(name, doc)
            fam.add_metric(model, getattr(tot, attr))
            yield fam
        yield counter("ggspec:spec_decode_num_accepted_tokens_per_pos",
                      "Draft tokens accepted at each draft position (0 = the first).", "position",
                      {str(i): n for i, n in enumerate(tot.accepted_per_pos)})
        yield counter("ggspec:spec_decode_num_draft_tokens_per_pos",
                      "Draft tokens verified at each draft position (0 = the first).", "position",
                      {str(i): n for i, n in enumerate(tot.drafted_per_pos)})
        yield counter("ggspec:spec_decode_chosen_draft_length",
                      "Sequence steps by the drafted tokens the adaptive length chose to verify (0: a plain step).",
                      "k", {str(k): n for k, n in enumerate(tot.chosen_k) if n})
        yield counter("ggspec:step_seconds", "Engine wall time by phase.", "phase", tot.seconds)
        for name, doc, buckets in (
                ("ggspec:time_to_first_token_seconds", "From arrival to the first generated token.", tot.ttft),
                ("ggspec:inter_token_latency_seconds", _ITL_DOC, tot.itl),
                ("ggspec:e2e_request_latency_seconds", "From arrival to the last token.", tot.e2e)):
            fam = HistogramMetricFamily(name, doc, labels=["model_name"])
            fam.add_metric(model, buckets.cumulative(), buckets.sum)
            yield fam
        for name, doc, value in (("ggspec:num_requests_waiting", "Requests queued for a slot.", self._waiting()),
                                 ("ggspec:num_requests_running", "Requests in the engine.", self._running()),
                                 ("ggspec:num_slots", "Parallel sequence slots.", self._slots)):
            fam = GaugeMetricFamily(name, doc, labels=["model_name"])
            fam.add_metric(model, value)
            yield fam

    def text(self) -> bytes:
        return generate_latest(self.registry)
