"""Per-step statistics of the speculative loop and their aggregation over a run."""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import numpy as np


@dataclass(frozen=True, slots=True)
class TokenProbs:
    """A committed token's probability under the target's raw distribution (the softmax of its
    row, before any sampler), and the n most likely tokens of that row: llama-server's n_probs."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...]  # (token, logprob), most likely first


def token_probs(row: np.ndarray, token: int, n: int) -> TokenProbs:
    """As llama-server's get_token_probabilities: float32 softmax of the raw logits."""
    x = np.asarray(row, dtype=np.float32)
    p = np.exp(x - x.max())
    p /= p.sum(dtype=np.float32)
    n = min(n, len(p))
    top = np.argpartition(-x, n - 1)[:n]
    top = top[np.argsort(-x[top], kind="stable")]
    log = lambda v: float(np.log(v)) if v > 0 else float(np.finfo(np.float32).min)  # noqa: E731 (as llama-server)
    return TokenProbs(token, log(p[token]), tuple((int(t), log(p[t])) for t in top))


@dataclass
class Step:
    """One transaction (or the prefill): what it committed and what it cost."""

    tokens: list[int]  # tokens committed by this step, in order
    kind: str  # "prefill" | "spec" | "plain"
    drafted: int = 0  # draft tokens proposed
    accepted: int = 0  # of which the target accepted (a leading run)
    n_prompt: int = 0  # prompt tokens (prefill only)
    n_cached: int = 0  # of which the prompt cache held (not decoded again)
    t_draft: float = 0.0  # seconds in the draft's noise-block decode
    t_verify: float = 0.0  # seconds in the target decode (prefill: prompt processing)
    t_inject: float = 0.0  # seconds injecting target features into the draft cache
    t_replay: float = 0.0  # seconds re-decoding committed tokens no recurrent plane kept
    replayed: bool = False
    t_total: float = 0.0  # wall time of the whole step
    k: int | None = None  # the adaptive length (auto): drafted tokens it verified this step
    nodes: int = 0  # draft tokens verified: a token tree's nodes, else the drafted chain's
    margins: list[float] = field(default_factory=list)  # top-2 logit gap per token (optional)
    probs: list[TokenProbs] = field(default_factory=list)  # per committed token, when its sequence asks (n_probs)

    @property
    def t_overhead(self) -> float:
        """Everything that is not a llama.cpp call: Python bookkeeping, argmax, accept."""
        return max(0.0, self.t_total - self.t_draft - self.t_verify - self.t_inject - self.t_replay)


