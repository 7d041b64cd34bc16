"""From the shared options to a PairConfig: the models, the devices, a named pair's
recommendations, and the memory fit's notes.

`base_config` is what `run`, `serve` and `bench` build alike (checked before any model is read,
each error naming its field); `pair_config` adds, for `run` and `serve`, the settings bench
sweeps instead, with a named pair's recommendations, and the memory fit.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from ggspec.cli.console import err
from ggspec.cli.options import DEFAULTS, FLAGS, Shared
from ggspec.cli.parsers import ADAPTIVE, SpecTypes, resolved_layers
from ggspec.errors import InputError
from ggspec.speculative.models import PairConfig
from ggspec.speculative.types import registry


def detected_type(target: Path, draft: Path | None = None):
    """The draft type the files call for when no --spec-type is given (the registry's detection,
    as `Models` does it), or None for plain decoding."""
    from ggspec.runtime.gguf_meta import read_meta

    return registry.detected(read_meta(target, "target"), read_meta(draft, "draft") if draft is not None else None)


def target_drafts_alone(target: Path) -> bool:
    """Whether the target file drafts for itself without a draft file (a target with an MTP block)."""
    return detected_type(target) is not None


def pick(given, recommended: dict, key: str, default=None):
    """A flag the user gave wins over the pair's recommendation, which wins over `default`."""
    if given is not None:
        return given
    return recommended.get(key, default)


def recommended(rec: dict, key: str):
    """The pair's recommendation for a setting, else ggspec's default."""
    return rec.get(key, DEFAULTS[key])


def resolve_models(shared: Shared, plain: bool = False) -> tuple[Path, Path | None, dict]:
    """Target, draft (None when it is not used) and the recommended settings (empty unless a
    named pair is used). `plain`: no drafting wanted at all (run --no-spec)."""
    if shared.pair is not None:
        if shared.model is not None or shared.draft is not None:
            raise InputError("--pair replaces -m/-md: give one or the other")
        from ggspec.catalogue.pairs import get_entry, resolve

        entry = get_entry(shared.pair)
        files = resolve(entry, shared.models_dir)
        return files.target, files.draft if shared.needs_draft else None, entry.settings
    if shared.model is None:
        raise InputError("no target model: give -m FILE (or --pair NAME)")
    optional = shared.spec_type is not None and shared.spec_type.draft_file_optional
    if shared.draft is None and shared.needs_draft and not plain and not optional and shared.spec_type is not None:
        raise InputError(f"no draft model: --spec-type {shared.spec_type.text} drafts with one: give -md FILE")
    return shared.model, shared.draft if shared.needs_draft else None, {}


def with_lone_default(shared: Shared, target: Path, draft: Path | None) -> Shared:
    """`shared` with what a lone model drafts with by default: with no draft file, no --spec-type,
    no --no-spec and a target that does not draft for itself (an MTP block), the text drafter
    (registry.LONE_MODEL) under the adaptive length, which verifies drafts only where they pay;
    `note_lone_default` says so once the options are checked."""
    if shared.plain or shared.spec_type is not None or draft is not None or target_drafts_alone(target):
        return shared
    return replace(shared, spec_type=SpecTypes.of(registry.get(registry.LONE_MODEL)), lone_default=True)


def note_lone_default(shared: Shared) -> None:
    """The note a run gets when it drafts with the lone-model default (with_lone_default)."""
    if shared.lone_default:
        err.print(f"[dim]note:[/] a lone model drafts from the text itself ({registry.LONE_MODEL}), verifying "
                  "drafts only where they pay; --spec-type none decodes plainly", soft_wrap=True, highlight=False)


def drafter_reason(shared: Shared, cfg: PairConfig) -> str:
    """Why a run drafts with what it does, in words (/props' `speculative.drafter`)."""
    if shared.plain:
        return "none: plain decoding asked for (--no-spec or --spec-type none)"
    if shared.spec_type is not None:
        return "given (--spec-type)"
    if cfg.spec_type == registry.LONE_MODEL and cfg.draft is None:
        return "a lone model's default: drafts from the text, verified only where it pays"
    return "detected from the files"


def placement(shared: Shared):
    """The devices, and the target and draft layers to offload (all of the target's when --rpc
    adds devices; the draft's as the target's when not given)."""
    from ggspec.runtime.devices import Placement

    where = Placement.parse(shared.split_mode, shared.rpc, shared.tensor_split, shared.mirror_output,
                           shared.rpc_timeout)
    ngl = resolved_layers(shared.n_gpu_layers, devices=where.multi_device)
    if ngl is None:
        ngl = -1 if where.multi_device else 0
    ngld = resolved_layers(shared.n_gpu_layers_draft, devices=where.multi_device)
    return where, ngl, ngl if ngld is None else ngld


