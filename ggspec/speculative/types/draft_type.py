"""What a draft type is: the shape of one registry entry (registry.py holds them all).

A draft type is one of llama.cpp's `--spec-type`s. Its entry says everything the rest of ggspec
needs to know about it, so that nothing else branches on its name:
  options     its own settings (a dataclass: llama.cpp's flags, defaults, bounds, validation);
  detect      whether the files call for it when no type is given (llama.cpp's auto-detection);
  plan        the checks of the files against it, before any weights load -> a `DraftPlan`;
  make        its proposer, over the engine's target context (and a draft context it opens);
  traits      what its costs and needs are (a draft model, target features, a fixed block, cheap);
  llama_args  the arguments llama.cpp's own tools take for it (bench --native, serve_bench).
Each entry sits at the end of its proposer's module, next to the code it describes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import MISSING, dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any, Literal

from ggspec.errors import InputError
from ggspec.runtime import Context
from ggspec.runtime.preflight import check_model
from ggspec.speculative.types.archs import is_mtp_drafter

if TYPE_CHECKING:
    from ggspec.runtime import ContextParams, Model
    from ggspec.runtime.gguf_meta import GGUFMeta
    from ggspec.speculative.models import Models, PairConfig
    from ggspec.speculative.proposer import Proposer

SIZE_LIMIT = 1024  # llama.cpp's bounds on the n-gram sizes of its command line


# --- options ---------------------------------------------------------------------------------------
# how target features reach a draft that reads them (DFlash: PairConfig.inject)
INJECT_MODES = ("pruned", "deferred", "immediate")


def option(default: Any, key: str, flags: tuple[str, ...], help: str, low: int | None = 1,
           high: int | None = SIZE_LIMIT) -> Any:
    """A field of a type's options: `key` is its name where options are flat (PairConfig fields of
    old, the CLI's parameters, bench documents, `InputError.field`), `flags` llama.cpp's flags for
    it (the first is the one its tools are given), `low`..`high` its bounds (None: unbounded)."""
    return field(default=default, metadata={"key": key, "flags": flags, "help": help, "low": low, "high": high})


@dataclass(frozen=True)
class OptionField:
    """One flat option, as the CLI and bench documents see it."""

    key: str
    default: Any
    flags: tuple[str, ...]
    help: str
    annotation: type


@dataclass(frozen=True)
class Options:
    """A type's options; the base has none. Subclasses declare fields with `option(...)`."""

    def validate(self) -> None:
        """Each field within its bounds (llama.cpp's), then the subclass's own rules."""
        for f in fields(self):
            low, high, value = f.metadata.get("low"), f.metadata.get("high"), getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int):
                continue
            key = f.metadata["key"]
            if low is not None and high is not None and not low <= value <= high:
                what = key.replace("ngram_", "n-gram ").replace("_", " ")  # e.g. "n-gram mod n match"
                raise InputError(f"the {what} must be within {low}..{high} (got {value})", field=key)

    def check_unused(self, running: tuple[DraftType, ...]) -> None:
        """Called when the options were given but their type does not run (default: ignored);
        `running`: the types that do run."""

    @classmethod
    def flat_fields(cls) -> list[OptionField]:
        return [OptionField(f.metadata["key"], f.default if f.default is not MISSING else None, f.metadata["flags"],
                            f.metadata["help"], type(f.default)) for f in fields(cls)]

    @classmethod
    def from_flat(cls, values: dict[str, Any]) -> "Options":
        """The options from flat keys (absent keys keep their defaults)."""
        given = {f.name: values[f.metadata["key"]] for f in fields(cls) if f.metadata["key"] in values}
        return cls(**given)

    def flat(self) -> dict[str, Any]:
        return {f.metadata["key"]: getattr(self, f.name) for f in fields(self)}

    def with_length(self, n_max: int) -> "Options":
        """These options for a row whose draft length is n_max (default: unchanged; the n-gram
        types draft up to their own m-gram size, which benchmarks set to the row's length)."""
        return self


# --- plans -----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class DraftPlan:
    """How a pair drafts, decided from the options and the files before any weights load."""

    type: "DraftType | None"  # None: plain decoding
    meta: Any = None  # what the type read from the draft file (DFlashInfo, Eagle3Info, MTPDrafting)
    max_draft: int | None = None  # the most tokens one draft can hold (a DFlash block - 1)
    reads_draft: bool = False  # the draft file is loaded
    target_mtp: bool = False  # the target loads its own MTP block
    shares_cells: bool = False  # the draft's layers read the target's cache (no cells of its own)
    parts: tuple["DraftPlan", ...] = ()  # several types: each one's plan, in llama.cpp's order
    grows_trees: bool = False  # its drafts give each position's candidates: token trees (tree_budget.py)

    @property
    def spec_type(self) -> str | None:
        """llama.cpp's name of the type (a comma list for several), None for plain decoding."""
        if self.parts:
            return ",".join(p.spec_type for p in self.parts)
        return None if self.type is None else self.type.name

    @property
    def kind(self) -> str:
        """The type's name, "multi" for several, "none" for plain decoding."""
        return "multi" if self.parts else (self.spec_type or "none")

    @property
    def types(self) -> tuple["DraftType", ...]:
        """The types that draft: this plan's, or each part's (none for plain decoding)."""
        if self.parts:
            return tuple(p.type for p in self.parts)
        return () if self.type is None else (self.type,)

    @property
    def kinds(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.types)

    @property
    def uses_draft_model(self) -> bool:
        return self.reads_draft or any(p.reads_draft for p in self.parts)


