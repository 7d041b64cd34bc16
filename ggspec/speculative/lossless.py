"""The losslessness oracle: speculative greedy output must equal plain greedy output.

Two rules judge a difference, and every report names the one that did:
- **byte identity** where every model runs on the CPU backend with its batch invariance (patch
  0021, on by default): a verified row computes exactly what a one-token decode computes, so any
  difference at all is a REAL divergence;
- **the 0.2-nat gate** elsewhere (CUDA, Vulkan, RPC workers, or GGML_CPU_BATCH_INVARIANT=0): at
  the first divergence we read the target's own top-2 logit margin there (from the plain run);
  only a tiny margin can make a batched verify flip an argmax by rounding (a benign near-tie), any
  larger margin means a real bug.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from ggspec.speculative.driver import generate_greedy, generate_spec
from ggspec.speculative.stats import RunStats

# A divergence at a position whose top-2 logit gap is below this counts as a rounding near-tie.
# The gap between two logits is the gap between their log-probabilities, so this is the
# gate of 0.2 nat.
TIE_MARGIN = 0.2
IDENTITY_RULE = "byte identity"
GATE_RULE = "0.2-nat gate"


def byte_exact(models) -> bool:
    """Whether byte identity judges runs of these models: all on the CPU backend (no layer
    offloaded, no RPC worker or other device) with its batch invariance on."""
    from ggspec.native.bindings import batch_invariant
    return all(m.n_gpu_layers == 0 and not m.placement.multi_device for m in models) and batch_invariant() > 0


def engine_models(engine) -> list:
    """The models an engine decodes with (its target, and its draft where it has one)."""
    return [m for m in (engine.target_model, getattr(engine, "draft_model", None)) if m is not None]


@dataclass(frozen=True)
class Divergence:
    index: int  # first generated-token index where the two runs differ
    expected: int | None  # plain greedy token (None: the plain run ended earlier)
    got: int | None  # speculative token (None: the speculative run ended earlier)
    margin: float | None  # the target's top-2 logit margin at `index` in the plain run
    exact: bool = True  # judged by byte identity (else by the 0.2-nat gate)

    @property
    def rule(self) -> str:
        return IDENTITY_RULE if self.exact else GATE_RULE

    @property
    def benign(self) -> bool:
        return not self.exact and self.margin is not None and self.margin < TIE_MARGIN

    def describe(self) -> str:
        kind = "benign near-tie" if self.benign else "REAL divergence"
        return (f"{kind} ({self.rule}) at token {self.index}: plain {self.expected}, speculative {self.got}, "
                f"target top-2 margin {self.margin if self.margin is None else f'{self.margin:.5f}'}")


def compare(plain: list[int], margins: list[float], spec: list[int], exact: bool | None = None) -> Divergence | None:
    """None when the two token streams are identical. `exact`: judged by byte identity (None: where
    the CPU backend is batch invariant; pass byte_exact(models) for runs that may use a device)."""
    if exact is None:
        from ggspec.native.bindings import batch_invariant
        exact = batch_invariant() > 0
    for i in range(max(len(plain), len(spec))):
        a = plain[i] if i < len(plain) else None
        b = spec[i] if i < len(spec) else None
        if a != b:
            return Divergence(i, a, b, margins[i] if i < len(margins) else None, exact)
    return None


@dataclass
class PromptRun:
    """One prompt decoded plainly and speculatively on the same pair."""

    plain: list[int]
    margins: list[float]
    spec: list[int]
    plain_stats: RunStats
    spec_stats: RunStats
    exact: bool = True  # byte identity judges it (see byte_exact)

    @property
    def divergence(self) -> Divergence | None:
        return compare(self.plain, self.margins, self.spec, self.exact)


def run_prompts(engine, prompts: list[str], n_predict: int, make_proposer=None,
                ignore_eos: bool = True) -> Iterator[PromptRun]:
    """For each prompt: plain greedy (with margins), then speculative, alternating so that drift
    on a noisy machine hits both alike. `make_proposer(prompt_tokens, plain_tokens)` may wrap
    `engine.proposer` (e.g. forced acceptance); by default the engine's own proposer is used."""
    for text in prompts:
        prompt = engine.target_model.tokenize(text)
        plain_stats, plain, margins = RunStats(), [], []
        for step in generate_greedy(engine, prompt, n_predict, record_margins=True, ignore_eos=ignore_eos):
            plain_stats.add(step)
            plain += step.tokens
            margins += step.margins
        proposer = make_proposer(prompt, plain) if make_proposer else None
        spec_stats, spec = RunStats(), []
        for step in generate_spec(engine, prompt, n_predict, ignore_eos=ignore_eos, proposer=proposer):
            spec_stats.add(step)
            spec += step.tokens
        yield PromptRun(plain, margins, spec, plain_stats, spec_stats, byte_exact(engine_models(engine)))
