"""The memory fit: does a configuration fit the memory it will run in, measured before anything
is allocated; if not, a smaller context that does, or a one-line refusal.

llama.cpp's own fit (common/fit.cpp, `--fit`) loads the model with `no_alloc` (metadata only,
every allocation simulated) and reads back what the context would take on each device. It fits
one model and at most one extra (a draft model, or an MTP context), and leaves host memory out.
A speculative configuration is more: the target's context with its recurrent rollback planes,
the draft's context (a draft model's, an EAGLE3 head's, a DFlash draft's with its injected
features, an MTP head's), each with its own caches and compute buffers, and the verify batch
that sizes the target's compute buffer. So ggspec's fit builds the whole engine dry, the same
contexts with the same parameters as the engine it will run (speculative.assembly), and sums
llama.cpp's own breakdown of each, by device and for host memory (runtime.footprint). The
measure is llama.cpp's, not a model of it: it matches what the loaded contexts report.

What is compared with what: each device's total against what the device has free, less a
margin (llama.cpp's: 1 GiB); host memory (weights, caches and compute buffers of everything on
the CPU) against the memory the kernel says is available. When something does not fit and the
context size was not given, the context shrinks (as llama.cpp's fit, which changes only a
context size left to it): memory is affine in the context size, so two measures give the
largest size that fits, which a third confirms. Where no context fits (the weights, the verify
batch's compute buffers or the recurrent states per sequence fill the memory), what else was
left to the fit gives way, least costly first: a hybrid target's rollback planes (capped planes
replay instead: slower, never wrong), then the parallel sequences (a server's slots), each
halved in turn, the context fitted again at each. A given size, parallel count or plane count is
never changed behind the user's back: the refusal says what fits instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from ggspec.errors import InputError, LlamaError
from ggspec.runtime import Context, footprint
from ggspec.runtime.footprint import HOST, Footprint, Use
from ggspec.runtime.memory import mem_available
from ggspec.speculative.assembly import assemble
from ggspec.speculative.models import Models, PairConfig, draft_lengths
from ggspec.speculative.planes import PlaneOptions
from ggspec.speculative.rules.calibration import calibrates_plain_step, plain_step_params

DEVICE_MARGIN = 1 << 30  # bytes left free on each device (llama.cpp's --fit-target default)
HOST_MARGIN = 256 << 20  # ... and of the host's available memory (the process's own, Python's)
CTX_STEP = 256  # llama.cpp pads a context to 256 cells


@dataclass
class Fit:
    """What the fit measured and decided."""

    cfg: PairConfig  # the configuration to run (ctx.measured set; n_ctx shrunk where it had to be)
    footprint: Footprint  # what it takes, by device
    available: dict[str, int]  # what each device (and HOST) has for it, margins taken off
    notes: list[str] = field(default_factory=list)  # what the fit changed, for the user
    changed: list[str] = field(default_factory=list)  # the PairConfig fields it changed (n_ctx, planes, parallel)

    def over(self, fp: Footprint | None = None) -> dict[str, int]:
        """Bytes over what is available, by device (only those over)."""
        fp = fp or self.footprint
        return {name: fp.total(name) - self.available[name] for name in fp.devices
                if name in self.available and fp.total(name) > self.available[name]}


def measure(cfg: PairConfig, *, pools: bool = True) -> Footprint:
    """What cfg's engine would take on each device: its models loaded dry, its contexts assembled
    dry from the same parameters (llama.cpp's breakdown; weights counted once per model), and
    (`pools`) what their prepared-plan pools may add once they run (_pool_bound)."""
    return _dry(cfg, pools)[0]


def _dry(cfg: PairConfig, pools: bool = True) -> tuple[Footprint, dict[str, int]]:
    """measure(cfg), and the bytes each device (and HOST) may give it: free less a margin."""
    uses, n_max, plan_pools, free = _assembled(cfg)
    fp = Footprint()
    for ctx_uses in uses:
        for name, use in ctx_uses.items():
            fp.add(name, use)
    if pools:
        for name, use in _pool_bound(cfg, uses, n_max, plan_pools).items():
            fp.add(name, use)
    room = {name: max(f - DEVICE_MARGIN, 0) for name, (f, _total) in free.items() if name != HOST}
    host = mem_available()
    room[HOST] = max((host if host is not None else free.get(HOST, (0, 0))[0]) - HOST_MARGIN, 0)
    return fp, room


def _assembled(cfg: PairConfig):
    """Each context's bytes by device (the target's first), the step's longest draft, each
    context's plan pool (plans, their largest ubatch) and what the devices have free."""
    with Models(cfg, dry=True) as models:
        parts = assemble(models, cfg, models.plan, keep_state=False, warnings=[])
        try:
            contexts = [c for c in (parts.target, parts.draft_ctx) if c is not None]
            uses = footprint.context_uses(contexts)
            plan_pools = [ctx.plan_pool for ctx in contexts]
            n_max = parts.n_max
            if calibrates_plain_step(cfg, models.plan):
                uses.append(_calibration_use(parts.target, cfg.parallel))
        finally:
            parts.close()
        free = footprint.free_memory(models.target)
    return uses, n_max, plan_pools, free


