"""Load a target (and optionally a DFlash draft) with every check done before llama.cpp runs."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from ggspec.errors import InputError
from ggspec.runtime import Context, ContextParams, Model
from ggspec.runtime.devices import Placement
from ggspec.runtime.gguf_meta import read_meta
from ggspec.runtime.preflight import check_memory, check_model
from ggspec.speculative.dflash import INJECT_MODES, DFlashInfo, DFlashProposer, check_compatible, dflash_info, is_dflash
from ggspec.speculative.planes import AutoLead, PlaneOptions, default_lead

DEFAULT_N_MAX = 15  # --spec-draft-n-max when neither the user nor a named pair gives one


@dataclass
class PairConfig:
    target: Path
    draft: Path | None = None
    dflash: bool | None = None  # None: auto-detect from the draft's architecture
    # draft tokens per step; None: DEFAULT_N_MAX, fitted to the draft's block without a warning
    # (a value someone asked for is clamped with one)
    n_max: int | None = None
    ctx: ContextParams = field(default_factory=ContextParams)
    n_gpu_layers: int = 0
    n_gpu_layers_draft: int = 0
    planes: PlaneOptions = field(default_factory=PlaneOptions)  # hybrid targets only
    placement: Placement = field(default_factory=Placement)  # devices (target and draft alike)
    inject: str = "pruned"  # how target features reach the draft: pruned | deferred | immediate


class SpecPair:
    """Owns the target model/context and, when speculating, the draft model/context/proposer."""

    def __init__(self, cfg: PairConfig, share_models: "SpecPair | None" = None) -> None:
        """`share_models`: reuse another pair's loaded models (same files) instead of loading
        them again; benchmarks comparing context settings then run on the very same weights."""
        self.cfg = cfg
        self._shared = share_models
        self.warnings: list[str] = []
        self.draft_model: Model | None = None
        self.draft_ctx: Context | None = None
        self.proposer: DFlashProposer | None = None
        self.auto_lead: AutoLead | None = None
        self.info: DFlashInfo | None = self._validate()
        self.n_max = self._clamp_n_max()
        if self.info is not None:
            cfg.planes.check(self.n_max)
        self._check_options()

        self.target_model = (share_models.target_model if share_models
                             else Model(cfg.target, cfg.n_gpu_layers, what="target", placement=cfg.placement))
        target_params = replace(cfg.ctx)
        planes = cfg.planes.n_planes(self.n_max)
        if self.info is not None and self.target_model.is_recurrent:
            # one plane per sequence holds the working state; the others are rollback snapshots
            target_params.n_rs_seq = planes - 1
        elif self.target_model.is_recurrent and cfg.placement.split_mode == "tensor":
            # upstream bug: a hybrid target without snapshot planes, tensor-split over RPC workers,
            # makes the workers assert on an out-of-buffer tensor (pinned llama.cpp, patches or not);
            # one spare plane avoids it for one recurrent state of memory
            target_params.n_rs_seq = 1
        elif cfg.planes.given:
            self.warnings.append("recurrent plane options do nothing here (the target has no recurrent layers)"
                                 if self.info is not None else "recurrent plane options do nothing without a draft")
        self.target = Context(self.target_model, target_params, what="target")
        if self.info is not None and self.target_model.is_recurrent and cfg.planes.capped(self.n_max):
            self._set_layout(planes, cfg.planes.lead)
        if self.info is not None:
            self.draft_model = (share_models.draft_model if share_models
                                else Model(cfg.draft, cfg.n_gpu_layers_draft, what="draft", placement=cfg.placement))
            draft_params = replace(cfg.ctx, n_rs_seq=0)
            # the draft borrows the target's embeddings / output head through ctx_other
            self.draft_ctx = Context(self.draft_model, draft_params, ctx_other=self.target, what="draft")
            self.proposer = DFlashProposer(self.target, self.draft_ctx, self.info, inject=cfg.inject)

    def _set_layout(self, planes: int, lead: int | str) -> None:
        if lead == "auto":
            self.auto_lead = AutoLead(self.target, planes, self.n_max)
            self.auto_lead.start()
        else:
            self.target.set_rs_layout(planes, default_lead(planes) if lead == "default" else lead)

    @property
    def plane_layout(self) -> str:
        """The recurrent-state layout in words, for stats lines."""
        if not (self.speculative and self.target_model.is_recurrent):
            return "none"
        planes = self.cfg.planes.n_planes(self.n_max)
        if not self.cfg.planes.capped(self.n_max):
            return f"{planes} planes (uncapped)"
        if self.auto_lead is not None:
            return f"{planes} planes, lead auto (now {self.auto_lead.lead}, {self.auto_lead.changes} changes)"
        kept = sorted(k - 1 for k in self.target.rs_kept_counts(self.n_max + 1) if k >= 1)
        return f"{planes} planes, lead {self.cfg.planes.lead} (keeps accepted {kept})"

    def recurrent_bytes(self) -> int:
        """Recurrent state memory per sequence: planes x bytes per plane (0 for dense targets)."""
        if not self.target_model.is_recurrent:
            return 0
        return (1 + self.target.n_rs_seq) * self.target.recurrent_state_bytes()

    def on_accept(self, accepted: int, drafted: int) -> None:
        """Feed each step's outcome to the `auto` layout (a no-op otherwise)."""
        if self.auto_lead is not None:
            self.auto_lead.observe(accepted, drafted)

    @property
    def speculative(self) -> bool:
        return self.proposer is not None

    def _validate(self) -> DFlashInfo | None:
        cfg = self.cfg
        if cfg.n_max is not None and cfg.n_max < 1:
            raise InputError(f"--spec-draft-n-max must be at least 1 (got {cfg.n_max})")
        if cfg.inject not in INJECT_MODES:
            raise InputError(f"--spec-dflash-inject {cfg.inject}: expected one of {', '.join(INJECT_MODES)}")
        cfg.ctx.validate()  # option ranges before anything is read or loaded
        target = read_meta(cfg.target, "target")
        if is_dflash(target):
            raise InputError(f"the target is a DFlash draft model, not a target: {cfg.target}")
        check_model(target, "target")
        self._metas = [target]
        if cfg.draft is None:
            if cfg.dflash:
                raise InputError("--dflash needs a draft model (-md)")
            return None
        draft = read_meta(cfg.draft, "draft")
        if cfg.dflash is False:
            return None
        if not is_dflash(draft):
            if cfg.dflash:
                raise InputError(
                    f"--dflash: the draft is not a DFlash model (architecture '{draft.arch}'): {cfg.draft}"
                )
            raise InputError(
                f"the draft's architecture '{draft.arch}' is not supported (ggspec drafts with DFlash models)"
            )
        check_model(draft, "draft")
        info = dflash_info(draft)
        check_compatible(target, draft, info)
        self._metas.append(draft)
        own_head = {"d2t", "output.weight"} & draft.tensors
        if own_head and cfg.placement.split_mode == "tensor" and not cfg.placement.mirror_output:
            raise InputError(f"the draft has its own output head ({', '.join(sorted(own_head))}): under -sm tensor "
                             "the head is split by vocabulary rows and llama.cpp aborts on it; add --mirror-output")
        return info

    def _check_options(self) -> None:
        """Context options against the loop and the memory, before llama.cpp is asked for anything."""
        cfg, ctx = self.cfg, self.cfg.ctx
        if self.info is not None:
            block = self.n_max + 1  # the draft's noise block [id_last, MASK x n_max] and the target's verify batch
            fix = f"raise it or lower --spec-draft-n-max (now {self.n_max})"
            if ctx.n_ctx < block + 1:  # the prompt's first token, then one block
                raise InputError(f"context size {ctx.n_ctx} (-c) cannot hold a prompt token and a verify block of "
                                 f"{block} tokens (n_max {self.n_max} + 1): {fix}")
            # llama.cpp caps a causal context's batch at its (unpadded) context size
            if min(ctx.n_batch, ctx.n_ctx) < block:
                raise InputError(f"batch size {ctx.n_batch} (-b) is smaller than a verify block of {block} tokens "
                                 f"(n_max {self.n_max} + 1): {fix}")
            # the draft runs its noise block non-causally, in one ubatch, or llama.cpp aborts
            if min(ctx.n_ubatch, ctx.n_batch) < block:
                raise InputError(f"physical batch size {ctx.n_ubatch} (-ub) is smaller than the draft's noise block "
                                 f"of {block} rows (n_max {self.n_max} + 1), which must fit one ubatch: {fix}")
        if cfg.n_gpu_layers == 0 and cfg.n_gpu_layers_draft == 0 and not cfg.placement.multi_device:
            models = [(self._metas[0], self.cfg.planes.n_planes(self.n_max) if self.info is not None else 1)]
            models += [(m, 0) for m in self._metas[1:]]
            check_memory(models, ctx.n_ctx, ctx.type_k, ctx.type_v, min(ctx.n_ubatch, ctx.n_batch))

    def _clamp_n_max(self) -> int:
        n_max = self.cfg.n_max
        if n_max is None:  # nobody asked for a length: the default, or as much as the draft's block allows
            return min(DEFAULT_N_MAX, self.info.n_max_limit) if self.info is not None else DEFAULT_N_MAX
        if self.info is not None and n_max > self.info.n_max_limit:
            self.warnings.append(
                f"--spec-draft-n-max {n_max} exceeds the draft's block size {self.info.block_size} - 1; "
                f"using {self.info.n_max_limit}"
            )
            n_max = self.info.n_max_limit
        return n_max

    def reset(self) -> None:
        """Empty every cache so the pair can serve a new, unrelated prompt."""
        self.target.clear()  # also drops every recurrent plane: no state leaks across prompts
        if self.draft_ctx is not None:
            self.draft_ctx.clear()
        if self.proposer is not None:
            self.proposer.reset()

    def close(self) -> None:
        owned_models = () if self._shared else (self.draft_model, getattr(self, "target_model", None))
        for obj in (self.proposer, self.draft_ctx, getattr(self, "target", None), *owned_models):
            if obj is not None:
                obj.close()

    def __enter__(self) -> "SpecPair":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