@dataclass
class RunStats:
    """Aggregates of a run's steps. Mean accepted length τ is *pooled*: committed tokens of all
    speculative steps divided by the number of those steps (each step counts the bonus token)."""

    n_prompt: int = 0
    n_cached: int = 0  # prompt tokens the prompt cache held
    t_prompt: float = 0.0
    n_generated: int = 0
    n_decoded: int = 0  # tokens committed after the prefill's first one
    t_decode: float = 0.0  # wall time of every step after the prefill
    spec_steps: int = 0
    drafted: int = 0
    accepted: int = 0
    committed_spec: int = 0
    t_draft: float = 0.0
    t_verify: float = 0.0
    t_inject: float = 0.0
    t_replay: float = 0.0
    t_overhead: float = 0.0
    replays: int = 0
    accept_hist: list[int] = field(default_factory=list)  # steps by number of accepted drafts
    pos_drafted: list[int] = field(default_factory=list)  # steps that drafted a token at position i
    pos_accepted: list[int] = field(default_factory=list)  # ... and had it accepted
    k_hist: list[int] = field(default_factory=list)  # the adaptive length: steps by drafted tokens verified
    tree_steps: int = 0  # speculative steps that verified a token tree
    nodes: int = 0  # draft tokens verified, a tree's nodes counted

    def add(self, step: Step) -> None:
        if step.kind == "prefill":
            self.n_prompt += step.n_prompt
            self.n_cached += step.n_cached
            self.t_prompt += step.t_verify
            self.n_generated += len(step.tokens)
            self.t_inject += step.t_inject
            return
        self.n_generated += len(step.tokens)
        self.n_decoded += len(step.tokens)
        self.t_decode += step.t_total
        self.t_draft += step.t_draft
        self.t_verify += step.t_verify
        self.t_inject += step.t_inject
        self.t_replay += step.t_replay
        self.replays += step.replayed
        self.t_overhead += step.t_overhead
        if step.k is not None:
            bump(self.k_hist, step.k)
        if step.kind == "spec":
            self.spec_steps += 1
            self.drafted += step.drafted
            self.accepted += step.accepted
            self.committed_spec += step.accepted + 1
            self.nodes += step.nodes
            self.tree_steps += step.nodes > step.drafted
            bump(self.accept_hist, step.accepted)
            count_positions(self.pos_drafted, step.drafted)
            count_positions(self.pos_accepted, step.accepted)

    @property
    def decode_tps(self) -> float:
        # the prefill commits the first token; decode speed counts the tokens after it
        return self.n_decoded / self.t_decode if self.t_decode > 0 else 0.0

    @property
    def prompt_tps(self) -> float:
        return (self.n_prompt - self.n_cached) / self.t_prompt if self.t_prompt > 0 else 0.0

    @property
    def tau(self) -> float:
        """Pooled mean accepted length (committed tokens per speculative step, bonus included)."""
        return self.committed_spec / self.spec_steps if self.spec_steps else 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def position_acceptance(self) -> list[float]:
        """P(draft position i is accepted | it was drafted), i = 0..n_max-1."""
        return [a / d if d else 0.0 for a, d in zip(self.pos_accepted + [0] * len(self.pos_drafted), self.pos_drafted)]

    @property
    def k_summary(self) -> str:
        """The adaptive length's choices: 'k 0: 61 %, 3: 30 %, 7: 9 %' ("" without it)."""
        shares = k_shares(self.k_hist)
        return f"k {shares}" if shares else ""

    @property
    def replay_share(self) -> float:
        """Share of speculative steps that had to replay (capped recurrent planes)."""
        return self.replays / self.spec_steps if self.spec_steps else 0.0

    def _phases(self) -> dict[str, float]:
        return {"draft": self.t_draft, "verify": self.t_verify, "inject": self.t_inject,
                "replay": self.t_replay, "overhead": self.t_overhead}

    def time_shares(self) -> dict[str, float]:
        phases = self._phases()
        total = sum(phases.values())
        return {k: (v / total if total > 0 else 0.0) for k, v in phases.items()}

    def per_step_ms(self) -> dict[str, float]:
        """Mean milliseconds per decode step, by phase."""
        steps = max(1, self.spec_steps)
        return {k: 1e3 * v / steps for k, v in self._phases().items()}


def merge(runs) -> RunStats:
    """Pool several runs' statistics: every field summed (lists of counts element-wise)."""
    total = RunStats()
    for r in runs:
        for f in fields(RunStats):
            mine, theirs = getattr(total, f.name), getattr(r, f.name)
            if isinstance(mine, list):
                mine.extend([0] * (len(theirs) - len(mine)))
                for i, c in enumerate(theirs):
                    mine[i] += c
            else:
                setattr(total, f.name, mine + theirs)
    return total


def k_shares(hist: list[int], top: int | None = None) -> str:
    """Steps by verified length as shares, '0: 61 %, 3: 30 %', in k order: the `top` most
    frequent lengths (None: all); "" for no steps."""
    total = sum(hist)
    if not total:
        return ""
    ks = sorted(sorted(range(len(hist)), key=lambda k: -hist[k])[:top])
    return ", ".join(f"{k}: {100 * hist[k] / total:.0f} %" for k in ks if hist[k])


def bump(counts: list[int], i: int) -> None:
    """counts[i] += 1, growing the list as needed."""
    if len(counts) <= i:
        counts.extend([0] * (i + 1 - len(counts)))
    counts[i] += 1


def count_positions(counts: list[int], n: int) -> None:
    """counts[i] += 1 for i < n, growing the list as needed."""
    if len(counts) < n:
        counts.extend([0] * (n - len(counts)))
    for i in range(n):
        counts[i] += 1


def summarize(steps) -> RunStats:
    stats = RunStats()
    for s in steps:
        stats.add(s)
    return stats


def top2_margin(logits: np.ndarray) -> float:
    """Gap between the largest and second-largest logit of one row."""
    top2 = np.partition(logits, -2)[-2:]
    return float(top2[1] - top2[0])


@dataclass
class EngineStats:
    """Whole-engine counters: calls and wall time of the transactions (all sequences together)."""

    steps: int = 0  # transactions
    calls: int = 0  # llama_process calls made by transactions (target + draft)
    max_calls: int = 0  # the most calls one transaction made
    t_steps: float = 0.0  # wall time of the transactions
    tokens: int = 0  # tokens committed by transactions

    def count(self, seconds: float, calls: int) -> None:
        """One transaction: its wall time and its llama.cpp calls."""
        self.steps += 1
        self.calls += calls
        self.max_calls = max(self.max_calls, calls)
        self.t_steps += seconds

    @property
    def calls_per_step(self) -> float:
        return self.calls / self.steps if self.steps else 0.0