# --- building a proposer ---------------------------------------------------------------------------

@dataclass
class Build:
    """What a type's `make` gets from the engine; a type that drafts with a context of its own
    opens it with `draft_context`, and the engine owns (and closes) it."""

    cfg: "PairConfig"
    models: "Models"
    target: "Context"
    plan: "DraftPlan"  # the type's own plan (a part's, for several types)
    options: Options
    n_max: int
    parallel: int
    keep_state: bool  # what a drafter learns outlives a request (the server)
    draft_ctx: "Context | None" = None

    def draft_context(self, model: "Model", what: str, *, ctx_other: "Context | None" = None, mtp: bool = False,
                      **params: Any) -> "Context":
        p = replace(self.cfg.ctx, n_seq_max=self.parallel, n_rs_seq=0, **params)
        self.draft_ctx = Context(model, p, ctx_other=ctx_other, what=what, mtp=mtp)
        return self.draft_ctx


# --- the entry -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Traits:
    """What a type needs and what its costs grow with (the adaptive rule and the checks read these)."""

    draft_model: Literal["required", "optional", "none"]  # a draft file (optional: draft-mtp's Gemma 4 drafter)
    target_features: bool  # reads the target's hidden rows (EAGLE3, DFlash, MTP)
    fixed_block: bool  # drafts a block of n_max + 1 rows in one ubatch whatever it keeps (DFlash family)
    cheap: bool  # drafts from the text in microseconds (the n-gram types)
    n_min: bool = False  # --spec-draft-n-min applies (a model drafter's shortest draft)
    confidence: bool = False  # --spec-draft-p-min applies (the drafts carry a confidence)
    injection: bool = False  # target features reach the draft by injection (--spec-dflash-inject's modes)


def _no_args(options: Options | None, n_max: int) -> list[str]:
    return []


def _no_length(options: Options) -> int | None:
    return None


@dataclass(frozen=True)
class DraftType:
    """One of llama.cpp's speculative types (see the module docstring)."""

    name: str  # llama.cpp's --spec-type name
    priority: int  # llama.cpp's order of preference in a comma list (common_speculative_init); ggspec's own
    # text drafters after llama.cpp's, before the model drafters
    traits: Traits
    make: Callable[[Build], "Proposer"]
    # the checks of the files against it (None: there is nothing in the files to check)
    plan: Callable[["PairConfig", "GGUFMeta", "GGUFMeta | None", list[str]], DraftPlan] | None = None
    options: type[Options] = Options
    # from the files alone, when no --spec-type is given; `detect_rank` orders the detections
    detect: Callable[["GGUFMeta", "GGUFMeta | None"], bool] | None = None
    detect_rank: int = 0
    own_n_max: Callable[[Options], int | None] = _no_length  # a draft length of its own (the n-gram types)
    fixed_length: int | None = None  # llama.cpp's loop drafts this many whatever --spec-draft-n-max says
    llama_args: Callable[[Options | None, int], list[str]] = _no_args
    # once both models are loaded (draft-simple: llama.cpp's vocabulary rules)
    check_loaded: Callable[["Model", "Model | None"], None] | None = None
    # the target context's parameters this type needs (draft-mtp: a chained Gemma 4 draft)
    target_params: Callable[["PairConfig", DraftPlan, "ContextParams", list[str]], None] | None = None
    # llama.cpp has it (its loop is the exactness oracle, bench --native runs it); False: ggspec's
    # own (suffix: SuffixDecoding, whose oracle is arctic-inference)
    llama_cpp: bool = True

    def default_options(self) -> Options:
        return self.options()

    def planned(self, cfg: "PairConfig", target: "GGUFMeta", draft: "GGUFMeta | None",
                warnings: list[str]) -> DraftPlan:
        """Its plan for these files (its own checks first, where it has any)."""
        return DraftPlan(self) if self.plan is None else self.plan(cfg, target, draft, warnings)


TEXT_TRAITS = Traits(draft_model="none", target_features=False, fixed_block=False, cheap=True)


def type_names(types: tuple[DraftType, ...]) -> str:
    """A list of types in words ("plain decoding" for none)."""
    return ",".join(t.name for t in types) or "plain decoding"


def check_draft_given(name: str, draft: "GGUFMeta | None") -> "GGUFMeta":
    """The start of every draft-model type's plan: a draft file, and not a separate MTP drafter
    (whose type is draft-mtp)."""
    if draft is not None and is_mtp_drafter(draft):
        raise InputError(f"the draft is a {draft.arch} MTP drafter: its spec type is draft-mtp", field="spec_type")
    if draft is None:
        raise InputError(f"{name} needs a draft model", field="draft")
    return draft


def draft_of_kind(name: str, draft: "GGUFMeta | None", is_kind: Callable[["GGUFMeta"], bool], refusal: str,
                  field: str) -> "GGUFMeta":
    """check_draft_given, then a draft of this type's kind (else `refusal`, formatted with the
    file's `arch` and `path`, naming `field`) whose values llama.cpp can load (preflight)."""
    draft = check_draft_given(name, draft)
    if not is_kind(draft):
        raise InputError(refusal.format(arch=draft.arch, path=draft.path), field=field)
    check_model(draft, "draft")
    return draft
