"""Putting an engine together: its draft length, its contexts, its proposer and its adaptive rule,
from a pair's models, options and draft plan. Nothing here knows a draft type by name: each type's
registry entry makes its proposer (and the draft context it drafts with) and says what it needs of
the target's context.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from ggspec.errors import InputError
from ggspec.runtime import Context, ContextParams
from ggspec.speculative.models import Models, PairConfig, draft_lengths, own_n_max
from ggspec.speculative.planes import AutoLead, default_lead
from ggspec.speculative.proposer import Proposer
from ggspec.speculative.rules.draft_length import DraftLength
from ggspec.speculative.rules.tree_budget import TreeBudget, plan_trees
from ggspec.speculative.tree_verify import tree_seq_ids
from ggspec.speculative.types import registry
from ggspec.speculative.types.draft_type import Build, DraftPlan


def check_options(cfg: PairConfig, n_max: int, speculative: bool, fixed_block: bool = True) -> None:
    """Context sizes against the loop, before llama.cpp is asked for anything (one place).
    `fixed_block`: a draft context runs whole noise blocks (the DFlash family)."""
    ctx = cfg.ctx
    if not speculative:
        return
    block = n_max + 1  # a verify span [id_last, d1..dn] (and a DFlash noise block)
    rows = block * cfg.parallel
    fix = f"raise it or lower the draft length (now {n_max})" + (f" or the parallel sequences ({cfg.parallel})"
                                                                 if cfg.parallel > 1 else "")
    if ctx.n_ctx < block + 1:  # the prompt's first token, then one block
        raise InputError(f"context size {ctx.n_ctx} cannot hold a prompt token and a verify block of {block} tokens: {fix}",
                         field="n_ctx")
    # llama.cpp caps a causal context's batch at its (unpadded) context size
    if min(ctx.n_batch, ctx.n_ctx) < rows:
        raise InputError(f"batch size {ctx.n_batch} is smaller than the verify batch of {rows} rows "
                         f"({cfg.parallel} x (n_max {n_max} + 1)): {fix}", field="n_batch")
    # the draft runs every noise block non-causally in one ubatch, or llama.cpp aborts
    if fixed_block and min(ctx.n_ubatch, ctx.n_batch) < rows:
        raise InputError(f"physical batch size {ctx.n_ubatch} is smaller than the draft's noise blocks of {rows} rows "
                         f"({cfg.parallel} x (n_max {n_max} + 1)), which must fit one ubatch: {fix}",
                         field="n_ubatch")


def make_draft_length(cfg: PairConfig, plan: DraftPlan, n_max: int, recurrent: bool) -> DraftLength:
    """The adaptive rule (`--spec-draft-n-max auto`), told what the proposer's costs grow with."""
    types = plan.types
    return DraftLength(n_max, cheap=all(t.traits.cheap for t in types), fixed_block=any(t.traits.fixed_block for t in types),
                       equal_spans=recurrent, n_min=cfg.n_min)


@dataclass
class Assembly:
    """What an engine runs on: the llama.cpp objects (the engine closes them) and its rules."""

    n_max: int  # the longest draft a step verifies
    target: Context
    draft_ctx: Context | None = None
    proposer: Proposer | None = None
    auto_lead: AutoLead | None = None  # capped planes whose lead layout follows the acceptance
    draft_length: DraftLength | None = None  # the adaptive rule (--spec-draft-n-max auto)
    shares_cells: bool = False  # the draft context's layers read the target's cells
    tree_rule: TreeBudget | None = None  # token trees' budget (--spec-tree-budget), None: chains only
    tree_leaves: int = 0  # branch ids per slot (tree_verify.py)

    @property
    def tree_cells(self) -> int:
        """Cells a sequence's tree needs beyond a chain's verify block (its nodes off the chain)."""
        return max(0, self.tree_leaves - self.n_max)

    @property
    def cell_contexts(self) -> list[Context]:
        """The contexts whose cells hold a sequence's positions: the target's and a draft model's."""
        return [self.target] if self.draft_ctx is None or self.shares_cells else [self.target, self.draft_ctx]

    def close(self) -> None:
        for obj in (self.proposer, self.draft_ctx, self.target):
            if obj is not None:
                obj.close()


def assemble(models: Models, cfg: PairConfig, plan: DraftPlan, *, keep_state: bool, warnings: list[str],
             wrap: Callable[[Proposer], Proposer] | None = None, standby: bool = False) -> Assembly:
    """The draft length and the checks of the options against it, the target's context (with
    rollback planes on a hybrid target), the proposer of the plan's types (and the draft context
    one of them opens; `wrap` makes the one the engine drafts with from it: a benchmark's forced
    acceptance), prepared-plan pools for each context, and the adaptive rule. `standby`: a
    speculative engine also holds the n-gram types the plan lacks, for the sequences that name
    them (a server's requests; they draft within the plan's length)."""
    speculative = plan.types != ()
    recurrent = models.target.is_recurrent
    n_max, caps = draft_lengths(cfg, plan, warnings)
    if speculative and recurrent:
        cfg.planes.check(n_max)
    check_options(cfg, n_max, speculative, fixed_block=any(t.traits.fixed_block for t in plan.types))
    tree_cap = plan_trees(cfg, plan, recurrent, n_max) if speculative else 0
    params = _target_params(models, cfg, plan, n_max, speculative, warnings)
    if tree_cap:  # a branch id per leaf, on one cache whose cells the branches share
        params.kv_unified, params.n_seq_max = True, tree_seq_ids(cfg.parallel, tree_cap)
    parts = Assembly(n_max, Context(models.target, params, what="target"),
                     shares_cells=any(p.shares_cells for p in plan.parts or (plan,)), tree_leaves=tree_cap)
    if cfg.auto and speculative:
        parts.draft_length = make_draft_length(cfg, plan, n_max, recurrent)
    if tree_cap:
        parts.tree_rule = TreeBudget(n_max, tree_cap, cfg.tree_auto,
                                     parts.draft_length.spec if parts.draft_length is not None else None)
    try:
        if speculative and recurrent and cfg.planes.capped(n_max) and not models.target.dry:
            parts.auto_lead = _set_planes(parts.target, cfg, n_max)
        _check_type_options(cfg, plan, warnings)
        extra = standby_plans(plan) if standby and speculative else []
        if plan.parts or extra:
            parts.proposer = _several(parts, models, cfg, plan, extra, n_max, caps, keep_state)
        else:
            if cfg.spec_select != "first":
                warnings.append("a rule choosing between speculative types needs several of them (--spec-type a,b)")
            if plan.type is not None:
                parts.proposer = _build(parts, models, cfg, plan, n_max, keep_state)
        if wrap is not None and parts.proposer is not None:
            parts.proposer = wrap(parts.proposer)
        _set_plan_pools(cfg, [parts.target, parts.draft_ctx])
    except BaseException:
        parts.close()
        raise
    return parts


