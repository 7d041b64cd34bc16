"""A pair's weights, loaded once, and what kind of drafting they allow.

`Models` reads and checks every file before llama.cpp sees it, decides the speculative type
(llama.cpp's names: `draft-simple`, `draft-dflash`, `draft-mtp`, `ngram-simple`, ...: the
registry's entries, registry.py), and loads the weights.
Engines (contexts, caches, the loop) are built over a `Models` and closed before it: several
engines with different context settings can share one set of weights.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ggspec.errors import InputError
from ggspec.runtime import ContextParams, Model
from ggspec.runtime.devices import Placement
from ggspec.runtime.gguf_meta import GGUFMeta, read_meta
from ggspec.runtime.memory import check_memory
from ggspec.runtime.preflight import check_model
from ggspec.speculative.planes import PlaneOptions
from ggspec.speculative.sampling import SamplerSettings
from ggspec.speculative.types import registry
from ggspec.speculative.types.archs import is_dflash
from ggspec.speculative.types.draft_type import INJECT_MODES, DraftPlan, DraftType, Options

DEFAULT_N_MAX = 15  # draft tokens per step when neither the user nor a named pair gives one


@dataclass
class PairConfig:
    """Everything that decides how a pair runs; `Models` reads the files part, `Engine` the rest."""

    target: Path
    draft: Path | None = None
    use_draft: bool = True  # False (--no-draft): the draft file is left out (its types refused, none detected)
    fixed_block: bool = False  # (--dflash) the draft must be a block drafter: DFlash, DFlash2 or DSpark
    spec_type: str | None = None  # llama.cpp's name (or a comma list of them); None: detected from the draft
    spec_select: str = "first"  # several types: whose draft a step verifies (several.SELECT_RULES)
    # draft tokens per step; None: DEFAULT_N_MAX fitted to the draft's block without a warning
    # (a value someone asked for is clamped with one)
    n_max: int | None = None
    # `--spec-draft-n-max auto`: each step chooses how many of the drafts (at most n_max) each
    # sequence verifies, from measured costs and acceptance (draft_length.py); None (the default):
    # adaptive unless n_max is given (a length someone asked for is a fixed length)
    adaptive: bool | None = None
    # the adaptive rule starts from costs measured before the first step (calibration.py), cached
    # under $GGSPEC_HOME; False: it measures them in its first steps
    calibrate: bool = True
    # prepared plans each context keeps (patch 0012; 0: llama.cpp's one): the alternating shapes of
    # draft, verify and inject stop re-planning each other away
    plan_pool: int = 8
    p_min: float = 0.0  # stop a draft where the draft's confidence falls below this (0: never)
    n_min: int = 0  # the model drafters: a shorter draft is dropped (llama.cpp's --spec-draft-n-min)
    # each type's own options by type name (registry.options_from_flat makes them from flat keys);
    # a type not given runs with its defaults
    spec_options: dict[str, Options] = field(default_factory=dict)
    parallel: int = 1  # sequences decoded together
    ctx: ContextParams = field(default_factory=ContextParams)
    n_gpu_layers: int = 0
    n_gpu_layers_draft: int = 0
    planes: PlaneOptions = field(default_factory=PlaneOptions)  # hybrid targets only
    placement: Placement = field(default_factory=Placement)  # devices (target and draft alike)
    mmap: bool = True  # map the files (llama.cpp's default; --no-mmap reads them into buffers)
    inject: str = "pruned"  # how target features reach a DFlash draft: pruned | deferred | immediate
    # token trees (`--spec-tree-budget`): draft nodes a step verifies as a tree, 0: chains; None:
    # `auto`'s default cap. `tree_auto`: the budget is chosen by cost (0 included), and trees are
    # allowed only where allowing them costs nothing (one sequence; tree_budget.py)
    tree_budget: int | None = None
    tree_auto: bool = True
    # how tokens are chosen: greedy by default; temperature > 0 samples (speculative sampling)
    sampling: SamplerSettings = field(default_factory=lambda: SamplerSettings(temp=0.0))
    _types: tuple | None = field(default=None, init=False, repr=False, compare=False)  # (spec_type, its types)

    @property
    def types(self) -> tuple[DraftType, ...]:
        """The types `spec_type` names, in llama.cpp's order (() where none is given): parsed once
        (registry.parse), again only if `spec_type` changes."""
        if self._types is None or self._types[0] != self.spec_type:
            self._types = (self.spec_type, registry.parse(self.spec_type) if self.spec_type is not None else ())
        return self._types[1]

    @property
    def auto(self) -> bool:
        """Whether each step chooses its draft length (adaptive, or by default: no n_max given)."""
        return self.adaptive if self.adaptive is not None else self.n_max is None

    def options(self, t: DraftType) -> Options:
        """A type's options: as given, else its defaults."""
        return self.spec_options.get(t.name) or t.default_options()

    def validate(self) -> None:
        """Option values that are wrong whatever the files are."""
        if self.n_max is not None and self.n_max < 1:
            raise InputError(f"the draft length must be at least 1 (got {self.n_max})", field="n_max")
        if not 0 <= self.plan_pool <= 64:
            raise InputError(f"the prepared plans must be 0..64 (got {self.plan_pool})", field="plan_pool")
        if self.n_min < 0:
            raise InputError(f"the shortest draft must be at least 0 (got {self.n_min})", field="n_min")
        if not 0.0 <= self.p_min <= 1.0:
            raise InputError(f"the confidence cut-off must be within 0..1 (got {self.p_min})", field="p_min")
        if not 1 <= self.parallel <= 256:
            raise InputError(f"the parallel sequences must be 1..256 (got {self.parallel})", field="parallel")
        for name, opts in self.spec_options.items():
            if registry.get(name).options is not type(opts):
                raise TypeError(f"{type(opts).__name__} are not {name}'s options")
            opts.validate()
        if self.tree_budget is not None and not 0 <= self.tree_budget <= 255:
            raise InputError(f"the tree budget must be within 0..255 nodes (got {self.tree_budget})", field="tree_budget")
        if self.inject not in INJECT_MODES:
            raise InputError(f"{self.inject}: expected one of {', '.join(INJECT_MODES)}", field="inject")
        self.types  # noqa: B018 (parsed: a bad --spec-type is refused here)
        if self.spec_select not in ("first", "cost"):
            raise InputError(f"{self.spec_select}: expected first (llama.cpp's rule) or cost", field="spec_select")
        self.ctx.validate()
        self.sampling.validate()

