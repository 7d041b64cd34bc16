"""From `ggspec bench`'s options to a Plan: a new benchmark's settings and axes, or a --resume.

The checks here word their errors with the flags they are about, as the rest of the bench package
does (`configs.split_list`, `session.parse_profile`): a benchmark's settings are its flags.
`resume_conflicts` is the guard of `--resume`: a resumed benchmark runs with its saved settings, so
any setting given with it is refused.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from ggspec.bench.session import Plan
from ggspec.cli import config
from ggspec.cli import options as opts
from ggspec.cli.parsers import SpecTypes
from ggspec.errors import InputError
from ggspec.speculative.rules.tree_budget import parse_tree_budget
from ggspec.speculative.sampling import concrete_seed
from ggspec.speculative.types import registry


@dataclass(frozen=True)
class AxisFlags:
    """bench's comma-list options as given (None: not given; opts.Shared.swept, by the table's
    field names); each becomes an axis of `Axes`."""

    n_max: str | None = None
    parallel: str | None = None
    type_k: str | None = None
    type_v: str | None = None
    n_ctx: str | None = None
    rs_planes: str | None = None
    rs_lead: str | None = None
    inject: str | None = None
    temp: str | None = None
    tree_budget: str | None = None


def _tree_item(text: str) -> str:
    """One --spec-tree-budget value of bench's list, checked (parse_tree_budget's error)."""
    parse_tree_budget(text)
    return text.strip().lower()


def resume_conflicts(shared: opts.Shared, axes: AxisFlags, prompts: Path | None, profile: str | None) -> list[str]:
    """The flags given together with --resume (each changes a saved setting), in this order."""
    s, a, sampling = shared, axes, shared.sampling
    flags = (("-m", s.model), ("-md", s.draft), ("--pair", s.pair), ("--prompts", prompts),
             ("--spec-type", s.spec_type), ("--spec-draft-n-max", a.n_max),
             ("--spec-draft-p-min", s.p_min or None), ("-np", a.parallel),
             *((f.flags[0], s.type_options.get(f.key, f.default) != f.default or None)
               for f in registry.option_fields()),  # each draft type's own flags
             ("--spec-select", s.spec_select != "first" or None),
             ("-ctk", a.type_k), ("-ctv", a.type_v), ("-c", a.n_ctx),
             ("--spec-draft-rs-planes", a.rs_planes), ("--spec-draft-rs-planes-lead", a.rs_lead),
             ("--spec-dflash-inject", a.inject), ("--acceptance-profile", profile),
             ("--temp", a.temp), ("--spec-tree-budget", a.tree_budget), ("--top-k", sampling.top_k != opts.TOP_K or None),
             ("--top-p", sampling.top_p != opts.TOP_P or None), ("--min-p", sampling.min_p != opts.MIN_P or None),
             ("--seed", sampling.seed != opts.SEED or None),
             ("--rpc", s.rpc), ("-sm", s.split_mode), ("-ts", s.tensor_split),
             ("-ngl", s.n_gpu_layers), ("-fa", s.flash_attn != "auto" or None), ("--dflash", s.fixed_block),
             ("--no-draft", s.no_draft))
    return [flag for flag, v in flags if v is not None and v is not False]


def plan(shared: opts.Shared, axes: AxisFlags, *, resume: Path | None, save: Path | None, prompts: Path | None,
         profile: str | None, n_predict: int, reps: int, warmup: bool, matrix: bool, native: bool) -> Plan:
    """The benchmark to run: the one saved in `resume` (no other setting may be given), or a new one."""
    if resume is not None:
        given = resume_conflicts(shared, axes, prompts, profile)
        if given:
            raise InputError(f"--resume continues with the saved settings: drop {', '.join(given)}")
        if save is not None and save != resume:
            raise InputError("--resume saves into the file it continues: drop --save")
        return resume_plan(resume)
    if n_predict < 1 or reps < 1:
        raise InputError("-n and -r must be at least 1")
    if shared.threads < 1:
        raise InputError(f"-t {shared.threads}: must be at least 1")
    return new_plan(shared, axes, prompts=prompts, n_predict=n_predict, reps=reps, warmup=warmup, matrix=matrix,
                    native=native, profile=profile, save=save)


def resume_plan(resume: Path) -> Plan:
    """The plan that continues the benchmark saved in `resume` (its own settings), saving there."""
    from ggspec.bench import report
    from ggspec.files import check_writable

    doc = report.load(resume)
    settings = report.settings_from(doc, f"--resume {resume}")
    check_writable(resume, f"--resume {resume}")  # before anything is measured
    return Plan(settings, None, save_path=resume, resume=doc)


def new_plan(shared: opts.Shared, axes: AxisFlags, *, prompts: Path | None, n_predict: int, reps: int,
             warmup: bool, matrix: bool, native: bool, profile: str | None, save: Path | None) -> Plan:
    """A new benchmark's plan: the models (draft-mtp detected as `run` does), the checks of what
    needs a draft, the axes with the pair's recommendations as defaults, and the shared Settings."""
    from ggspec.bench.configs import Axes, n_max_item, split_list
    from ggspec.bench.prompts import load_prompts
    from ggspec.bench.runner import Settings
    from ggspec.bench.session import parse_profile
    from ggspec.files import check_writable, portable_path

    if save is not None:
        check_writable(save, f"--save {save}")  # before anything is measured, not after
    target, draft_path, rec = config.resolve_models(shared, plain=True)
    plain, given_type = shared.plain, None if shared.plain else shared.spec_type
    if plain:  # --spec-type none: a target-only benchmark
        shared = replace(shared, spec_type=None)
    elif shared.spec_type is None:  # a type that drafts without a draft model of its own, detected as `run` does
        found = config.detected_type(target, draft_path)
        if found is not None and found.traits.draft_model != "required":
            shared = replace(shared, spec_type=SpecTypes.of(found))
        elif draft_path is None:  # a lone model: the text drafter, as `run` and `serve` draft by default
            shared = config.with_lone_default(shared, target, None)
    draft_free = shared.spec_type is not None and shared.spec_type.draft_file_optional
    if draft_path is None and not draft_free:
        if not native:
            raise InputError("--spec-type none: nothing speculates; add --native for a target-only benchmark "
                             "(ggspec's plain greedy against llama.cpp's)" if plain else
                             f"no draft model: --spec-type {given_type.text} drafts with one: give -md FILE")
        spec_only = [flag for flag, v in (("--spec-draft-n-max", axes.n_max), ("--spec-draft-rs-planes", axes.rs_planes),
                                          ("--spec-draft-rs-planes-lead", axes.rs_lead),
                                          ("--spec-dflash-inject", axes.inject), ("--acceptance-profile", profile),
                                          ("--spec-type", given_type))
                     if v is not None]
        if spec_only:
            why = "--spec-type none decodes plainly" if plain else "they need a draft model (-md)"
            raise InputError(f"{', '.join(spec_only)}: speculative settings do not apply: {why}")
    if draft_free and axes.inject is not None:
        raise InputError(f"--spec-dflash-inject: {shared.spec_type.text} has no draft model to inject into")
    trees = split_list("--spec-tree-budget", axes.tree_budget, ("",), _tree_item)
    base = config.base_config(shared, target, draft_path)  # the options' own checks, each naming its flag
    config.note_lone_default(shared)
    d, recommended = opts.DEFAULTS, config.recommended
    n_max = int(recommended(rec, "n_max"))
    grid = Axes(
        ctk=split_list("-ctk", axes.type_k, (recommended(rec, "ctk"),)),
        ctv=split_list("-ctv", axes.type_v, (recommended(rec, "ctv"),)),
        n_ctx=split_list("-c", axes.n_ctx, (int(recommended(rec, "ctx")),), int),
        # no length given: the adaptive one, capped at the pair's (as `run` and `serve` decode by default)
        n_max=split_list("--spec-draft-n-max", axes.n_max, (f"auto:{n_max}",), lambda t: n_max_item(t, n_max)),
        planes=split_list("--spec-draft-rs-planes", axes.rs_planes, (str(recommended(rec, "planes")),)),
        lead=split_list("--spec-draft-rs-planes-lead", axes.rs_lead, (str(recommended(rec, "lead")),)),
        inject=split_list("--spec-dflash-inject", axes.inject, (d["inject"],)),
        parallel=split_list("-np", axes.parallel, (d["parallel"],), int),
        temp=split_list("--temp", axes.temp, (opts.TEMP,), float),
        tree=trees,
    )
    if grid.is_matrix and not matrix:
        raise InputError(f"the comma lists make {grid.size} combinations: add --matrix to run them")
    name, weights = parse_profile(profile)
    if native and base.placement.rpc:
        raise InputError("--native cannot share the --rpc workers: a worker serves one client at a time")
    sampling = shared.sampling
    settings = Settings(target=portable_path(target), draft=portable_path(draft_path) if draft_path else "",
                        n_predict=n_predict, reps=reps, threads=shared.threads, flash_attn=shared.flash_attn,
                        warmup=warmup, profile=name,
                        profile_weights=weights, prompts=tuple(load_prompts(prompts)), placement=base.placement,
                        n_gpu_layers=base.n_gpu_layers, spec_type=base.spec_type, p_min=base.p_min,
                        type_options=tuple(registry.flat_options(base.spec_options).items()),
                        spec_select=base.spec_select, plan_pool=base.plan_pool,
                        top_k=sampling.top_k, top_p=sampling.top_p, min_p=sampling.min_p,
                        seed=concrete_seed(sampling.seed))
    n_max_source = "flag" if axes.n_max is not None else "pair" if "n_max" in rec else "default"
    return Plan(settings, grid, native=native, save_path=save, n_max_source=n_max_source)