def _calibration_use(target: Context, n_seqs: int) -> dict[str, Use]:
    """The bare context calibration measures a plain step on (the last context: it lives beside
    the engine's for a second, once per pair and machine; the target's weights are counted)."""
    ctx = Context(target.model, plain_step_params(target.params, n_seqs), what="calibration")
    try:
        return {name: Use(0, u.context, u.compute) for name, u in footprint.context_use(ctx).items()}
    finally:
        ctx.close()


def _shape(cfg: PairConfig) -> tuple[int, bool]:
    """The step's longest draft (0: no speculation) and whether the target keeps rollback
    planes (a speculating hybrid), from the files alone."""
    with Models(cfg, dry=True) as models:
        n_max, _ = draft_lengths(cfg, models.plan, []) if models.plan.types else (0, [])
        return n_max, n_max > 0 and models.target.is_recurrent


def _pool_bound(cfg: PairConfig, uses, n_max: int, plan_pools) -> dict[str, Use]:
    """What the contexts' prepared-plan pools (patch 0012) may add once they run. Each parked
    plan is a scheduler whose compute buffer holds one step's graph: at most a verify's rows and
    the pool's largest ubatch (prompts run in the reserved scheduler). The same contexts
    reserved at that ubatch size measure it from above (llama.cpp reserves its worst case:
    every row an output); a pool holds `plans` of them. Patch 0018 counts the parked buffers in
    llama.cpp's breakdown, so what a run reports can be checked against this."""
    plans = max((p for p, _ in plan_pools), default=0)
    if not plans:
        return {}
    tokens = min((n_max + 1) * cfg.parallel, max(t for _, t in plan_pools), cfg.ctx.n_ubatch, cfg.ctx.n_batch)
    try:
        small, _, _, _ = _assembled(replace(cfg, ctx=replace(cfg.ctx, n_ubatch=tokens)))
    except InputError:  # a draft block wider than the pool's ubatch: its graphs scale by rows instead
        small = [{name: Use(compute=u.compute * tokens // cfg.ctx.n_ubatch) for name, u in ctx_uses.items()}
                 for ctx_uses in uses]
    out: dict[str, Use] = {}
    for (ctx_plans, _), ctx_uses in zip(plan_pools, small):
        for name, use in ctx_uses.items():
            out.setdefault(name, Use()).__iadd__(Use(compute=ctx_plans * use.compute))
    return out


def fit(cfg: PairConfig, *, n_ctx_given: bool, parallel_given: bool = True,
        room: dict[str, int] | None = None) -> Fit:
    """Measure cfg against free memory; shrink what was left to the fit (the context size, then
    a hybrid's rollback planes and the parallel sequences, see the module docstring); else raise
    an InputError saying what it needs, what is free and what would fit. `room`: bytes to fit
    into by device name (HOST: host memory) instead of what is free less the margins."""
    try:
        return _fit_context(cfg, n_ctx_given, room)
    except DoesNotFit as refusal:
        n_max, planes = _shape(cfg)
        fewer = _fewer(cfg, n_max, planes, parallel_given)
        if not fewer:
            raise
        least = fewer[-1]
        if not _fits(least, n_ctx_given, room):  # not even the least of them: say so at once
            raise InputError(f"{refusal}; nor with {_describe(least, n_max, planes)}", field="n_ctx") from None
        for smaller in fewer:
            try:
                inner = _fit_context(smaller, n_ctx_given, room)
            except DoesNotFit:
                continue
            note = (f"{_describe(cfg, n_max, planes)} do not fit ({refusal.where}): "
                    f"using {_describe(smaller, n_max, planes)}")
            changed = [f for f in ("planes", "parallel") if getattr(smaller, f) != getattr(cfg, f)]
            return Fit(inner.cfg, inner.footprint, inner.available, [note, *inner.notes], changed + inner.changed)
        raise


class DoesNotFit(InputError):
    """cfg does not fit with the context left to it (`where`: what each device needs)."""

    def __init__(self, message: str, where: str) -> None:
        super().__init__(message, field="n_ctx")
        self.where = where


def _fewer(cfg: PairConfig, n_max: int, planes: bool, parallel_given: bool) -> list[PairConfig]:
    """The configurations with fewer rollback planes or parallel sequences than cfg (only what
    was left to the fit: planes where the target keeps them and none were given), least costly
    first: fewer planes before fewer sequences; the least of all last."""
    now = cfg.planes.n_planes(n_max)
    plane_counts = _halvings(now, 2) if planes and not cfg.planes.given else [now]
    sequences = [cfg.parallel] if parallel_given else _halvings(cfg.parallel, 1)
    out = []
    for par in sequences:
        for k in plane_counts:
            opts = cfg.planes if k == now else PlaneOptions(planes=k)
            if (par, k) != (cfg.parallel, now):
                out.append(replace(cfg, parallel=par, planes=opts))
    return out


def _halvings(n: int, least: int) -> list[int]:
    """n, n / 2, ..., down to `least` (always last, unless n is below it)."""
    out = [n]
    while out[-1] > least:
        out.append(max(out[-1] // 2, least))
    return out


def _describe(cfg: PairConfig, n_max: int, planes: bool) -> str:
    seqs = f"{cfg.parallel} parallel sequence{'s' if cfg.parallel != 1 else ''}"
    return seqs + (f" with {cfg.planes.n_planes(n_max)} rollback planes" if planes else "")


def _fits(cfg: PairConfig, n_ctx_given: bool, room: dict[str, int] | None) -> bool:
    try:
        _fit_context(cfg, n_ctx_given, room)
        return True
    except InputError:
        return False


def _fit_context(cfg: PairConfig, n_ctx_given: bool, room: dict[str, int] | None) -> Fit:
    """fit() with the context size alone left to it."""
    try:
        fp, free = _dry(cfg)
    except LlamaError:
        # too large for even llama.cpp's bookkeeping of a context (its cells' metadata is host
        # memory, no_alloc or not): the metadata estimate says what fits, from above
        with Models(cfg, dry=True) as models:
            models.check_memory(cfg)
        raise
    result = Fit(replace(cfg, ctx=replace(cfg.ctx, measured=True)), fp, {**free, **(room or {})})
    over = result.over()
    if not over:
        return result
    floor, low = _smallest(cfg)
    n_ctx = _fits_at(cfg, result, floor, low)
    if n_ctx is not None:  # the estimate, measured (and stepped down) so the refusal's hint is exact too
        shrunk = replace(result.cfg, ctx=replace(result.cfg.ctx, n_ctx=n_ctx))
        fp = measure(shrunk)
        while result.over(fp) and n_ctx - CTX_STEP >= floor:  # (nearly affine: this rarely loops)
            n_ctx -= CTX_STEP
            shrunk = replace(shrunk, ctx=replace(shrunk.ctx, n_ctx=n_ctx))
            fp = measure(shrunk)
        if result.over(fp):
            n_ctx = None
    if n_ctx_given or n_ctx is None:
        raise DoesNotFit(_refusal(result, over, n_ctx), _where(result, over))
    note = (f"context size {cfg.ctx.n_ctx} does not fit ({_where(result, over)}): "
            f"using {n_ctx}, which needs {_summary(fp)}")
    return Fit(shrunk, fp, result.available, [note], ["n_ctx"])


def _smallest(cfg: PairConfig) -> tuple[int, Footprint | None]:
    """The smallest context size the loop takes (a padded step of cells that holds a prompt token
    and every sequence's verify block) and what it needs (None: cfg's size is already that)."""
    floor = CTX_STEP
    while floor < cfg.ctx.n_ctx:
        try:
            return floor, measure(replace(cfg, ctx=replace(cfg.ctx, n_ctx=floor)))
        except InputError:  # too small for the verify batch (assembly.check_options)
            floor *= 2
    return cfg.ctx.n_ctx, None


def _fits_at(cfg: PairConfig, result: Fit, floor: int, low: Footprint | None) -> int | None:
    """The largest context size (a multiple of CTX_STEP) the devices hold, from the affine line
    through the measures at `floor` and at cfg's size; None when not even `floor` fits."""
    if low is None or result.over(low):
        return None
    best = cfg.ctx.n_ctx
    for name, room in result.available.items():
        hi_b, lo_b = result.footprint.total(name), low.total(name)
        if hi_b <= room or hi_b <= lo_b:
            continue
        per_cell = (hi_b - lo_b) / (cfg.ctx.n_ctx - floor)
        best = min(best, floor + int((room - lo_b) / per_cell))
    return max(floor, best // CTX_STEP * CTX_STEP)


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def _summary(fp: Footprint) -> str:
    return ", ".join(f"{_gib(fp.total(name))} on {name}" for name in fp.devices)


def _where(result: Fit, over: dict[str, int]) -> str:
    parts = []
    for name in over:
        use = result.footprint.devices[name]
        parts.append(f"{name} needs {_gib(use.total)} (weights {_gib(use.model)}, caches {_gib(use.context)}, "
                     f"compute {_gib(use.compute)}) of {_gib(result.available[name])} available")
    return "; ".join(parts)


def _refusal(result: Fit, over: dict[str, int], fits: int | None) -> str:
    n_ctx = result.cfg.ctx.n_ctx
    hint = (f"a context of at most {fits} fits" if fits is not None and fits < n_ctx else
            "no context fits beside the weights: fewer parallel sequences, a smaller cache type, fewer "
            "layers on the device or a smaller model")
    return f"context size {n_ctx} does not fit: {_where(result, over)}; {hint}"
