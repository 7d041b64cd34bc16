"""Benchmark configurations: the matrix of axes, its baselines, and what is skipped and why.

Axes are comma lists, as in llama-bench (`-ctk f16,q8_0 --spec-draft-n-max 3,7`). Every
speculative configuration is paired with a `--no-spec` baseline that has the same target-side
settings (cache types, context size), so its speedup compares like with like. With `--native`,
llama.cpp's own loop of the same build runs every speculative configuration too, and llama.cpp's
own plain greedy (`native-baseline`, llama-completion) sits next to each `--no-spec` baseline; a
target-only benchmark (no draft) runs just those two plain rows.
"""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from ggspec.errors import InputError
from ggspec.runtime.context import ContextParams
from ggspec.speculative.models import PairConfig
from ggspec.speculative.planes import UNCAPPED, PlaneOptions
from ggspec.speculative.sampling import SamplerSettings

NO_FILE = Path()  # PairConfig.validate checks values, never files
N_BATCH = ContextParams.n_batch  # every configuration's logical batch (the verify batch must fit it)
NATIVE_MODES = ("immediate", "deferred")  # llama.cpp's own loop: upstream, and patch 0003's deferral
KINDS = ("spec", "baseline", "native", "native-baseline")


@dataclass(frozen=True)
class BenchConfig:
    kind: str  # one of KINDS: "spec", "baseline" (ggspec --no-spec), "native" (llama-speculative-simple),
    # "native-baseline" (llama.cpp's plain greedy, llama-completion)
    ctk: str = "f16"
    ctv: str = "f16"
    n_ctx: int = 4096
    n_max: int = 0  # 0 for baselines
    planes: str = ""  # "uncapped" or a number (hybrid targets); "" where it does not apply
    lead: str = ""  # "default", "auto" or a number; "" where it does not apply
    inject: str = ""  # pruned | deferred | immediate (ggspec); immediate | deferred (native)
    parallel: int = 1  # sequences decoded together in one engine (the prompts run this many at a time)
    temp: float = 0.0  # sampling temperature (0: greedy); the other sampler settings are the benchmark's
    adaptive: bool = False  # --spec-draft-n-max auto (n_max is its cap)
    tree: str = ""  # --spec-tree-budget as given (a number, auto, auto:N); "": the default (auto)
    # a native row's own llama.cpp type where the benchmark's is not llama.cpp's (suffix: each of
    # llama.cpp's n-gram types gets a row); "": the benchmark's type
    spec_type: str = ""

    @property
    def key(self) -> str:
        """Stable identity (used by --resume; parallel 1 is left out, as in files made before it)."""
        return "|".join(f"{k}={v}" for k, v in asdict(self).items()
                        if v not in ("", 0) and not (k == "parallel" and v == 1))

    @property
    def label(self) -> str:
        """Short human name: only what distinguishes configurations is worth reading."""
        parts = {"spec": [], "baseline": ["no-spec"], "native": ["llama.cpp"],
                 "native-baseline": ["llama.cpp", "no-spec"]}[self.kind]
        if self.spec_type:
            parts.append(self.spec_type)
        if self.speculative:
            parts.append(f"auto{self.n_max}" if self.adaptive else f"n{self.n_max}")
        parts.append(f"{self.ctk}/{self.ctv}")
        if self.n_ctx != Axes.n_ctx[0]:
            parts.append(f"-c {self.n_ctx}")
        if self.planes:  # hybrid targets only
            parts.append("planes uncapped" if self.planes == UNCAPPED else f"planes {self.planes} lead {self.lead}")
        if self.inject:
            parts.append(self.inject)
        if self.parallel != 1:
            parts.append(f"-np {self.parallel}")
        if self.sampled:
            parts.append(f"temp {self.temp:g}")
        if self.tree:
            parts.append(f"tree {self.tree}")
        return " ".join(parts)

    @property
    def speculative(self) -> bool:
        return self.kind in ("spec", "native")

    @property
    def sampled(self) -> bool:
        """Sampling (temperature > 0): outputs are compared in distribution, not token for token."""
        return self.temp > 0

    def baseline(self) -> "BenchConfig":
        """ggspec's --no-spec with the same target-side settings: every configuration's runs are
        paired with its runs (speedup, `identical`)."""
        return BenchConfig("baseline", ctk=self.ctk, ctv=self.ctv, n_ctx=self.n_ctx, parallel=self.parallel,
                           temp=self.temp)

    def solo(self) -> "BenchConfig":
        """The plain greedy reference every sequence is compared with: the greedy baseline at parallel 1."""
        return replace(self.baseline(), parallel=1, temp=0.0)

    def native_baseline(self) -> "BenchConfig":
        """llama.cpp's own plain decoding with the same target-side settings (--native)."""
        return BenchConfig("native-baseline", ctk=self.ctk, ctv=self.ctv, n_ctx=self.n_ctx, temp=self.temp)

    @property
    def plane_options(self) -> PlaneOptions:
        return PlaneOptions.parse(self.planes or None, self.lead or None)