def base_config(shared: Shared, target: Path, draft: Path | None, *, plain: bool = False, **settings) -> PairConfig:
    """The PairConfig of the shared options; `settings`: PairConfig fields (n_max, planes, inject,
    parallel, ctx) a command sets from its own or per-configuration values. Checked (each error
    names its field) before any model is read."""
    from ggspec.runtime import ContextParams
    from ggspec.speculative.rules.tree_budget import parse_tree_budget

    if shared.fixed_block and shared.no_draft:
        raise InputError("--dflash asks for a block drafter and --no-draft leaves the draft unused: give one of them")
    where, ngl, ngld = placement(shared)
    settings.setdefault("ctx", ContextParams(n_threads=shared.threads, flash_attn=shared.flash_attn))
    if shared.tree_budget is not None:
        settings["tree_budget"], settings["tree_auto"] = parse_tree_budget(shared.tree_budget)
    spec_type = None if plain or shared.plain or shared.spec_type is None else shared.spec_type.text
    cfg = PairConfig(target=target, draft=None if plain else draft, use_draft=not plain and not shared.no_draft,
                     fixed_block=not plain and shared.fixed_block, spec_type=spec_type,
                     spec_select=shared.spec_select, plan_pool=shared.plan_pool, p_min=shared.p_min,
                     n_min=shared.n_min, spec_options=registry.options_from_flat(shared.type_options),
                     sampling=shared.sampling, n_gpu_layers=ngl, n_gpu_layers_draft=ngld, placement=where,
                     mmap=not shared.no_mmap, **settings)
    cfg.validate()
    return cfg


def pair_config(shared: Shared, *, parallel: int, parallel_given: bool = True) -> PairConfig:
    """`run`'s and `serve`'s PairConfig: the models and every option, a flag winning over the
    pair's recommendation; a target-only pair runs plain, with a note. With --fit (the default)
    it is measured against free memory first (speculative.rules.memory_fit): what was not given
    (a context size without -c, rollback planes, parallel sequences where not `parallel_given`)
    shrunk to what fits, with a note."""
    from ggspec.runtime import ContextParams
    from ggspec.speculative.planes import PlaneOptions

    plain = shared.plain
    length = shared.n_max or ADAPTIVE  # not given: the adaptive length, capped at the pair's (else the default)
    target, draft, rec = resolve_models(shared, plain=plain)
    shared = with_lone_default(shared, target, draft)
    cfg = base_config(
        shared, target, draft, plain=plain,
        n_max=pick(length.cap, rec, "n_max"),  # None: the default, fitted to the draft without a warning
        adaptive=length.adaptive, parallel=parallel,
        ctx=ContextParams(n_ctx=pick(shared.n_ctx, rec, "ctx", DEFAULTS["ctx"]), n_batch=shared.n_batch,
                          n_ubatch=shared.n_ubatch, n_threads=shared.threads,
                          type_k=pick(shared.type_k, rec, "ctk", DEFAULTS["ctk"]),
                          type_v=pick(shared.type_v, rec, "ctv", DEFAULTS["ctv"]), flash_attn=shared.flash_attn,
                          swa_full=shared.swa_full),
        planes=PlaneOptions.parse(pick(shared.rs_planes, rec, "planes"), pick(shared.rs_lead, rec, "lead")),
        inject=shared.inject if shared.inject is not None else DEFAULTS["inject"],
    )
    note_lone_default(shared)
    if not shared.fit:
        return cfg
    return fitted(cfg, n_ctx_given=shared.n_ctx is not None, parallel_given=parallel_given)


def fitted(cfg: PairConfig, *, n_ctx_given: bool, parallel_given: bool = True) -> PairConfig:
    """cfg as the memory fit leaves it, what it changed printed as notes."""
    from ggspec.speculative.rules.memory_fit import fit

    result = fit(cfg, n_ctx_given=n_ctx_given, parallel_given=parallel_given)
    if result.notes:
        flags = ", ".join(FLAGS[f] for f in result.changed)
        for line in result.notes:
            err.print(f"[yellow]note:[/] {line}", soft_wrap=True, highlight=False)
        err.print(f"[yellow]note:[/] {flags} set {'it' if len(result.changed) == 1 else 'them'}; "
                  "--no-fit keeps what was asked", soft_wrap=True, highlight=False)
    return result.cfg
