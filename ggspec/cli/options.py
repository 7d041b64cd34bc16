"""The option table: every flag `run`, `serve` and `bench` share, declared once.

Each shared flag is a field of `Shared`, declared with `flag(...)`: its spellings (llama.cpp's;
the first is the one error lines name), its help, its default (the field's), the commands that
take it, and, where `bench` sweeps it, the help of its comma-list form. `parameters.takes_options`
generates a command's typer parameters from this table, as it does each draft type's own options
from the registry's option dataclasses, and calls the command with one `Shared`. So a new shared
flag is one field here; a flag only one command takes stays in command_options.

`FLAGS` maps the library's field names (`InputError.field`) back to the flags, so an error line
names the flag the user typed.
"""

from __future__ import annotations

import typing
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from ggspec.cli.parsers import GpuLayers, NMax, SpecTypes, flash_attn, gpu_layers, n_max, spec_types
from ggspec.speculative.models import DEFAULT_N_MAX, PairConfig
from ggspec.speculative.sampling import DEFAULT_SEED, SamplerSettings
from ggspec.speculative.types import registry
from ggspec.speculative.types.registry import LONE_MODEL, SPEC_TYPES

# the defaults when neither a flag nor a named pair's recommendation (models.toml) gives one
DEFAULTS = {"ctk": "f16", "ctv": "f16", "ctx": 4096, "n_max": DEFAULT_N_MAX, "planes": "uncapped",
            "lead": "default", "inject": "pruned", "parallel": 1}
SERVE_SLOTS = 4  # llama-server's default slots (serve's -np when not given)

# the defaults of the options below that are not None
N_PREDICT, THREADS, RPC_TIMEOUT = 128, 1, 120.0
# sampling: llama.cpp's defaults, but greedy unless a temperature is given
TEMP, TOP_K, TOP_P, MIN_P, SEED = 0.0, SamplerSettings.top_k, SamplerSettings.top_p, SamplerSettings.min_p, DEFAULT_SEED
P_MIN, N_MIN, PLAN_POOL = PairConfig.p_min, PairConfig.n_min, PairConfig.plan_pool

DRAFTING = ("run", "serve", "bench")  # the commands that decode with a draft
RUN_SERVE = ("run", "serve")
# the groups `--help` lists the options in, in this order (a command's own flags come first)
MODELS, DRAFT, SAMPLING, CONTEXT, DEVICES = "Models", "Drafting", "Sampling", "Context and threads", "Devices"


@dataclass(frozen=True)
class Flag:
    """How one field of `Shared` is given on the command line."""

    spellings: tuple[str, ...]  # llama.cpp's spellings; the first is the one error lines name
    help: str
    panel: str  # the group `--help` lists it in
    commands: tuple[str, ...] = DRAFTING  # the commands that take it
    sweep: str | None = None  # bench takes a comma list (this is its help): the list goes to Shared.swept
    parser: Callable[[str], Any] | None = None  # the typed value from its text (ggspec.cli.parsers)
    # llama.cpp's tools: the "same" option (the same spellings: tests/test_cli_options.py), an
    # "other" option under one of its spellings, or "none"
    upstream: str = "same"
    old: tuple[str, ...] = ()  # older spellings, still accepted (llama.cpp has removed its own)
    fields: tuple[str, ...] = ()  # library fields it sets under other names (InputError.field)
    variants: dict[str, dict] = field(default_factory=dict)  # command -> its own "help", "default", "extra"
    extra: dict = field(default_factory=dict)  # typer.Option's other arguments (envvar, show_default)


def flag(*spellings: str, default: Any = None, **how: Any) -> Any:
    """A field of `Shared` given by these flags; `how`: the rest of its Flag."""
    return field(default=default, metadata={"flag": Flag(spellings, **how)})


def shown(default: str) -> str:
    """A help text's default, for an option whose default (None) says "not given"."""
    return f"\\[default: {default}]"


N_MAX_DEFAULT = shown(f"auto: each step verifies as many drafts as measured costs and acceptance make worth it "
                      f"(0 included), at most the pair's length, else {DEFAULT_N_MAX} or the draft's block size - 1 "
                      "if smaller")
