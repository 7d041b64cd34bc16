"""`ggspec run` and `ggspec serve`: the PairConfig of their flags."""

from __future__ import annotations

from ggspec import cli_options as opts
from ggspec.console import err


def pair_config(shared: opts.Shared, *, plain: bool, n_gpu_layers_draft: int | None, n_max: str | None,
                parallel: int, n_ctx: int | None, n_batch: int, n_ubatch: int, type_k: str | None,
                type_v: str | None, flash_attn: str, inject: str | None, rs_planes: str | None, rs_lead: str | None,
                fit: bool = True, parallel_given: bool = True):
    """The models and the PairConfig of the flags, a flag winning over the pair's recommendation;
    a target-only pair runs plain, with a note. `fit`: measured against free memory first
    (speculative.rules.memory_fit): what was not given (a context size without -c, rollback planes, parallel
    sequences where not `parallel_given`) shrunk to what fits, with a note."""
    from ggspec.runtime import ContextParams
    from ggspec.speculative.models import parse_n_max
    from ggspec.speculative.planes import PlaneOptions

    # no length given: the adaptive length, capped at the pair's recommendation (else the default)
    cap, adaptive = parse_n_max(n_max) if n_max is not None else (None, True)
    target, draft, rec = shared.resolve_models(plain=plain)
    if draft is None and shared.needs_draft and not plain and shared.pair is not None \
            and not opts.target_drafts_alone(target):  # a target-only pair (its draft is not made yet)
        err.print(f"[yellow]note:[/] pair '{shared.pair}' has no draft model yet: plain decoding", soft_wrap=True)
    cfg = shared.pair_config(
        target, draft, plain=plain, n_gpu_layers_draft=n_gpu_layers_draft,
        n_max=opts.pick(cap, rec, "n_max"),  # None: the default, fitted to the draft without a warning
        adaptive=adaptive, parallel=parallel,
        ctx=ContextParams(n_ctx=opts.pick(n_ctx, rec, "ctx", opts.DEFAULTS["ctx"]), n_batch=n_batch,
                          n_ubatch=n_ubatch, n_threads=shared.threads,
                          type_k=opts.pick(type_k, rec, "ctk", opts.DEFAULTS["ctk"]),
                          type_v=opts.pick(type_v, rec, "ctv", opts.DEFAULTS["ctv"]), flash_attn=flash_attn),
        planes=PlaneOptions.parse(opts.pick(rs_planes, rec, "planes"), opts.pick(rs_lead, rec, "lead")),
        inject=inject if inject is not None else opts.DEFAULTS["inject"],
    )
    return fitted(cfg, n_ctx_given=n_ctx is not None, parallel_given=parallel_given) if fit else cfg


def fitted(cfg, *, n_ctx_given: bool, parallel_given: bool = True):
    """cfg as the memory fit leaves it, what it changed printed as notes."""
    from ggspec.speculative.rules.memory_fit import fit

    result = fit(cfg, n_ctx_given=n_ctx_given, parallel_given=parallel_given)
    if result.notes:
        flags = ", ".join(opts.FLAGS[f] for f in result.changed)
        for line in result.notes:
            err.print(f"[yellow]note:[/] {line}", soft_wrap=True, highlight=False)
        err.print(f"[yellow]note:[/] {flags} set {'it' if len(result.changed) == 1 else 'them'}; "
                  "--no-fit keeps what was asked", soft_wrap=True, highlight=False)
    return result.cfg