def plan_drafting(cfg: PairConfig, target: GGUFMeta, draft: GGUFMeta | None, warnings: list[str]) -> DraftPlan:
    """The speculative type from the options and the files: a type given is checked against the
    files by its entry's `plan`; none given, the files decide (registry.detected: llama.cpp's
    auto-detection, plus ordinary draft LLMs, EAGLE3 heads and a target's MTP block).
    `cfg.use_draft` False (--no-draft) leaves the draft file out."""
    types = cfg.types
    if not cfg.use_draft:
        needs = [t.name for t in types if t.traits.draft_model == "required"]
        if needs:
            raise InputError(f"{needs[0]} drafts with the draft model, which --no-draft turns off", field="spec_type")
        draft = None
    elif not types:
        found = registry.detected(target, draft, fixed_block=cfg.fixed_block)
        types = (found,) if found is not None else ()
    if not types:
        return DraftPlan(None)
    parts = tuple(t.planned(cfg, target, draft, warnings) for t in types)
    if cfg.draft is not None and cfg.use_draft and all(t.traits.draft_model == "none" for t in types):
        names = ",".join(t.name for t in types)
        verb = "drafts" if len(types) == 1 else "draft"
        warnings.append(f"{names} {verb} from the text itself: the draft model is not used")
    if len(parts) == 1:
        return parts[0]
    model = [p for p in parts if not p.type.traits.cheap]  # at most one (registry.parse)
    return DraftPlan(None, meta=model[0].meta if model else None, max_draft=model[0].max_draft if model else None,
                     parts=parts)

def parse_n_max(text: str) -> tuple[int | None, bool]:
    """`--spec-draft-n-max` as written: "7" -> (7, False), "auto" -> (None, True) (the type's
    default length as the cap), "auto:7" -> (7, True)."""
    word, _, cap = text.strip().partition(":")
    if word == "auto":
        if not cap:
            return None, True
        text = cap
    try:
        value = int(text)
    except ValueError:
        raise InputError(f"{text}: expected a number of draft tokens, 'auto' or 'auto:N'", field="n_max") from None
    if value < 1:
        raise InputError(f"the draft length must be at least 1 (got {value})", field="n_max")
    return value, word == "auto"