CTX_DEFAULT = shown(f"the pair's, else {DEFAULTS['ctx']}")
CTK_DEFAULT, CTV_DEFAULT = shown(f"the pair's, else {DEFAULTS['ctk']}"), shown(f"the pair's, else {DEFAULTS['ctv']}")
PLANES_DEFAULT, LEAD_DEFAULT = shown(f"the pair's, else {DEFAULTS['planes']}"), shown(f"the pair's, else {DEFAULTS['lead']}")


@dataclass
class Shared:
    """The values of the table's options as a command got them (the options it does not take keep
    their defaults); bench's comma lists are in `swept`, each draft type's options in `type_options`."""

    # --- models ---------------------------------------------------------------------------------
    model: Path | None = flag("-m", "--model", help="Target model (GGUF).", panel=MODELS,
                              commands=(*DRAFTING, "distill"), fields=("target",))
    draft: Path | None = flag("-md", "--model-draft", "--spec-draft-model", help="Draft model (GGUF).", panel=MODELS)
    pair: str | None = flag(
        "--pair", help="A named pair from models.toml instead of -m/-md (see `ggspec models`).", panel=MODELS,
        commands=(*DRAFTING, "distill"), upstream="none")
    models_dir: Path | None = flag(  # (llama-server's --models-dir is its router's folder of models)
        "--models-dir", help="Where your copies of the public pairs' files are.", panel=MODELS,
        commands=(*DRAFTING, "models"), upstream="other")

    # --- drafting -------------------------------------------------------------------------------
    spec_type: SpecTypes | None = flag(
        "--spec-type", parser=spec_types, panel=DRAFT,
        help=f"Speculative type: {', '.join(SPEC_TYPES)}, or none (the ngram-* types and suffix draft from the text "
             "itself and take no -md; draft-simple drafts with an ordinary small LLM given as -md; draft-mtp drafts with "
             "the target's own MTP block, or with a Gemma 4 drafter given as -md) \\[default: detected from the draft (an "
             f"ordinary LLM: draft-simple), draft-mtp for a target with an MTP block, else {LONE_MODEL} (a lone model "
             "drafts from the text, verified only where it pays)].")
    fixed_block: bool = flag(  # (llama.cpp's --dflash downloads a DFlash draft beside a model)
        "--dflash", default=False, panel=DRAFT, upstream="other",
        help="The draft must be a block drafter (DFlash, DFlash2 or DSpark), else one line says why; without it the "
             "type is detected from the draft.")
    no_draft: bool = flag(
        "--no-draft", default=False, old=("--no-dflash",), panel=DRAFT, upstream="none",
        help="Leave the draft model unused, whatever the type (--no-dflash: the same, by its old name).")
    no_spec: bool = flag("--no-spec", default=False, commands=RUN_SERVE, panel=DRAFT, upstream="none",
                         help="Plain decoding on the target, no draft (the A/B baseline).")
    n_max: NMax | None = flag(
        "--spec-draft-n-max", parser=n_max, panel=DRAFT,
        help=f"Draft tokens per step: a number is a fixed length {N_MAX_DEFAULT}; a value beyond the draft's block "
             "is clamped with a warning; 'auto:N': the adaptive length, at most N.",
        sweep=f"Draft lengths, e.g. 3,7,15,auto (one beyond the draft's block is skipped) {N_MAX_DEFAULT}.")
    p_min: float = flag(
        "--spec-draft-p-min", "--draft-p-min", default=P_MIN, panel=DRAFT,
        help="Stop a draft where the draft's confidence falls below this, 0..1 (0: never; drafts with a confidence: "
             "draft models, MTP heads, DSpark).")
    n_min: int = flag(
        "--spec-draft-n-min", default=N_MIN, old=("--draft-min",), commands=RUN_SERVE, panel=DRAFT,
        help="draft-simple, draft-mtp: drop a draft shorter than this (llama.cpp's meaning).")
    spec_select: str = flag(
        "--spec-select", default="first", panel=DRAFT, upstream="none",
        help="Several --spec-type types: whose draft a step verifies. first: llama.cpp's rule (the first type in its "
             "order of preference that drafts anything); cost: per sequence, the draft with the most expected "
             "committed tokens per second (measured acceptance and call costs).")
    tree_budget: str | None = flag(
        "--spec-tree-budget", panel=DRAFT, upstream="none",
        help="Token trees: draft nodes a step verifies as a tree grown from the draft's candidates at each position "
             "(plain DFlash drafts, dense targets, greedy). A number is a fixed budget (0: chains); auto (the "
             "default): chosen every few steps from measured costs and acceptance, 0 included, where one sequence "
             "decodes; auto:N: chosen, up to N.",
        sweep="Token-tree budgets, e.g. 0,16,32,auto (0: chains; see run's --spec-tree-budget) \\[default: auto].")
    inject: str | None = flag(
        "--spec-dflash-inject", panel=DRAFT, upstream="none",
        help="How target features reach the draft cache: pruned (only committed rows, in one call before the next "
             "draft), deferred (all verify rows, before the next draft) or immediate (upstream: all verify rows at "
             f"once, rejected ones removed after) {shown(DEFAULTS['inject'])}.",
        sweep=f"Injection modes, e.g. immediate,deferred,pruned {shown(DEFAULTS['inject'])}.")
    rs_planes: str | None = flag(
        "--spec-draft-rs-planes", old=("--spec-mtp-rs-planes",), panel=DRAFT, upstream="none",
        fields=("planes", "n_rs_seq"), extra={"envvar": "LLAMA_ARG_SPEC_DRAFT_RS_PLANES"},
        help="Recurrent-state planes per sequence for hybrid targets: 2..n_max+1 or 'uncapped'. Fewer planes save "
             f"memory; missed rollbacks replay {PLANES_DEFAULT}.",
        sweep=f"Recurrent planes (hybrid targets), e.g. 3,4,5,uncapped {PLANES_DEFAULT}.")
    rs_lead: str | None = flag(
        "--spec-draft-rs-planes-lead", panel=DRAFT, upstream="none", fields=("lead",),
        help="How many capped planes keep the states after the first draft tokens: 0 (old layout: newest only), a "
             "number up to planes-2, 'default' (planes-2 for DFlash) or 'auto' (chosen from the running acceptance "
             f"histogram) {LEAD_DEFAULT}.",
        sweep=f"Plane layouts, e.g. 0,default,auto {LEAD_DEFAULT}.")
    plan_pool: int = flag(
        "--plan-pool", default=PLAN_POOL, panel=DRAFT, upstream="none",
        help="Prepared graphs and scheduler plans each context keeps (patch 0012), so the alternating shapes of "
             "draft, verify and inject stop re-planning each other away; 0: llama.cpp's one plan (llama.cpp's own "
             "tools take LLAMA_SCHED_POOL=N).")

    # --- sampling -------------------------------------------------------------------------------
    n_predict: int = flag("-n", "--n-predict", "--predict", default=N_PREDICT, commands=("run", "bench"),
                          panel=SAMPLING, help="Tokens to generate (per prompt).")
    temp: float = flag(
        "--temp", "--temperature", default=TEMP, panel=SAMPLING,
        help="Temperature: 0 decodes greedily (ggspec's default: output equal to plain greedy, token for token); "
             "above 0 samples, speculatively with rejection sampling (lossless in distribution).",
        sweep="Temperatures, e.g. 0,0.7,1.0 (0: greedy, outputs compared token for token; above 0: sampled, "
              "compared by acceptance) \\[default: 0].",
        variants={"serve": {"default": 0.8, "help": "Temperature of requests that give none (0: greedy)."}})
    top_k: int = flag("--top-k", default=TOP_K, panel=SAMPLING,
                      help="Sampling: keep the k most likely tokens (<= 0: all).")
    top_p: float = flag("--top-p", default=TOP_P, panel=SAMPLING,
                        help="Sampling: keep the most likely tokens up to this total probability (1.0: off).")
    min_p: float = flag("--min-p", default=MIN_P, panel=SAMPLING,
                        help="Sampling: drop tokens below this share of the most likely one's probability (0.0: off).")
    seed: int = flag("--seed", "-s", default=SEED, commands=("run", "bench"), panel=SAMPLING,
                     help="Sampling seed (4294967295: a random one); with -f, prompt i uses seed + i.")

    # --- context and threads --------------------------------------------------------------------
    parallel: int | None = flag(
        "-np", "--parallel", panel=CONTEXT, fields=("n_seq_max",),
        help="Sequences decoded together (continuous batching; with -f, up to this many prompts at once) "
             f"{shown(str(DEFAULTS['parallel']))}.",
        sweep=f"Parallel sequences, e.g. 1,2,4,8 (the prompts run this many at a time) {shown(str(DEFAULTS['parallel']))}.",
        variants={"serve": {"help": "Slots: requests decoded together (continuous batching); -c is split among them. "
                                    "Not given, the memory fit may lower it.",
                            "extra": {"show_default": str(SERVE_SLOTS)}}})
    n_ctx: int | None = flag(
        "-c", "--ctx-size", panel=CONTEXT,
        help=f"Context size {CTX_DEFAULT}; with -np > 1, split evenly among the slots.",
        sweep=f"Context sizes, e.g. 1024,4096 (with -np > 1, split among the slots) {CTX_DEFAULT}.")
    n_batch: int = flag("-b", "--batch-size", default=512, commands=RUN_SERVE, panel=CONTEXT,
                        help="Logical batch size.")
    n_ubatch: int = flag("-ub", "--ubatch-size", default=512, commands=RUN_SERVE, panel=CONTEXT,
                         help="Physical batch size.")
    type_k: str | None = flag("-ctk", "--cache-type-k", panel=CONTEXT,
                              help=f"K cache type: f32, f16, bf16, q8_0, q4_0, ... {CTK_DEFAULT}.",
                              sweep=f"K cache types, e.g. f16,q8_0 {CTK_DEFAULT}.")
    type_v: str | None = flag("-ctv", "--cache-type-v", panel=CONTEXT,
                              help=f"V cache type {CTV_DEFAULT}.", sweep=f"V cache types {CTV_DEFAULT}.")
    flash_attn: str = flag(
        "-fa", "--flash-attn", default="auto", parser=flash_attn, panel=CONTEXT,
        help="Flash attention: on, off or auto (llama.cpp's own choice: on wherever the backend has it, the CPU "
             "included).")
    swa_full: bool = flag(
        "--swa-full", default=False, commands=RUN_SERVE, panel=CONTEXT,
        help="Keep every position's cells on sliding-window layers (Gemma 2/3, ...), as llama.cpp's --swa-full; "
             "by default a window-sized cache, as llama.cpp's tools: cheaper attention deep into a context.")
    threads: int = flag("-t", "--threads", default=THREADS, panel=CONTEXT, fields=("n_threads",),
                        help="CPU threads (use 1 for tiny models on few cores).")
    fit: bool = flag(  # (llama.cpp's --fit takes on|off, and also fits the layers offloaded)
        "--fit/--no-fit", default=True, commands=RUN_SERVE, panel=CONTEXT, upstream="other",
        help="Before loading, measure what the target, the draft and their caches, planes and compute buffers take "
             "on each device (llama.cpp's own breakdown, allocations simulated) and shrink a context size left to "
             "ggspec until it fits, or refuse in one line.")
    no_mmap: bool = flag("--no-mmap", default=False, commands=RUN_SERVE, panel=CONTEXT, upstream="none",
                         help="Read the model files into buffers of llama.cpp's own rather than mapping them.")

    # --- devices --------------------------------------------------------------------------------
    n_gpu_layers: GpuLayers | None = flag(
        "-ngl", "--n-gpu-layers", "--gpu-layers", parser=gpu_layers("n_gpu_layers"), panel=DEVICES,
        extra={"metavar": "N|all|auto"},
        help="Target layers to offload: a number (-1 or all: every layer), or auto: every layer on a GPU build or "
             "over --rpc, else none (ggspec's memory fit then sizes the context, not the layers) "
             "\\[default: all with --rpc, else 0].")
    n_gpu_layers_draft: GpuLayers | None = flag(
        "-ngld", "--n-gpu-layers-draft", "--spec-draft-ngl", "--gpu-layers-draft",
        parser=gpu_layers("n_gpu_layers_draft"), commands=RUN_SERVE, panel=DEVICES, extra={"metavar": "N|all|auto"},
        help="Draft layers to offload, as -ngl \\[default: as -ngl].")
    rpc: str | None = flag(
        "--rpc", panel=DEVICES,
        help="llama.cpp RPC workers host:port\\[,host:port...] to run on (see `ggspec rpc-server`).")
    split_mode: str | None = flag(
        "-sm", "--split-mode", panel=DEVICES,
        help="How to spread the models over the devices: none, layer, row or tensor \\[default: none].")
    tensor_split: str | None = flag(
        "-ts", "--tensor-split", panel=DEVICES,
        help="Proportions per device, e.g. 3,1 \\[default: llama.cpp's choice].")
    mirror_output: bool = flag(
        "--mirror-output", default=False, panel=DEVICES, upstream="none",
        help="-sm tensor: keep a full copy of the output head on every device (patch 0004; needed by drafts with "
             "their own head / d2t).")
    rpc_timeout: float = flag(
        "--rpc-timeout", default=RPC_TIMEOUT, panel=DEVICES, upstream="none",
        help="Seconds any llama.cpp call may wait on the RPC workers (the handshake included) before the run ends.")

    # --- not flags of the table -----------------------------------------------------------------
    # each draft type's own options as given: flat keys (registry.option_fields) -> values
    type_options: dict[str, Any] = field(default_factory=dict)
    # bench's comma lists as given (None: not given), by field name: the axes of its matrix
    swept: dict[str, str | None] = field(default_factory=dict)
    # the drafter is a lone model's default, not given (config.with_lone_default)
    lone_default: bool = False

    @property
    def sampling(self) -> SamplerSettings:
        return SamplerSettings(temp=self.temp, top_k=self.top_k, top_p=self.top_p, min_p=self.min_p, seed=self.seed)

    @property
    def plain(self) -> bool:
        """No drafting at all: --no-spec or --spec-type none."""
        return self.no_spec or (self.spec_type is not None and self.spec_type.none)

    @property
    def needs_draft(self) -> bool:
        """Whether the draft model is wanted (not with the n-gram types or --no-draft; with
        draft-mtp it is a Gemma 4 drafter where one is given)."""
        return not (self.spec_type is not None and self.spec_type.text_only) and not self.no_draft