@dataclass(frozen=True)
class Axes:
    """Comma-list values of every axis, as given on the command line."""

    ctk: tuple[str, ...] = ("f16",)
    ctv: tuple[str, ...] = ("f16",)
    n_ctx: tuple[int, ...] = (4096,)
    n_max: tuple[int | str, ...] = (15,)  # a number, or "auto:N" (the adaptive length capped at N)
    planes: tuple[str, ...] = (UNCAPPED,)
    lead: tuple[str, ...] = ("default",)
    inject: tuple[str, ...] = ("pruned",)
    parallel: tuple[int, ...] = (1,)
    temp: tuple[float, ...] = (0.0,)
    tree: tuple[str, ...] = ("",)  # token-tree budgets ("": the default)

    @property
    def size(self) -> int:
        return len(list(itertools.product(*asdict(self).values())))

    @property
    def is_matrix(self) -> bool:
        return any(len(v) > 1 for v in asdict(self).values())


def split_list(flag: str, text: str | None, default: tuple, cast=str) -> tuple:
    """'a,b,c' -> ('a', 'b', 'c'), cast to ints where needed; one line of error otherwise."""
    if text is None:
        return default
    items = [t.strip() for t in str(text).split(",")]
    if not all(items):
        raise InputError(f"{flag} {text}: empty item in the list")
    try:
        values = tuple(cast(t) for t in items)
    except ValueError:
        also = " (or auto, auto:N)" if flag == "--spec-draft-n-max" else ""
        raise InputError(f"{flag} {text}: expected a comma list of numbers{also}") from None
    if len(set(values)) != len(values):
        raise InputError(f"{flag} {text}: a value is listed twice")
    return values


def n_max_value(item: int | str) -> tuple[int, bool]:
    """An item of the draft-length axis: (length or cap, adaptive)."""
    if isinstance(item, int):
        return item, False
    return int(item.removeprefix("auto:")), True


def n_max_item(text: str, default: int) -> int | str:
    """A draft-length axis item as typed: "7" -> 7, "auto" -> "auto:<default>", "auto:5" -> "auto:5"
    (ValueError otherwise: split_list's one line)."""
    from ggspec.speculative.models import parse_n_max  # noqa: PLC0415

    if not text.strip().startswith("auto"):
        return int(text)  # (its range is checked with the other axes)
    try:
        value, adaptive = parse_n_max(text)
    except InputError:
        raise ValueError(text) from None
    value = default if value is None else value
    return f"auto:{value}" if adaptive else value


def check_axes(axes: Axes) -> None:
    """Values that are wrong whatever they are combined with: one error before anything runs."""
    # the library's own rules (PairConfig.validate), one value at a time: its errors name the field
    for values, make in ((axes.ctk, lambda v: PairConfig(NO_FILE, ctx=ContextParams(type_k=v))),
                         (axes.ctv, lambda v: PairConfig(NO_FILE, ctx=ContextParams(type_v=v))),
                         (axes.inject, lambda v: PairConfig(NO_FILE, inject=v)),
                         (axes.n_max, lambda v: PairConfig(NO_FILE, n_max=n_max_value(v)[0])),
                         (axes.parallel, lambda v: PairConfig(NO_FILE, parallel=v)),
                         (axes.temp, lambda v: PairConfig(NO_FILE, sampling=SamplerSettings(temp=v)))):
        for v in values:
            make(v).validate()
    for v in axes.n_ctx:
        if v < 64:
            raise InputError(f"too small for a benchmark (at least 64, got {v})", field="n_ctx")
    for p in axes.planes:
        for lead in axes.lead:
            PlaneOptions.parse(p, lead)  # spelling only; ranges depend on n_max (skipped per config)


