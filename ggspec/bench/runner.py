"""Runs benchmark configurations and yields one record per measured run.

Configurations run one after another; inside each, every (repetition, prompt) runs the
configuration and its `--no-spec` baseline back to back, in alternating order (A B, B A, ...),
so machine drift hits both alike and every speedup is a ratio of paired runs (llama.cpp's own
loops, `--native`, are paired with ggspec's baseline the same way). At parallel P > 1 the unit is
a repetition: all its prompts go through one engine P at a time (continuous batching), then
through the baseline engine of the same parallel level (alternating order per repetition); each
sequence still gets its own `Run`, carrying its share of the engine's transaction time and calls. Models are loaded
once; each configuration gets its own contexts, closed before the next one starts (a matrix of
18 configurations must not hold 18 KV caches). Like mlx-lm's `generate`, this is a generator:
the CLI shows progress and saves what has been measured, and stops cleanly on Ctrl-C.
"""

from __future__ import annotations

import itertools
import resource
import tempfile
from collections.abc import Iterator
from contextlib import closing
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from ggspec.bench.configs import BenchConfig
from ggspec.bench.forced import PROFILES, ForcedAcceptance, profile_lengths
from ggspec.bench.native import PLAIN_TOOL, TOOL, draft_steps, find_tool, run_cpp, run_plain
from ggspec.bench.prompts import Prompt
from ggspec.files import local_path
from ggspec.runtime import ContextParams
from ggspec.runtime.context import resolve_flash_attn
from ggspec.runtime.devices import Placement
from ggspec.speculative.driver import drive, generate_greedy
from ggspec.speculative.engine import Engine
from ggspec.speculative.lossless import Divergence, byte_exact, compare, engine_models
from ggspec.speculative.models import Models, PairConfig
from ggspec.speculative.planes import PlaneOptions
from ggspec.speculative.request import Request
from ggspec.speculative.rules.tree_budget import parse_tree_budget
from ggspec.speculative.sampling import SamplerSettings
from ggspec.speculative.stats import RunStats, Step
from ggspec.speculative.types import registry

WARMUP_TOKENS = 16


@dataclass(frozen=True)
class Settings:
    """What every configuration shares; a --resume file must have been made with the same."""
    target: str
    draft: str  # "" for a target-only benchmark (plain rows only: ggspec's and llama.cpp's)
    n_predict: int
    reps: int
    threads: int
    warmup: bool
    profile: str | None  # acceptance profile (benchmark device) or None: the real draft
    profile_weights: tuple[float, ...] | None
    prompts: tuple[Prompt, ...]
    placement: Placement = Placement()  # devices: the same for every configuration
    n_gpu_layers: int = 0
    flash_attn: str = "auto"  # -fa, for every configuration (llama.cpp's tools too)
    spec_type: str | None = None  # --spec-type (None: detected from the draft)
    p_min: float = PairConfig.p_min
    # each draft type's own options, flat (registry.option_fields' keys -> values; saved flat too)
    type_options: tuple[tuple[str, Any], ...] = ()
    spec_select: str = PairConfig.spec_select  # several types: whose draft a step verifies
    plan_pool: int = 0  # prepared plans per ggspec context (patch 0012; llama.cpp's tools: LLAMA_SCHED_POOL)
    # sampler settings of the rows with a temperature (BenchConfig.temp); prompt i draws with seed + i
    top_k: int = SamplerSettings.top_k
    top_p: float = SamplerSettings.top_p
    min_p: float = SamplerSettings.min_p
    seed: int = 0

    def sampling(self, temp: float) -> SamplerSettings:
        return SamplerSettings(temp=temp, top_k=self.top_k, top_p=self.top_p, min_p=self.min_p, seed=self.seed)

    def prompt_seed(self, i: int) -> int:
        """Prompt i's seed (the same in every repetition and configuration)."""
        return (self.seed + i) % 2**32

    @property
    def devices(self) -> str:
        """The placement in words (a column of every row)."""
        p = self.placement
        if not p.rpc:
            return "cpu" if self.n_gpu_layers == 0 else f"-ngl {self.n_gpu_layers} -sm {p.split_mode}"
        head = " (mirrored head)" if p.mirror_output else ""
        split = f" -ts {','.join(f'{x:g}' for x in p.tensor_split)}" if p.tensor_split else ""
        return f"-sm {p.split_mode} over {','.join(p.rpc)}{split}{head}"