@dataclass(frozen=True)
class Entry:
    """One row of the table: a field of `Shared` and how it is given."""

    name: str
    default: Any
    hint: Any  # the field's type
    flag: Flag

    def sweeps(self, command: str) -> bool:
        """Whether `command` takes this option as a comma list (bench's axes)."""
        return command == "bench" and self.flag.sweep is not None


def table() -> list[Entry]:
    """The shared options, in `--help`'s order."""
    hints = typing.get_type_hints(Shared)
    return [Entry(f.name, f.default, hints[f.name], f.metadata["flag"]) for f in fields(Shared) if "flag" in f.metadata]


# --- field -> flag ------------------------------------------------------------------------------------

# the library fields the commands' own flags set (the table's are its own)
OWN_FLAGS = {
    "prompt": "-p", "grammar": "--grammar",
    "reasoning_format": "--reasoning-format", "reasoning_budget": "--reasoning-budget",
    "chat_template": "--chat-template", "chat_template_file": "--chat-template-file",  # serve
    "layers": "--layers", "draft_vocab": "--draft-vocab", "block": "--block", "gen_len": "--gen-len",  # distill
    "prompt_len": "--prompt-len", "draft_layers": "--draft-layers", "data": "--data", "work": "--work",
    "resume": "--resume",
}


def _flags() -> dict[str, str]:
    table_flags = {name: f.metadata["flag"].spellings[0] for f in fields(Shared) if "flag" in f.metadata
                   for name in (f.name, *f.metadata["flag"].fields)}
    return {**table_flags, **registry.flags(), **OWN_FLAGS}


# PairConfig / ContextParams / request field -> the flag that sets it (errors name the flag)
FLAGS = _flags()


def error_text(exc: Exception) -> str:
    """An error's one line: an InputError naming a field is prefixed with that field's flag."""
    name = getattr(exc, "field", None)
    flag_ = FLAGS.get(name) if name else None
    return f"{flag_}: {exc}" if flag_ else str(exc)