def resolve_n_max(requested: int | None, max_draft: int | None, warnings: list[str]) -> int:
    """The draft length per step: the default fitted silently to the draft, a requested value
    clamped to it with a warning."""
    if requested is None:
        return min(DEFAULT_N_MAX, max_draft) if max_draft is not None else DEFAULT_N_MAX
    if max_draft is not None and requested > max_draft:
        warnings.append(f"a draft length of {requested} exceeds the draft's block (at most {max_draft} draft tokens "
                        f"per step); using {max_draft}")
        return max_draft
    return requested


def draft_lengths(cfg: PairConfig, plan: DraftPlan, warnings: list[str]) -> tuple[int, list[int]]:
    """The step's longest draft and, for several types, each one's own length (as llama.cpp: each
    type drafts up to its own length, the verify holds the longest)."""
    if plan.parts:
        caps = [own_n_max(cfg, part, False, warnings) for part in plan.parts]
        return max(caps), caps
    return own_n_max(cfg, plan, True, warnings), []


def own_n_max(cfg: PairConfig, plan: DraftPlan, given: bool, warnings: list[str]) -> int:
    """A type's draft length: the n-gram types draft up to their own length (llama.cpp's n_max
    for them; alone, `--spec-draft-n-max` overrides it: `given`), the others up to n_max fitted
    to the draft's block."""
    own = plan.type.own_n_max(cfg.options(plan.type)) if plan.type is not None else None
    if own is None:
        return resolve_n_max(cfg.n_max, plan.max_draft, warnings)
    return resolve_n_max(cfg.n_max if given and cfg.n_max is not None else own, None, warnings)


class Models:
    """The target (and draft) weights of a pair. Closed last, after every engine built on it."""

    def __init__(self, cfg: PairConfig, *, dry: bool = False) -> None:
        """`dry`: the files' metadata only, every allocation simulated (Model's dry), for the
        memory fit to measure what the pair's engines would take."""
        cfg.validate()
        self.warnings: list[str] = []
        self.target_meta = read_meta(cfg.target, "target")
        if is_dflash(self.target_meta):
            raise InputError(f"the target is a DFlash draft model, not a target: {cfg.target}", field="target")
        check_model(self.target_meta, "target")
        # (read with draft-mtp too: the draft may be a Gemma 4 drafter)
        uses_draft = cfg.draft is not None and cfg.use_draft and not (cfg.types and all(
            t.traits.draft_model == "none" for t in cfg.types))
        self.draft_meta = read_meta(cfg.draft, "draft") if uses_draft else None
        self.plan = plan_drafting(cfg, self.target_meta, self.draft_meta, self.warnings)
        if not self.plan.uses_draft_model:
            self.draft_meta = None
        if not dry and not cfg.ctx.measured:
            self.check_memory(cfg)
        self.target = Model(cfg.target, cfg.n_gpu_layers, what="target", placement=cfg.placement,
                            load_mtp=any(p.target_mtp for p in self.plan.parts or (self.plan,)), dry=dry,
                            mmap=cfg.mmap)
        self.draft: Model | None = None
        try:
            if self.draft_meta is not None:
                self.draft = Model(cfg.draft, cfg.n_gpu_layers_draft, what="draft", placement=cfg.placement, dry=dry,
                                   mmap=cfg.mmap)
            for t in self.plan.types:
                if t.check_loaded is not None:
                    t.check_loaded(self.target, self.draft)
        except BaseException:
            if self.draft is not None:
                self.draft.close()
            self.target.close()
            raise

    @property
    def speculative(self) -> bool:
        return self.plan.spec_type is not None

    def check_memory(self, cfg: PairConfig) -> None:
        """Weights, caches and recurrent planes against free memory, before anything loads."""
        if cfg.n_gpu_layers or cfg.n_gpu_layers_draft or cfg.placement.multi_device:
            return
        ctx = cfg.ctx
        n_max = draft_lengths(cfg, self.plan, [])[0]  # (the engine's own rule: assembly)
        planes = cfg.planes.n_planes(n_max) if self.speculative else 1
        models = [(self.target_meta, planes * cfg.parallel)]
        if self.draft_meta is not None:
            models.append((self.draft_meta, 0))
        check_memory(models, ctx.n_ctx, ctx.type_k, ctx.type_v, min(ctx.n_ubatch, ctx.n_batch))

    def close(self) -> None:
        for model in (self.draft, getattr(self, "target", None)):
            if model is not None:
                model.close()

    def __enter__(self) -> "Models":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