@dataclass
class Decoded:
    """One sequence's result inside `Runner._decode`."""
    stats: RunStats = field(default_factory=RunStats)
    tokens: list[int] = field(default_factory=list)
    engine_t: float = 0.0
    engine_calls: float = 0.0
    engine_steps: float = 0.0


@dataclass
class Run:
    """One measured generation: a configuration (or its paired baseline) on one prompt."""
    config: str  # BenchConfig.key
    rep: int
    prompt: int  # index into Settings.prompts
    category: str
    stats: RunStats
    # output equal to the paired baseline run's (parallel > 1: to the prompt's solo plain greedy
    # output, for baseline runs too); None: a parallel-1 baseline run itself, or a sampled run
    # (temperature > 0: outputs differ by design; the distribution is what is equal)
    identical: bool | None = None
    # where not identical: "near-tie" (the target's own top-2 margin at the first difference is below
    # the losslessness gate: batched rounding flipped a tie, benign) or "real" (a bug), and that margin
    divergence: str | None = None
    margin: float | None = None
    diverged_at: int | None = None  # the index of the first differing generated token
    paired_with: str = ""  # for baseline runs: the configuration they were paired with
    rss_mib: float = 0.0
    peak_rss_mib: float = 0.0
    plane_bytes: int = 0  # recurrent state memory per sequence (hybrid targets)
    plane_layout: str = ""
    # this run's share of its engine's transactions (each one's wall time, llama.cpp calls and count
    # divided evenly among the sequences in it): aggregate t/s = tokens / engine_t over runs
    engine_t: float = 0.0
    engine_calls: float = 0.0
    engine_steps: float = 0.0
    tokens: list[int] = field(default_factory=list, repr=False)  # not saved
    text: str = field(default="", repr=False)  # llama.cpp's tool: its printed text (not saved)

    def to_json(self) -> dict:
        d = asdict(self)
        d.pop("tokens")
        d.pop("text")
        return d

    @staticmethod
    def from_json(d: dict) -> "Run":
        return Run(**{**d, "stats": RunStats(**d["stats"])})