def _several(parts: Assembly, models: Models, cfg: PairConfig, plan: DraftPlan, extra: list[DraftPlan], n_max: int,
             caps: list[int], keep_state: bool) -> Proposer:
    """The proposer of several types: the plan's own (one, or its list, each up to its own
    length) and those on standby (`extra`, within the step's length), in llama.cpp's order."""
    from ggspec.speculative.types.type_list import SeveralProposer  # noqa: PLC0415

    plans = [*(plan.parts or (plan,)), *extra]
    caps = [*(caps or [n_max]), *(min(n_max, own_n_max(cfg, part, False, [])) for part in extra)]
    order = sorted(range(len(plans)), key=lambda i: plans[i].type.priority)
    own = len(plans) - len(extra)
    return SeveralProposer([_build(parts, models, cfg, plans[i], n_max, keep_state) for i in order],
                           [caps[i] for i in order], select=cfg.spec_select, default=[i < own for i in order])


def standby_plans(plan: DraftPlan) -> list[DraftPlan]:
    """The n-gram types a plan lacks (they need no files: each one's plan is its type)."""
    return [DraftPlan(t) for t in registry.TYPES.values() if t.traits.cheap and t.name not in plan.kinds]


def _target_params(models: Models, cfg: PairConfig, plan: DraftPlan, n_max: int, speculative: bool,
                   warnings: list[str]) -> ContextParams:
    model = models.target
    params = replace(cfg.ctx, n_seq_max=cfg.parallel)
    for part in plan.parts or (plan,):  # what a type needs of the target's context
        if part.type is not None and part.type.target_params is not None:
            part.type.target_params(cfg, part, params, warnings)
    planes = cfg.planes.n_planes(n_max)
    if speculative and model.is_recurrent:
        params.n_rs_seq = planes - 1  # one plane holds the working state, the others rollback snapshots
    elif model.is_recurrent and cfg.placement.split_mode == "tensor":
        # upstream bug: a hybrid target without snapshot planes, tensor-split over RPC workers,
        # makes the workers assert on an out-of-buffer tensor (pinned llama.cpp, patches or not);
        # one spare plane avoids it for one recurrent state of memory
        params.n_rs_seq = 1
    elif cfg.planes.given:
        warnings.append("recurrent plane options do nothing here (the target has no recurrent layers)"
                        if speculative else "recurrent plane options do nothing without speculation")
    return params


def _set_planes(target: Context, cfg: PairConfig, n_max: int) -> AutoLead | None:
    """Capped planes: their lead layout, fixed or following the acceptance (`auto`)."""
    planes = cfg.planes.n_planes(n_max)
    if cfg.planes.lead == "auto":
        auto = AutoLead(target, planes, n_max)
        auto.start()
        return auto
    target.set_rs_layout(planes, default_lead(planes) if cfg.planes.lead == "default" else cfg.planes.lead)
    return None


def _check_type_options(cfg: PairConfig, plan: DraftPlan, warnings: list[str]) -> None:
    """Options given for a type that does not run, and shared options that do nothing here."""
    types = plan.types
    for name, options in cfg.spec_options.items():
        if name not in plan.kinds:
            options.check_unused(types)
    if cfg.n_min and types and not any(t.traits.n_min for t in types):
        warnings.append(f"a shortest draft length applies to the model drafters: it does nothing with {plan.spec_type}")
    if cfg.p_min > 0 and types and not any(t.traits.confidence for t in types):
        warnings.append(f"{plan.spec_type} drafts have no confidence: the confidence cut-off does nothing")


def _build(parts: Assembly, models: Models, cfg: PairConfig, plan: DraftPlan, n_max: int, keep_state: bool) -> Proposer:
    """One type's proposer, made by its registry entry (a draft context it opens joins `parts`)."""
    build = Build(cfg, models, parts.target, plan, cfg.options(plan.type), n_max, cfg.parallel, keep_state,
                  parts.draft_ctx)
    proposer = plan.type.make(build)
    parts.draft_ctx = build.draft_ctx
    return proposer


def _set_plan_pools(cfg: PairConfig, contexts: list[Context | None]) -> None:
    """Prepared plans for every context (patch 0012), except across devices: the pinned
    tensor-split (meta) backend aborts when a graph runs on another scheduler than the one that
    split it (GGML_ASSERT bcj.nodes[i], ggml-backend-meta.cpp), so split runs keep one plan."""
    if not cfg.plan_pool or cfg.placement.rpc or cfg.placement.split_mode != "none":
        return
    for ctx in contexts:
        if ctx is not None:
            ctx.set_plan_pool(cfg.plan_pool)
