"""A pair's weights, loaded once, and what kind of drafting they allow.

`Models` reads and checks every file before llama.cpp sees it, decides the speculative type
(llama.cpp's names: `draft-simple`, `draft-dflash`, `draft-mtp`, `ngram-simple`, ...), and loads
the weights.
Engines (contexts, caches, the loop) are built over a `Models` and closed before it: several
engines with different context settings can share one set of weights.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from ggspec.errors import InputError
from ggspec.runtime import ContextParams, Model
from ggspec.runtime.devices import Placement
from ggspec.runtime.gguf_meta import GGUFMeta, read_meta
from ggspec.runtime.memory import check_memory
from ggspec.runtime.preflight import check_model
from ggspec.speculative.dflash import INJECT_MODES, DFlashInfo, check_compatible, dflash_info, is_dflash
from ggspec.speculative.eagle3 import Eagle3Info, check_eagle3, eagle3_info, is_eagle3
from ggspec.speculative.mtp import DRAFTER_ARCHS, MTP_ARCHS, check_drafter, has_mtp_head, is_mtp_drafter
from ggspec.speculative.planes import PlaneOptions
from ggspec.speculative.sampling import SamplerSettings

DEFAULT_N_MAX = 15  # draft tokens per step when neither the user nor a named pair gives one

# llama.cpp's speculative types at the pin (common/speculative.cpp): ggspec runs all ten
SPEC_TYPES = ("draft-simple", "draft-eagle3", "draft-dflash", "draft-dspark", "draft-mtp", "ngram-simple", "ngram-map-k",
              "ngram-map-k4v", "ngram-mod", "ngram-cache")
NGRAM_TYPES = ("ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache")  # drafts from the text itself
# llama.cpp's order of preference when several types are given (common_speculative_init, SP:2616-2626):
# each drafts for the sequences no type before it drafted for
PRIORITY = ("ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache", "draft-simple", "draft-eagle3",
            "draft-mtp", "draft-dflash", "draft-dspark")
# types that draft without a separate draft model (draft-mtp: except with a Gemma 4 drafter)
NO_DRAFT_MODEL = ("draft-mtp", *NGRAM_TYPES)


@dataclass
class PairConfig:
    """Everything that decides how a pair runs; `Models` reads the files part, `Engine` the rest."""

    target: Path
    draft: Path | None = None
    dflash: bool | None = None  # True: draft with the DFlash draft; False: do not use the draft
    spec_type: str | None = None  # llama.cpp's name (or a comma list of them); None: detected from the draft
    spec_select: str = "first"  # several types: whose draft a step verifies (several.SELECT_RULES)
    # draft tokens per step; None: DEFAULT_N_MAX fitted to the draft's block without a warning
    # (a value someone asked for is clamped with one)
    n_max: int | None = None
    # `--spec-draft-n-max auto`: each step chooses how many of the drafts (at most n_max) each
    # sequence verifies, from measured costs and acceptance (draft_length.py)
    adaptive: bool = False
    # prepared plans each context keeps (patch 0012; 0: llama.cpp's one): the alternating shapes of
    # draft, verify and inject stop re-planning each other away
    plan_pool: int = 8
    p_min: float = 0.0  # stop a draft where the draft's confidence falls below this (0: never)
    n_min: int = 0  # draft-simple, draft-mtp: a shorter draft is dropped (llama.cpp's --spec-draft-n-min)
    draft_chain: bool = False  # draft-mtp: all draft steps in one decode (patch 0011)
    chain_vocab: int = 0  # draft-mtp, chained: the head scores only this many tokens (0: all)
    ngram_size_n: int = 12  # ngram-simple: the pattern length (llama.cpp's default)
    ngram_size_m: int = 48  # ngram-simple: the longest draft (llama.cpp's default)
    # ngram-map-k / ngram-map-k4v: key length, longest draft, hits a k4v key needs (llama.cpp's defaults)
    ngram_map_size_n: int = 12
    ngram_map_size_m: int = 48
    ngram_map_min_hits: int = 1
    # ngram-mod: the hashed n-gram's length, the longest draft, the shortest kept (llama.cpp's defaults)
    ngram_mod_n_match: int = 24
    ngram_mod_n_max: int = 64
    ngram_mod_n_min: int = 48
    parallel: int = 1  # sequences decoded together
    ctx: ContextParams = field(default_factory=ContextParams)
    n_gpu_layers: int = 0
    n_gpu_layers_draft: int = 0
    planes: PlaneOptions = field(default_factory=PlaneOptions)  # hybrid targets only
    placement: Placement = field(default_factory=Placement)  # devices (target and draft alike)
    inject: str = "pruned"  # how target features reach a DFlash draft: pruned | deferred | immediate
    # how tokens are chosen: greedy by default; temperature > 0 samples (speculative sampling)
    sampling: SamplerSettings = field(default_factory=lambda: SamplerSettings(temp=0.0))

    def validate(self) -> None:
        """Option values that are wrong whatever the files are."""
        if self.n_max is not None and self.n_max < 1:
            raise InputError(f"the draft length must be at least 1 (got {self.n_max})", field="n_max")
        if not 0 <= self.plan_pool <= 64:
            raise InputError(f"the prepared plans must be 0..64 (got {self.plan_pool})", field="plan_pool")
        if self.chain_vocab < 0:
            raise InputError(f"the draft vocabulary must be at least 0 tokens (got {self.chain_vocab})",
                             field="chain_vocab")
        if self.chain_vocab and not self.draft_chain:
            raise InputError("a reduced draft vocabulary is scored by chained drafts: add --spec-draft-chain",
                             field="chain_vocab")
        if self.n_min < 0:
            raise InputError(f"the shortest draft must be at least 0 (got {self.n_min})", field="n_min")
        if not 0.0 <= self.p_min <= 1.0:
            raise InputError(f"the confidence cut-off must be within 0..1 (got {self.p_min})", field="p_min")
        if not 1 <= self.parallel <= 256:
            raise InputError(f"the parallel sequences must be 1..256 (got {self.parallel})", field="parallel")
        for name in ("ngram_size_n", "ngram_size_m", "ngram_map_size_n", "ngram_map_size_m", "ngram_mod_n_match",
                     "ngram_mod_n_max", "ngram_mod_n_min"):
            if not 1 <= getattr(self, name) <= 1024:  # llama.cpp's own bounds
                what = name.removeprefix("ngram_").replace("_", " ")  # e.g. "mod n match"
                raise InputError(f"the n-gram {what} must be within 1..1024 (got {getattr(self, name)})", field=name)
        if self.ngram_mod_n_min > self.ngram_mod_n_max:
            raise InputError(f"ngram-mod's shortest draft ({self.ngram_mod_n_min}) is above its longest "
                             f"({self.ngram_mod_n_max}): it would never draft", field="ngram_mod_n_min")
        if self.ngram_map_min_hits < 1:
            raise InputError(f"the n-gram map's minimum hits must be at least 1 (got {self.ngram_map_min_hits})",
                             field="ngram_map_min_hits")
        if self.inject not in INJECT_MODES:
            raise InputError(f"{self.inject}: expected one of {', '.join(INJECT_MODES)}", field="inject")
        if self.spec_type is not None:
            spec_types(self.spec_type)
        if self.spec_select not in ("first", "cost"):
            raise InputError(f"{self.spec_select}: expected first (llama.cpp's rule) or cost", field="spec_select")
        self.ctx.validate()
        self.sampling.validate()


def spec_types(value: str) -> tuple[str, ...]:
    """The types of a --spec-type value (one, or llama.cpp's comma list) in llama.cpp's order of
    preference; unknown, unported and repeated types are refused in one line."""
    names = [v.strip() for v in value.split(",")]
    for name in names:
        if name in SPEC_TYPES:
            continue
        raise InputError(f"{name or '(empty)'}: unknown speculative type (one of {', '.join(SPEC_TYPES)})",
                         field="spec_type")
    if len(set(names)) < len(names):
        raise InputError(f"{value}: a speculative type is given twice", field="spec_type")
    models = [n for n in names if n not in NGRAM_TYPES]
    if len(models) > 1:
        raise InputError(f"{value}: {' and '.join(models)} each draft with a model; one run has one draft model, "
                         "so a list holds n-gram types and at most one of the others", field="spec_type")
    return tuple(sorted(names, key=PRIORITY.index))


@dataclass(frozen=True)
class DraftPlan:
    """How a pair drafts: the speculative type, and for DFlash-family drafts their metadata."""

    spec_type: str | None  # None: plain decoding; several types: llama.cpp's comma list, in its order
    info: DFlashInfo | None = None
    drafter: bool = False  # draft-mtp with a separate drafter that reads the target's cache (Gemma 4)
    parts: tuple["DraftPlan", ...] = ()  # several types: each one's plan, in llama.cpp's order of preference
    eagle3: Eagle3Info | None = None  # draft-eagle3: the head's metadata

    @property
    def uses_draft_model(self) -> bool:
        return self.info is not None or self.drafter or bool({"draft-simple", "draft-eagle3"} & set(self.kinds))

    @property
    def kinds(self) -> tuple[str, ...]:
        """The proposers: this plan's kind, or each part's."""
        return tuple(p.kind for p in self.parts) if self.parts else (self.kind,)

    @property
    def kind(self) -> str:
        """The proposer: dflash, dflash2, dspark, mtp, draft-simple, one of the n-gram types, multi
        (several types) or none."""
        if self.spec_type is None:
            return "none"
        if self.parts:
            return "multi"
        if self.spec_type in NGRAM_TYPES or self.spec_type in ("draft-simple", "draft-eagle3"):
            return self.spec_type
        if self.spec_type == "draft-mtp":
            return "mtp"
        if self.info is not None and self.info.dspark:
            return "dspark"
        return "dflash2" if self.info is not None and self.info.selector_top_k > 0 else "dflash"

    @property
    def max_draft(self) -> int | None:
        return self.info.max_draft if self.info is not None else None


def plan_drafting(cfg: PairConfig, target: GGUFMeta, draft: GGUFMeta | None, warnings: list[str]) -> DraftPlan:
    """The speculative type from the options and the files (llama.cpp's auto-detection: a DFlash
    draft with a Markov head is draft-dspark, any other DFlash draft draft-dflash; without a draft
    model, a target with an MTP block drafts with it: draft-mtp). A Gemma 4 assistant given as the
    draft drafts draft-mtp too (llama.cpp needs --spec-type draft-mtp for it), and any other draft
    LLM draft-simple (likewise: llama.cpp detects no type from an ordinary model)."""
    if cfg.spec_type is not None and len(spec_types(cfg.spec_type)) > 1:
        return plan_several(cfg, target, draft, warnings)
    wanted = cfg.spec_type
    if draft is not None and is_mtp_drafter(draft) and cfg.dflash is not False and wanted not in NGRAM_TYPES:
        if wanted not in (None, "draft-mtp") or cfg.dflash:
            raise InputError(f"the draft is a {draft.arch} MTP drafter: its spec type is draft-mtp", field="spec_type")
        check_model(draft, "draft")
        check_drafter(target, draft)
        return DraftPlan("draft-mtp", drafter=True)
    if cfg.dflash is False:
        if wanted not in (None, *NO_DRAFT_MODEL):
            raise InputError(f"{wanted} drafts with the draft model, which --no-dflash turns off", field="spec_type")
        if wanted == "draft-mtp":
            check_mtp(target)
        return DraftPlan(wanted)
    if wanted in NO_DRAFT_MODEL:
        if cfg.draft is not None:
            what = "from the text itself" if wanted in NGRAM_TYPES else "with the target's own MTP head"
            warnings.append(f"{wanted} drafts {what}: the draft model is not used")
        if wanted == "draft-mtp":
            check_mtp(target)
        return DraftPlan(wanted)
    if draft is None:
        if cfg.dflash or wanted:
            raise InputError(f"{wanted or 'draft-dflash'} needs a draft model", field="draft")
        if target.arch in MTP_ARCHS and has_mtp_head(target) and target.n_nextn == 1:
            return DraftPlan("draft-mtp")  # the head the target ships with
        return DraftPlan(None)
    if wanted == "draft-eagle3" or (is_eagle3(draft) and wanted is None and not cfg.dflash):
        return plan_eagle3(target, draft)
    if wanted == "draft-simple" or (not is_dflash(draft) and wanted is None and not cfg.dflash):
        return plan_draft_model(cfg, target, draft)
    if not is_dflash(draft):
        raise InputError(f"the draft is not a DFlash model (architecture '{draft.arch}'): {draft.path}", field="draft")
    check_model(draft, "draft")
    info = dflash_info(draft)
    check_compatible(target, draft, info)
    if wanted == "draft-dspark" and not info.dspark:
        raise InputError("draft-dspark needs a DSpark draft (one with a Markov head, markov_w1.weight); "
                         "this one is a plain DFlash draft", field="spec_type")
    if wanted == "draft-dflash" and info.dspark:
        raise InputError("the draft has a DSpark Markov head: its spec type is draft-dspark", field="spec_type")
    if info.dspark and cfg.p_min > 0 and not info.has_confidence:
        raise InputError("the DSpark draft has no confidence head, so a confidence cut-off cannot apply "
                         "(set it to 0)", field="p_min")
    own_head = {"d2t", "output.weight"} & draft.tensors
    if own_head and cfg.placement.split_mode == "tensor" and not cfg.placement.mirror_output:
        raise InputError(f"the draft has its own output head ({', '.join(sorted(own_head))}): under a tensor split "
                         "the head is split by vocabulary rows and llama.cpp aborts on it; mirror the output head",
                         field="mirror_output")
    return DraftPlan("draft-dspark" if info.dspark else "draft-dflash", info)


def plan_several(cfg: PairConfig, target: GGUFMeta, draft: GGUFMeta | None, warnings: list[str]) -> DraftPlan:
    """A comma list: the n-gram types, then the one that drafts with a model (if any), planned as
    if it were given alone."""
    types = spec_types(cfg.spec_type)
    parts = [DraftPlan(t) for t in types if t in NGRAM_TYPES]
    model = [t for t in types if t not in NGRAM_TYPES]
    if model:
        part = plan_drafting(replace(cfg, spec_type=model[0]), target, draft, warnings)
        return DraftPlan(",".join(types), part.info, part.drafter, (*parts, part), part.eagle3)
    if cfg.draft is not None:
        warnings.append(f"{','.join(types)} draft from the text itself: the draft model is not used")
    return DraftPlan(",".join(types), parts=tuple(parts))


def plan_draft_model(cfg: PairConfig, target: GGUFMeta, draft: GGUFMeta) -> DraftPlan:
    """draft-simple: the draft must be an ordinary LLM (its vocabulary is checked once loaded,
    by llama.cpp's rules: check_vocab_compatible)."""
    if is_dflash(draft):
        raise InputError("the draft is a DFlash model: it drafts draft-dflash (or draft-dspark), not draft-simple",
                         field="spec_type")
    if is_eagle3(draft):
        raise InputError("the draft is an EAGLE3 head: it drafts draft-eagle3, not draft-simple", field="spec_type")
    check_model(draft, "draft")
    return DraftPlan("draft-simple")


def plan_eagle3(target: GGUFMeta, draft: GGUFMeta) -> DraftPlan:
    """draft-eagle3: the draft must be an EAGLE3 head that fits the target (llama.cpp needs
    --spec-type draft-eagle3 said; ggspec detects the architecture)."""
    if not is_eagle3(draft):
        raise InputError(f"draft-eagle3 needs an EAGLE3 head (architecture 'eagle3'); the draft's is '{draft.arch}'",
                         field="spec_type")
    check_model(draft, "draft")
    info = eagle3_info(draft)
    check_eagle3(target, draft, info)
    return DraftPlan("draft-eagle3", eagle3=info)


def check_draft_model(target: Model, draft: Model) -> None:
    """draft-simple, once both are loaded: llama.cpp's vocabulary rules, and a draft whose cache
    a seq_rm rolls back (a recurrent draft would need state planes of its own)."""
    from ggspec.speculative.draft_model import check_vocab_compatible  # noqa: PLC0415

    if draft.is_recurrent:
        raise InputError(f"the draft's architecture '{draft.arch}' has recurrent layers: ggspec cannot roll back "
                         "a recurrent draft model's drafted tokens yet (use an attention-only draft)", field="draft")
    check_vocab_compatible(target, draft)


def check_mtp(target: GGUFMeta) -> None:
    """Refuse draft-mtp for a target whose file or architecture has no single MTP head."""
    if target.arch in DRAFTER_ARCHS.values():
        raise InputError(f"a {target.arch} target has no MTP block of its own: draft-mtp drafts for it with a separate "
                         f"drafter ({', '.join(DRAFTER_ARCHS)}), given as the draft model", field="spec_type")
    if target.arch not in MTP_ARCHS:
        raise InputError(f"the target's architecture '{target.arch}' has no MTP head in this llama.cpp build "
                         "(draft-mtp runs qwen35, qwen35moe, qwen3next, glm4moe, deepseek2, ...)", field="spec_type")
    if not has_mtp_head(target):
        raise InputError(f"the target has no MTP block (no nextn_predict_layers / blk.N.nextn.eh_proj tensors; "
                         f"convert it with its MTP layers): {target.path}", field="spec_type")
    if target.n_nextn != 1:
        raise InputError(f"the target has {target.n_nextn} MTP blocks: ggspec runs single-head MTP only "
                         "(llama.cpp's chain-head mode is not ported yet)", field="spec_type")


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


class Models:
    """The target (and draft) weights of a pair. Closed last, after every engine built on it."""

    def __init__(self, cfg: PairConfig) -> None:
        cfg.validate()
        self.warnings: list[str] = []
        self.target_meta = read_meta(cfg.target, "target")
        if is_dflash(self.target_meta):
            raise InputError(f"the target is a DFlash draft model, not a target: {cfg.target}", field="target")
        check_model(self.target_meta, "target")
        # (read with draft-mtp too: the draft may be a Gemma 4 drafter)
        uses_draft = cfg.draft is not None and cfg.dflash is not False and \
            not set(spec_types(cfg.spec_type or "draft-dflash")) <= set(NGRAM_TYPES)
        self.draft_meta = read_meta(cfg.draft, "draft") if uses_draft else None
        self.plan = plan_drafting(cfg, self.target_meta, self.draft_meta, self.warnings)
        if not self.plan.uses_draft_model:
            self.draft_meta = None
        self._check_memory(cfg)
        self.target = Model(cfg.target, cfg.n_gpu_layers, what="target", placement=cfg.placement,
                            load_mtp="mtp" in self.plan.kinds and not self.plan.drafter)
        self.draft: Model | None = None
        try:
            if self.draft_meta is not None:
                self.draft = Model(cfg.draft, cfg.n_gpu_layers_draft, what="draft", placement=cfg.placement)
                if "draft-simple" in self.plan.kinds:
                    check_draft_model(self.target, self.draft)
        except BaseException:
            if self.draft is not None:
                self.draft.close()
            self.target.close()
            raise

    @property
    def speculative(self) -> bool:
        return self.plan.spec_type is not None

    def _check_memory(self, cfg: PairConfig) -> None:
        """Weights, caches and recurrent planes against free memory, before anything loads."""
        if cfg.n_gpu_layers or cfg.n_gpu_layers_draft or cfg.placement.multi_device:
            return
        ctx = cfg.ctx
        n_max = resolve_n_max(cfg.n_max, self.plan.max_draft, [])
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