def rss_mib() -> tuple[float, float]:
    """(resident now, process peak so far) in MiB."""
    with open("/proc/self/statm") as f:
        resident = int(f.read().split()[1]) * resource.getpagesize()
    return resident / 2**20, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class Runner:
    def __init__(self, settings: Settings) -> None:
        self.s = settings
        # the weights, loaded once for the whole benchmark; every configuration's engine uses them
        self.models = Models(self._pair_config(None, ContextParams(n_ctx=256, n_threads=settings.threads), n_max=1))
        self.recurrent = self.models.target.is_recurrent
        self.tokens = [self.models.target.tokenize(p.text) for p in settings.prompts]
        self._baselines: dict[str, Engine] = {}
        self._references: dict[tuple[str, int], np.ndarray] = {}
        self._margins: dict[tuple[str, int], list[float]] = {}  # top-2 margins of the references' tokens
        self._tools: dict[str, Path] = {}
        self._tmp = tempfile.TemporaryDirectory(prefix="ggspec-bench-")

    @property
    def longest_prompt(self) -> int:
        return max(len(t) for t in self.tokens)

    def close(self) -> None:
        for sp in self._baselines.values():
            sp.close()
        self._baselines.clear()
        self.models.close()
        self._tmp.cleanup()

    # --- pairs -----------------------------------------------------------------------------------

    def _type_options(self, n_max: int) -> dict:
        """Each type's options for a row of draft length n_max, on both loops alike: the n-gram
        types draft at most the row's n_max (llama.cpp's loop gets it as the type's m-gram size or
        n_max, which its rules depend on), ngram-mod's shortest kept draft capped by it."""
        given = registry.options_from_flat(dict(self.s.type_options))
        return {name: o.with_length(n_max) for name, o in given.items()}

    def _ctx(self, cfg: BenchConfig) -> ContextParams:
        return ContextParams(n_ctx=cfg.n_ctx, n_threads=self.s.threads, type_k=cfg.ctk, type_v=cfg.ctv,
                             flash_attn=self.s.flash_attn)

    def _pair_config(self, cfg: BenchConfig | None, ctx: ContextParams, n_max: int = 1,
                     speculative: bool = True) -> PairConfig:
        s = self.s
        return PairConfig(target=local_path(s.target), draft=local_path(s.draft) if speculative and s.draft else None,
                          spec_type=s.spec_type if speculative else None, spec_select=s.spec_select, plan_pool=s.plan_pool, p_min=s.p_min,
                          spec_options=self._type_options(max(cfg.n_max if cfg else n_max, 1)) if speculative else {},
                          n_max=cfg.n_max if cfg else n_max, adaptive=cfg.adaptive if cfg else False, ctx=ctx, parallel=cfg.parallel if cfg else 1,
                          sampling=s.sampling(cfg.temp if cfg else 0.0),
                          planes=cfg.plane_options if cfg else PlaneOptions(), inject=(cfg.inject if cfg else "") or "pruned",
                          placement=s.placement, n_gpu_layers=s.n_gpu_layers, n_gpu_layers_draft=s.n_gpu_layers,
                          **_tree_fields(cfg.tree if cfg else ""))

    def _pair(self, cfg: BenchConfig) -> Engine:
        """ggspec's speculative engine of a configuration; with an acceptance profile (a benchmark
        device) its proposer is wrapped in forced acceptance, armed before each decode (_decode)."""
        forced = None
        if self.s.profile_weights is not None:
            forced = lambda inner: ForcedAcceptance(inner, n_vocab=self.models.target.n_vocab)  # noqa: E731
        return Engine(self.models, self._pair_config(cfg, self._ctx(cfg)), wrap_proposer=forced)

    def _baseline(self, base: BenchConfig) -> Engine:
        """ggspec's plain engine of a baseline configuration (kept for the whole benchmark)."""
        if base.key not in self._baselines:
            pc = replace(self._pair_config(None, self._ctx(base), speculative=False), parallel=base.parallel,
                         sampling=self.s.sampling(base.temp))
            self._baselines[base.key] = Engine(self.models, pc, plain=True)
        return self._baselines[base.key]

    def _reference(self, cfg: BenchConfig, i: int, n_max: int) -> np.ndarray:
        """Prompt + solo plain greedy continuation (long enough for a last full draft block), per
        baseline context: the forced-acceptance proposer replays it, parallel runs are compared with it."""
        key = (cfg.solo().key, i)
        need = len(self.tokens[i]) + self.s.n_predict + n_max + 1
        if key not in self._references or len(self._references[key]) < need:
            n = self.s.n_predict + n_max + 1
            solo = self._baseline(cfg.solo())
            steps = list(generate_greedy(solo, self.tokens[i], n, ignore_eos=True, record_margins=True))
            out = [t for st in steps for t in st.tokens]
            self._references[key] = np.concatenate([self.tokens[i], np.asarray(out, dtype=np.int32)])
            self._margins[key] = [m for st in steps for m in st.margins]
        return self._references[key]

    def _divergence(self, cfg: BenchConfig, i: int, want: list[int], got: list[int]) -> Divergence | None:
        """The first difference of `got` from plain greedy `want`, with the target's top-2 margin
        there (from the prompt's solo reference run): a benign near-tie or a real divergence."""
        self._reference(cfg, i, 0)
        exact = byte_exact(engine_models(self._baseline(cfg.solo())))
        return compare(want, self._margins[(cfg.solo().key, i)], got, exact)

    def _mark(self, run: Run, cfg: BenchConfig, i: int, want: list[int], got: list[int]) -> None:
        """Set run.identical / divergence / margin from its tokens against plain greedy `want`."""
        div = self._divergence(cfg, i, want, got)
        run.identical = div is None
        if div is not None:
            run.divergence, run.margin, run.diverged_at = ("near-tie" if div.benign else "real"), div.margin, div.index

    def _solo_tokens(self, cfg: BenchConfig, i: int) -> list[int]:
        """The prompt's plain greedy output decoded alone (what every parallel sequence must equal)."""
        start = len(self.tokens[i])
        return [int(t) for t in self._reference(cfg, i, 0)[start:start + self.s.n_predict]]

    # --- single runs -------------------------------------------------------------------------------

    def _lengths(self, seed: int, n_max: int):
        # a built-in profile by name (profile_lengths fits it to every draft length), a file's weights as they are
        profile = self.s.profile if self.s.profile in PROFILES else self.s.profile_weights
        return profile_lengths(profile, n_max, seed=seed)

    def _decode(self, sp: Engine, cfg: BenchConfig, prompts: list[int], n: int, seed: int) -> dict[int, Decoded]:
        """Decode `prompts` (indices) through `sp`, as many at a time as it has slots and cells
        (continuous batching, speculative.driver; one prompt: a plain single-sequence run). `seed`:
        the acceptance profile's draws (benchmark device) when there is one."""
        if sp.proposer is not None and self.s.profile_weights is not None:  # (none: plain by cost)
            refs = {i: self._reference(cfg, i, cfg.n_max) for i in prompts}  # before anything is timed
            sp.proposer.arm(lambda seq: refs[seq.tag], self._lengths(seed, cfg.n_max))
        out = {i: Decoded() for i in prompts}
        requests = [Request(self.tokens[i], n, tag=i, seed=self.s.prompt_seed(i), ignore_eos=True) for i in prompts]
        with closing(drive(sp, requests)) as events:
            for ev in events:
                d = out[ev.tag]
                d.stats.add(ev.step)
                d.tokens += ev.tokens
                if ev.step.kind != "prefill":  # this transaction, shared evenly by its sequences
                    d.engine_t += ev.step.t_total / ev.verified
                    d.engine_calls += ev.calls / ev.verified
                    d.engine_steps += 1 / ev.verified
        return out

    def _run(self, cfg: BenchConfig, rep: int, i: int, d: Decoded, sp: Engine | None = None, **kw) -> Run:
        run = Run(cfg.key, rep, i, self.s.prompts[i].category, d.stats, tokens=d.tokens, engine_t=d.engine_t,
                  engine_calls=d.engine_calls, engine_steps=d.engine_steps, **kw)
        if sp is not None and sp.speculative:
            run.plane_bytes, run.plane_layout = sp.recurrent_bytes(), sp.plane_layout
        return run

    def check_tools(self, configs: list[BenchConfig]) -> None:
        """Find llama.cpp's tools the configurations need before anything is measured."""
        for cfg in configs:
            if cfg.kind in ("native", "native-baseline"):
                self._tool(TOOL if cfg.kind == "native" else PLAIN_TOOL)

    def _tool(self, name: str) -> Path:
        if name not in self._tools:
            self._tools[name] = find_tool(name)
        return self._tools[name]

    def _native(self, cfg: BenchConfig, i: int, n: int) -> tuple[RunStats, str]:
        # as ggspec's own contexts (-fa; auto: llama.cpp's choice), for every row (one attention setting)
        flash_attn = resolve_flash_attn(self.s.flash_attn)
        sampling = replace(self.s.sampling(cfg.temp), seed=self.s.prompt_seed(i))
        if cfg.kind == "native-baseline":
            res = run_plain(self._tool(PLAIN_TOOL), local_path(self.s.target), self.s.prompts[i].text, n, n_ctx=cfg.n_ctx,
                            ctk=cfg.ctk, ctv=cfg.ctv, flash_attn=flash_attn, threads=self.s.threads,
                            sampling=sampling, n_gpu_layers=self.s.n_gpu_layers)
            return RunStats(n_decoded=res.n_decoded, n_generated=res.n_decoded, t_decode=res.seconds), res.text
        forced = None
        if self.s.profile_weights is not None:
            forced = Path(self._tmp.name) / f"forced-{i}-{cfg.n_max}.txt"
            ref = self._reference(cfg, i, cfg.n_max)
            counts = itertools.islice(self._lengths(i, cfg.n_max), n + 1)
            forced.write_text(" ".join(map(str, ref)) + "\n" + " ".join(map(str, counts)) + "\n")
        # draft-mtp: the target's own head, unless the draft is a Gemma 4 drafter
        draft = local_path(self.s.draft) if self.s.draft and self.models.draft is not None else None
        own = registry.get(cfg.spec_type).default_options().with_length(cfg.n_max) if cfg.spec_type else None
        res = run_cpp(self._tool(TOOL), local_path(self.s.target), draft, self.s.prompts[i].text, n, cfg.n_max,
                      defer=cfg.inject == "deferred", n_ctx=cfg.n_ctx, ctk=cfg.ctk, ctv=cfg.ctv,
                      flash_attn=flash_attn, threads=self.s.threads, forced=forced,
                      spec_type=cfg.spec_type or self.models.plan.spec_type, p_min=self.s.p_min or None,
                      sampling=sampling, dump_drafts=True, n_gpu_layers=self.s.n_gpu_layers,
                      options={cfg.spec_type: own} if own is not None else self._type_options(cfg.n_max))
        # the per-step figures come from the draft dump: τ, the histogram and per-position
        # acceptance of llama.cpp's loop, as ggspec's rows have them
        stats = RunStats(n_decoded=res.n_decoded, n_generated=res.n_decoded, t_decode=res.seconds)
        # both loops draft first from the last prompt token (position n_prompt - 1), so a step at
        # position p has generated p - n_prompt + 1 tokens before it. With one token of the -n budget
        # left, ggspec decodes it plainly, where llama.cpp's loop drafts and verifies once more (and
        # generates past -n): that step is left out, so per-step counts line up with ggspec's
        end = len(self.tokens[i]) + n - 2
        for (pos, _), (drafted, accepted) in zip(res.drafts, draft_steps(res.drafts, res.accepted)):
            if drafted and pos < end:
                stats.add(Step([], "spec", drafted=drafted, accepted=accepted))
        return stats, res.text

    # --- a configuration ---------------------------------------------------------------------------

    def run_config(self, cfg: BenchConfig, done: set[tuple[int, int]] = frozenset()) -> Iterator[Run]:
        """Every (rep, prompt) not in `done`: the configuration's run, then its paired baseline
        run (or the other way round), as two Run records."""
        base = cfg.baseline()
        base_sp = self._baseline(base)
        sp = self._pair(cfg) if cfg.kind == "spec" else None
        try:
            if self.s.warmup:
                first = list(range(min(cfg.parallel, len(self.s.prompts))))
                self._decode(base_sp, base, first, WARMUP_TOKENS, seed=0)
                if sp is not None:
                    self._decode(sp, cfg, first, WARMUP_TOKENS, seed=0)
            if cfg.parallel > 1:
                yield from self._run_parallel(cfg, sp, base_sp, done)
                return
            for rep in range(self.s.reps):
                _afresh(sp)
                for i, prompt in enumerate(self.s.prompts):
                    if (rep, i) in done:
                        continue
                    first_is_config = (rep + i) % 2 == 0
                    runs = {}
                    for which in (("config", "base") if first_is_config else ("base", "config")):
                        if which == "base":
                            d = self._decode(base_sp, base, [i], self.s.n_predict, seed=i)[i]
                            runs["base"] = self._run(base, rep, i, d, paired_with=cfg.key)
                        elif sp is not None:
                            d = self._decode(sp, cfg, [i], self.s.n_predict, seed=i)[i]
                            runs["config"] = self._run(cfg, rep, i, d, sp)
                        else:
                            stats, text = self._native(cfg, i, self.s.n_predict)
                            runs["config"] = Run(cfg.key, rep, i, prompt.category, stats, text=text)
                    c, b = runs["config"], runs["base"]
                    if not cfg.sampled:
                        self._mark(c, cfg, i, b.tokens, self._native_tokens(c, b, prompt.text, base_sp)
                                   if c.text else c.tokens)
                    for r in (c, b):
                        r.rss_mib, r.peak_rss_mib = rss_mib()
                    yield c
                    yield b
        finally:
            if sp is not None:
                sp.close()

    def _run_parallel(self, cfg: BenchConfig, sp: Engine, base_sp: Engine, done) -> Iterator[Run]:
        """Parallel P: per repetition, all its missing prompts through the configuration's engine
        and through the baseline engine of the same parallel level, one after the other (in
        alternating order); every output is compared with the prompt's solo plain greedy output."""
        base = cfg.baseline()
        for rep in range(self.s.reps):
            todo = [i for i in range(len(self.s.prompts)) if (rep, i) not in done]
            if not todo:
                continue
            _afresh(sp)
            decoded = {}
            for which in (("config", "base") if rep % 2 == 0 else ("base", "config")):
                engine, what = (sp, cfg) if which == "config" else (base_sp, base)
                decoded[which] = self._decode(engine, what, todo, self.s.n_predict, seed=1000 * (rep + 1))
            for i in todo:
                solo = None if cfg.sampled else self._solo_tokens(cfg, i)
                c = self._run(cfg, rep, i, decoded["config"][i], sp)
                b = self._run(base, rep, i, decoded["base"][i], paired_with=cfg.key)
                for r in (c, b):
                    if solo is not None:
                        self._mark(r, cfg, i, solo, r.tokens)
                    r.rss_mib, r.peak_rss_mib = rss_mib()
                yield c
                yield b

    @staticmethod
    def _native_tokens(c: Run, b: Run, prompt: str, base_sp: Engine) -> list[int]:
        """llama.cpp's tool prints text, not tokens: the plain run's tokens as far as the text agrees
        with theirs, then one other token at the first difference (its index is what the margin
        check needs). The speculative tool may run a few tokens on: only the common length counts."""
        model = base_sp.target_model
        # with --ignore-eos llama.cpp never samples an end-of-generation token, where ggspec's plain
        # greedy takes it and goes on: the texts part there by design
        cut = next((k for k, t in enumerate(b.tokens) if model.is_eog(t)), len(b.tokens))
        got = c.text[len(prompt):] if c.text.startswith(prompt) else ""
        if not got:
            return []  # nothing generated (or not even the prompt came back): differs at the first token
        ends, text = [], ""
        for k in range(cut):
            text = model.detokenize(b.tokens[:k + 1])
            ends.append(len(text))
        n = min(len(text), len(got))
        first = next((j for j in range(n) if text[j] != got[j]), None)
        if first is None:  # agrees as far as both go (llama.cpp's may stop at an end of generation)
            return list(b.tokens)
        k = next(k for k, e in enumerate(ends) if e > first)
        return list(b.tokens[:k]) + [-1]


def _afresh(sp: Engine | None) -> None:
    """A repetition starts from nothing learnt from the text: what a drafter keeps across the
    prompts of a run (suffix's global trie) holds this repetition's earlier prompts only, never a
    prompt's own earlier output."""
    if sp is not None:
        sp.reset()


def _tree_fields(text: str) -> dict:
    """A configuration's --spec-tree-budget as PairConfig fields ("": the default)."""
    if not text:
        return {}
    budget, auto = parse_tree_budget(text)
    return {"tree_budget": budget, "tree_auto": auto}