@dataclass(frozen=True)
class Skipped:
    label: str
    reason: str


def expand(axes: Axes, recurrent: bool, n_tokens: int, native: bool = False,
           profile_len: int | None = None, n_max_limit: int | None = None,
           speculative: bool = True, dflash: bool = True,
           native_loop: bool | None = None, native_n_max: int | None = None,
           native_types: tuple[tuple[str, int | None], ...] = ()) -> tuple[list[BenchConfig], list[Skipped]]:
    """Every valid speculative configuration of the matrix (plus llama.cpp's own loop and plain
    greedy where asked), and the invalid combinations with the reason each was skipped. n_tokens:
    the longest prompt plus the tokens to generate (the context must hold them and a draft block).
    `speculative=False` (no draft): only the cache-type and context axes apply, and only the
    native baselines are configurations of their own (ggspec's baseline runs paired with them).
    `dflash=False` (draft-mtp, ngram-simple): no injection axis; `native_loop` (default: `dflash`):
    llama.cpp's own loop rows (DFlash: one per injection mode, draft-mtp: one). Parallel levels
    above 1 run ggspec's engine only (llama.cpp's tools decode one sequence). `native_n_max`: the one
    draft length llama.cpp's loop drafts with this type (ngram-cache: 8, whatever it is told).
    `native_types`: for a type llama.cpp does not have (suffix), llama.cpp's rows are these types
    instead (its n-gram types, each with the one length its loop drafts, if it has one)."""
    native_loop = dflash if native_loop is None else native_loop
    check_axes(axes)
    injects = axes.inject if dflash else ("",)
    configs: list[BenchConfig] = []
    skipped: list[Skipped] = []
    if speculative:
        for ctk, ctv, n_ctx, item, planes, lead, inject, par, temp, tree in itertools.product(
                axes.ctk, axes.ctv, axes.n_ctx, axes.n_max, axes.planes, axes.lead, injects, axes.parallel, axes.temp,
                axes.tree):
            n_max, adaptive = n_max_value(item)
            cfg = BenchConfig("spec", ctk, ctv, n_ctx, n_max, planes if recurrent else "", lead if recurrent else "",
                              inject, par, max(temp, 0.0), adaptive, tree)
            reason = _why_invalid(cfg, recurrent, planes, lead, profile_len, n_tokens, n_max_limit)
            if reason:
                np_ = f" -np {par}" if par != 1 else ""
                t = f" temp {temp:g}" if temp > 0 else ""
                skipped.append(Skipped(f"n{n_max} {ctk}/{ctv} -c {n_ctx} planes {planes} lead {lead} {inject}".rstrip()
                                       + np_ + t, reason))
            elif cfg not in configs:
                configs.append(cfg)
    else:
        for par in axes.parallel:
            if par != 1:
                skipped.append(Skipped(f"no-spec -np {par}", "a target-only benchmark compares plain greedy with "
                                                              "llama.cpp's, one sequence at a time: parallel 1 only"))
        for ctk, ctv, n_ctx, temp in itertools.product(axes.ctk, axes.ctv, axes.n_ctx, axes.temp):
            cfg = BenchConfig("baseline", ctk, ctv, n_ctx, temp=max(temp, 0.0))
            if n_ctx < n_tokens + 1:
                skipped.append(Skipped(cfg.label + f" -c {n_ctx}", f"-c {n_ctx} is too small: the longest prompt "
                                                                   f"plus -n needs {n_tokens + 1}"))
            elif cfg not in configs:
                configs.append(cfg)
    if native:
        with_native: list[BenchConfig] = []
        for cfg in configs:  # llama.cpp's plain greedy first: it runs (and reports) next to ggspec's
            if cfg.parallel == 1 and cfg.native_baseline() not in with_native:
                with_native.append(cfg.native_baseline())
            if cfg.kind == "spec":
                with_native.append(cfg)
        for cfg in configs:
            if cfg.kind != "spec":
                continue
            if cfg.parallel != 1:
                skipped.append(Skipped(f"llama.cpp {cfg.label}", "llama.cpp's own loop decodes one sequence: "
                                                                  "--native rows are parallel 1 only"))
                continue
            if cfg.adaptive:  # llama.cpp's loop has no adaptive length: its row drafts the cap, fixed
                cfg = replace(cfg, adaptive=False)
            if native_types:
                for name, fixed in native_types:
                    nat = replace(cfg, kind="native", planes="", lead="", inject="", tree="", spec_type=name,
                                  n_max=fixed or cfg.n_max)
                    if nat not in with_native:
                        with_native.append(nat)
                continue
            if not native_loop:
                skipped.append(Skipped(f"llama.cpp {cfg.label}", "llama.cpp's own loop rows are run for DFlash "
                                                                  "and MTP drafts only"))
                continue
            if native_n_max is not None and cfg.n_max != native_n_max:
                skipped.append(Skipped(f"llama.cpp {cfg.label}", f"llama.cpp's loop drafts {native_n_max} tokens "
                                                                  f"with this type whatever the draft length"))
                continue
            for mode in NATIVE_MODES if dflash else ("",):
                nat = replace(cfg, kind="native", planes="", lead="", inject=mode, tree="")  # (no trees in llama.cpp)
                if nat not in with_native:
                    with_native.append(nat)
        configs = with_native
    else:
        configs = [c for c in configs if c.kind == "spec"]
    return configs, _dedup(skipped)


