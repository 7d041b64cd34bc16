"""Runs benchmark configurations and yields one record per measured run.

Configurations run one after another; inside each, every (repetition, prompt) runs the
configuration and its `--no-spec` baseline back to back, in alternating order (A B, B A, ...),
so machine drift hits both alike and every speedup is a ratio of paired runs (llama.cpp's own
loops, `--native`, are paired with ggspec's baseline the same way). Models are loaded
once; each configuration gets its own contexts, closed before the next one starts (a matrix of
18 configurations must not hold 18 KV caches). Like mlx-lm's `generate`, this is a generator:
the CLI shows progress and saves what has been measured, and stops cleanly on Ctrl-C.
"""

from __future__ import annotations

import itertools
import resource
import tempfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from ggspec.bench.configs import BenchConfig
from ggspec.bench.native import PLAIN_TOOL, TOOL, find_tool, run_cpp, run_plain
from ggspec.bench.prompts import Prompt
from ggspec.runtime import ContextParams
from ggspec.runtime.context import resolve_flash_attn
from ggspec.runtime.devices import Placement
from ggspec.testing.forced import ForcedAcceptance, profile_lengths
from ggspec.speculative.loop import generate_greedy, generate_spec
from ggspec.speculative.pair import PairConfig, SpecPair
from ggspec.speculative.planes import PlaneOptions
from ggspec.speculative.stats import RunStats

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
class Run:
    """One measured generation: a configuration (or its paired baseline) on one prompt."""
    config: str  # BenchConfig.key
    rep: int
    prompt: int  # index into Settings.prompts
    category: str
    stats: RunStats
    identical: bool | None = None  # output equal to the paired baseline run's (None: baseline itself)
    paired_with: str = ""  # for baseline runs: the configuration they were paired with
    rss_mib: float = 0.0
    peak_rss_mib: float = 0.0
    plane_bytes: int = 0  # recurrent state memory per sequence (hybrid targets)
    plane_layout: str = ""
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
        # owns the loaded models for the whole benchmark; tiny contexts, never used to measure
        self.anchor = SpecPair(self._pair_config(None, ContextParams(n_ctx=256, n_threads=settings.threads), n_max=1))
        self.recurrent = self.anchor.target_model.is_recurrent
        self.tokens = [self.anchor.target_model.tokenize(p.text) for p in settings.prompts]
        self._baselines: dict[str, SpecPair] = {}
        self._references: dict[tuple[str, int], np.ndarray] = {}
        self._tools: dict[str, Path] = {}
        self._tmp = tempfile.TemporaryDirectory(prefix="ggspec-bench-")

    @property
    def longest_prompt(self) -> int:
        return max(len(t) for t in self.tokens)

    def close(self) -> None:
        for sp in self._baselines.values():
            sp.close()
        self._baselines.clear()
        self.anchor.close()
        self._tmp.cleanup()

    # --- pairs -----------------------------------------------------------------------------------

    def _ctx(self, cfg: BenchConfig) -> ContextParams:
        return ContextParams(n_ctx=cfg.n_ctx, n_threads=self.s.threads, type_k=cfg.ctk, type_v=cfg.ctv)

    def _pair_config(self, cfg: BenchConfig | None, ctx: ContextParams, n_max: int = 1,
                     speculative: bool = True) -> PairConfig:
        s = self.s
        return PairConfig(target=Path(s.target), draft=Path(s.draft) if speculative and s.draft else None,
                          n_max=cfg.n_max if cfg else n_max, ctx=ctx,
                          planes=cfg.plane_options if cfg else PlaneOptions(), inject=(cfg.inject if cfg else "") or "pruned",
                          placement=s.placement, n_gpu_layers=s.n_gpu_layers, n_gpu_layers_draft=s.n_gpu_layers)

    def _pair(self, cfg: BenchConfig) -> SpecPair:
        return SpecPair(self._pair_config(cfg, self._ctx(cfg)), share_models=self.anchor)

    def _baseline(self, cfg: BenchConfig) -> SpecPair:
        base = cfg.baseline()
        if base.key not in self._baselines:
            pc = self._pair_config(None, self._ctx(base), speculative=False)
            self._baselines[base.key] = SpecPair(pc, share_models=self.anchor)
        return self._baselines[base.key]

    def _reference(self, cfg: BenchConfig, i: int, n_max: int) -> np.ndarray:
        """Prompt + greedy continuation (long enough for a last full draft block), per baseline
        context: the forced-acceptance proposer replays it."""
        key = (cfg.baseline().key, i)
        need = len(self.tokens[i]) + self.s.n_predict + n_max + 1
        if key not in self._references or len(self._references[key]) < need:
            sp = self._baseline(cfg)
            sp.reset()
            n = self.s.n_predict + n_max + 1
            out = [t for st in generate_greedy(sp.target, self.tokens[i], n, ignore_eos=True) for t in st.tokens]
            self._references[key] = np.concatenate([self.tokens[i], np.asarray(out, dtype=np.int32)])
        return self._references[key]

    # --- single runs -------------------------------------------------------------------------------

    def _lengths(self, i: int, n_max: int):
        return profile_lengths(self.s.profile_weights, n_max, seed=i)

    def _generate(self, sp: SpecPair, cfg: BenchConfig, i: int, n: int) -> tuple[RunStats, list[int]]:
        sp.reset()
        prompt = self.tokens[i]
        if sp.speculative:
            proposer = sp.proposer
            if self.s.profile_weights is not None:
                proposer = ForcedAcceptance(sp.proposer, self._reference(cfg, i, cfg.n_max), self._lengths(i, cfg.n_max),
                                            sp.target_model.n_vocab)
            steps = generate_spec(sp.target, proposer, prompt, n, sp.n_max, ignore_eos=True, on_accept=sp.on_accept)
        else:
            steps = generate_greedy(sp.target, prompt, n, ignore_eos=True)
        stats, tokens = RunStats(), []
        for step in steps:
            stats.add(step)
            tokens += step.tokens
        return stats, tokens

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
        flash_attn = resolve_flash_attn("auto", 0, cfg.ctv)
        if cfg.kind == "native-baseline":
            res = run_plain(self._tool(PLAIN_TOOL), Path(self.s.target), self.s.prompts[i].text, n, n_ctx=cfg.n_ctx,
                            ctk=cfg.ctk, ctv=cfg.ctv, flash_attn=flash_attn, threads=self.s.threads)
            return RunStats(n_decoded=res.n_decoded, n_generated=res.n_decoded, t_decode=res.seconds), res.text
        forced = None
        if self.s.profile_weights is not None:
            forced = Path(self._tmp.name) / f"forced-{i}-{cfg.n_max}.txt"
            ref = self._reference(cfg, i, cfg.n_max)
            counts = itertools.islice(self._lengths(i, cfg.n_max), n + 1)
            forced.write_text(" ".join(map(str, ref)) + "\n" + " ".join(map(str, counts)) + "\n")
        res = run_cpp(self._tool(TOOL), Path(self.s.target), Path(self.s.draft), self.s.prompts[i].text, n, cfg.n_max,
                      defer=cfg.inject == "deferred", n_ctx=cfg.n_ctx, ctk=cfg.ctk, ctv=cfg.ctv,
                      flash_attn=flash_attn, threads=self.s.threads, forced=forced)
        stats = RunStats(n_decoded=res.n_decoded, n_generated=res.n_decoded, t_decode=res.seconds,
                         drafted=res.drafted, accepted=res.accepted)
        return stats, res.text

    # --- a configuration ---------------------------------------------------------------------------

    def run_config(self, cfg: BenchConfig, done: set[tuple[int, int]] = frozenset()) -> Iterator[Run]:
        """Every (rep, prompt) not in `done`: the configuration's run, then its paired baseline
        run (or the other way round), as two Run records."""
        base_sp = self._baseline(cfg)
        base_key = cfg.baseline().key
        sp = self._pair(cfg) if cfg.kind == "spec" else None
        try:
            if self.s.warmup:
                self._generate(base_sp, cfg.baseline(), 0, WARMUP_TOKENS)
                if sp is not None:
                    self._generate(sp, cfg, 0, WARMUP_TOKENS)
            for rep in range(self.s.reps):
                for i, prompt in enumerate(self.s.prompts):
                    if (rep, i) in done:
                        continue
                    first_is_config = (rep + i) % 2 == 0
                    runs = {}
                    for which in (("config", "base") if first_is_config else ("base", "config")):
                        if which == "base":
                            stats, tokens = self._generate(base_sp, cfg.baseline(), i, self.s.n_predict)
                            runs["base"] = Run(base_key, rep, i, prompt.category, stats, paired_with=cfg.key,
                                               tokens=tokens)
                        elif sp is not None:
                            stats, tokens = self._generate(sp, cfg, i, self.s.n_predict)
                            runs["config"] = Run(cfg.key, rep, i, prompt.category, stats, tokens=tokens,
                                                 plane_bytes=sp.recurrent_bytes(), plane_layout=sp.plane_layout)
                        else:
                            stats, text = self._native(cfg, i, self.s.n_predict)
                            runs["config"] = Run(cfg.key, rep, i, prompt.category, stats, text=text)
                    c, b = runs["config"], runs["base"]
                    c.identical = self._same(c, b, prompt.text, base_sp)
                    for r in (c, b):
                        r.rss_mib, r.peak_rss_mib = rss_mib()
                    yield c
                    yield b
        finally:
            if sp is not None:
                sp.close()

    @staticmethod
    def _same(c: Run, b: Run, prompt: str, base_sp: SpecPair) -> bool:
        if c.text:  # llama.cpp's tools: compared as text (the speculative one may run a few tokens on)
            model = base_sp.target_model
            # with --ignore-eos llama.cpp never samples an end-of-generation token, where ggspec's plain
            # greedy takes it and goes on: the texts part there by design
            cut = next((k for k, t in enumerate(b.tokens) if model.is_eog(t)), len(b.tokens))
            want = prompt + model.detokenize(b.tokens[:cut])
            got = c.text
            n = min(len(want), len(got))
            return len(got) > len(prompt) and got[:n] == want[:n]
        return c.tokens == b.tokens