def _why_invalid(cfg: BenchConfig, recurrent: bool, planes: str, lead: str, profile_len: int | None,
                 n_tokens: int, n_max_limit: int | None) -> str:
    if n_max_limit is not None and cfg.n_max > n_max_limit:
        return f"the draft's block allows at most {n_max_limit} draft tokens per step"
    if not recurrent and (planes != UNCAPPED or lead != "default"):
        return "recurrent planes apply to hybrid targets only (this target has no recurrent layers)"
    if recurrent and planes == UNCAPPED and lead != "default":
        return "uncapped planes keep every state: the lead changes nothing"
    try:
        cfg.plane_options.check(cfg.n_max) if recurrent else None
    except InputError as exc:
        return str(exc)
    if cfg.n_ctx < n_tokens + cfg.n_max + 1:
        return f"-c {cfg.n_ctx} is too small: the longest prompt plus -n needs {n_tokens + cfg.n_max + 1}"
    if cfg.parallel > 1:
        need = cfg.parallel * (n_tokens + cfg.n_max + 1)
        if cfg.n_ctx < need:  # one cache for all sequences: fewer would run at once than asked
            return (f"-c {cfg.n_ctx} is too small for -np {cfg.parallel}: {cfg.parallel} sequences of the longest "
                    f"prompt plus -n need {need}")
        if cfg.parallel * (cfg.n_max + 1) > N_BATCH:
            return (f"-np {cfg.parallel} x (n_max {cfg.n_max} + 1) verify rows exceed the batch of {N_BATCH} "
                    "tokens")
    if profile_len is not None and cfg.sampled:
        return "an acceptance profile replays the greedy output: temperature 0 only"
    if profile_len and profile_len != cfg.n_max + 1:  # 0: a built-in profile, fitted to every n_max
        return (f"the acceptance profile has {profile_len} entries; --spec-draft-n-max {cfg.n_max} "
                f"needs {cfg.n_max + 1}")
    return ""


def _dedup(skipped: list[Skipped]) -> list[Skipped]:
    seen, out = set(), []
    for s in skipped:
        if s not in seen:
            seen.add(s)
            out.append(s)
    return out
