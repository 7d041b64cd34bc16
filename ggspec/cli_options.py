"""The options `ggspec run` and `ggspec bench` share: each flag, its help and its default, once.

A setting that `bench` sweeps (cache types, context size, draft length, planes, injection,
parallel sequences) is defined once as a `Setting` and has two forms: `.one` (a single value,
for `run`) and `.axis` (a comma list, for `bench`). The other shared options are plain
`Annotated` aliases. `Shared` holds the values both commands read the same way and turns them
into a `PairConfig` (`Shared.pair_config`); `FLAGS` maps the library's field names
(`InputError.field`) back to the flags, so an error names the flag the user typed.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from ggspec.errors import InputError
from ggspec.speculative.types import registry
from ggspec.speculative.models import DEFAULT_N_MAX, PairConfig
from ggspec.speculative.types.registry import SPEC_TYPES, options_from_flat
from ggspec.speculative.sampling import DEFAULT_SEED, SamplerSettings

# the defaults when neither a flag nor a named pair's recommendation (models.toml) gives one
DEFAULTS = {"ctk": "f16", "ctv": "f16", "ctx": 4096, "n_max": DEFAULT_N_MAX, "planes": "uncapped",
            "lead": "default", "inject": "pruned", "parallel": 1}

# PairConfig / ContextParams / request field -> the flag that sets it (errors name the flag)
FLAGS = {
    "target": "-m", "draft": "-md", "spec_type": "--spec-type", "n_max": "--spec-draft-n-max",
    "spec_select": "--spec-select", "plan_pool": "--plan-pool", "p_min": "--spec-draft-p-min", "n_min": "--spec-draft-n-min", 
    "parallel": "-np", "inject": "--spec-dflash-inject", "tree_budget": "--spec-tree-budget",
    "n_ctx": "-c", "n_batch": "-b", "n_ubatch": "-ub", "type_k": "-ctk", "type_v": "-ctv",
    "flash_attn": "-fa", "n_threads": "-t", "n_gpu_layers": "-ngl", "n_gpu_layers_draft": "-ngld",
    "planes": "--spec-draft-rs-planes", "n_rs_seq": "--spec-draft-rs-planes", "n_seq_max": "-np",
    "lead": "--spec-draft-rs-planes-lead",
    "mirror_output": "--mirror-output", "split_mode": "-sm", "tensor_split": "-ts", "rpc": "--rpc",
    "rpc_timeout": "--rpc-timeout", "prompt": "-p", "n_predict": "-n",
    "reasoning_format": "--reasoning-format", "reasoning_budget": "--reasoning-budget", "grammar": "--grammar",
    "temp": "--temp", "top_k": "--top-k", "top_p": "--top-p", "min_p": "--min-p", "seed": "--seed",
    **registry.flags(),  # each draft type's own options (their llama.cpp flags)
    # ggspec serve
    "chat_template": "--chat-template", "chat_template_file": "--chat-template-file",
    # ggspec distill
    "layers": "--layers", "draft_vocab": "--draft-vocab", "block": "--block", "gen_len": "--gen-len",
    "prompt_len": "--prompt-len",
    "draft_layers": "--draft-layers", "data": "--data", "work": "--work", "resume": "--resume",
}


def error_text(exc: Exception) -> str:
    """An error's one line: an InputError naming a field is prefixed with that field's flag."""
    name = getattr(exc, "field", None)
    flag = FLAGS.get(name) if name else None
    return f"{flag}: {exc}" if flag else str(exc)


# --- settings bench sweeps: one definition, a single-value and a comma-list form -------------------


@dataclass(frozen=True)
class Setting:
    names: tuple[str, ...]  # flag spellings (the first is the one errors use)
    help: str  # what one value means (run)
    axis_help: str  # what the comma list means, with an example (bench)
    default: str  # the "[default: ...]" text
    type: type = str
    note: str = ""  # after the default, single form only (e.g. "; clamped to ...")
    run_only: dict = field(default_factory=dict)  # typer.Option extras of the single form (aliases, envvar)

    @property
    def one(self):
        names = self.names + tuple(self.run_only.get("aliases", ()))
        extra = {k: v for k, v in self.run_only.items() if k != "aliases"}
        text = f"{self.help} \\[default: {self.default}]{self.note}."
        return Annotated[Optional[self.type], typer.Option(*names, help=text, **extra)]

    @property
    def axis(self):
        return Annotated[Optional[str], typer.Option(*self.names, help=f"{self.axis_help} \\[default: {self.default}].")]


N_MAX = Setting(
    ("--spec-draft-n-max",), "Draft tokens per step: a number is a fixed length",
    "Draft lengths, e.g. 3,7,15,auto (one beyond the draft's block is skipped)",
    f"auto: each step verifies as many drafts as measured costs and acceptance make worth it (0 included), "
    f"at most the pair's length, else {DEFAULT_N_MAX} or the draft's block size - 1 if smaller",
    note="; a value beyond the draft's block is clamped with a warning; 'auto:N': the adaptive length, at most N")
N_CTX = Setting(("-c", "--ctx-size"), "Context size", "Context sizes, e.g. 1024,4096 (with -np > 1, split among the "
                                                      "slots)",
                f"the pair's, else {DEFAULTS['ctx']}", int, note="; with -np > 1, split evenly among the slots")
TYPE_K = Setting(("-ctk", "--cache-type-k"), "K cache type: f32, f16, bf16, q8_0, q4_0, ...",
                 "K cache types, e.g. f16,q8_0", f"the pair's, else {DEFAULTS['ctk']}")
TYPE_V = Setting(("-ctv", "--cache-type-v"), "V cache type", "V cache types", f"the pair's, else {DEFAULTS['ctv']}")
PLANES = Setting(
    ("--spec-draft-rs-planes",),
    "Recurrent-state planes per sequence for hybrid targets: 2..n_max+1 or 'uncapped'. Fewer planes save memory; "
    "missed rollbacks replay", "Recurrent planes (hybrid targets), e.g. 3,4,5,uncapped",
    f"the pair's, else {DEFAULTS['planes']}",
    run_only={"aliases": ("--spec-mtp-rs-planes",), "envvar": "LLAMA_ARG_SPEC_DRAFT_RS_PLANES"})
LEAD = Setting(
    ("--spec-draft-rs-planes-lead",),
    "How many capped planes keep the states after the first draft tokens: 0 (old layout: newest only), a number "
    "up to planes-2, 'default' (planes-2 for DFlash) or 'auto' (chosen from the running acceptance histogram)",
    "Plane layouts, e.g. 0,default,auto", f"the pair's, else {DEFAULTS['lead']}")
INJECT = Setting(
    ("--spec-dflash-inject",),
    "How target features reach the draft cache: pruned (only committed rows, in one call before the next draft), "
    "deferred (seed 004: all verify rows before the next draft) or immediate (upstream: all verify rows at once, "
    "rejected ones removed after)", "Injection modes, e.g. immediate,deferred,pruned", DEFAULTS["inject"])
PARALLEL = Setting(
    ("-np", "--parallel"), "Sequences decoded together (continuous batching; with -f, up to this many prompts at "
                           "once)", "Parallel sequences, e.g. 1,2,4,8 (the prompts run this many at a time)",
    str(DEFAULTS["parallel"]), int)

# --- options both commands take alike ---------------------------------------------------------------

Model = Annotated[Optional[Path], typer.Option("-m", "--model", help="Target model (GGUF).")]
Draft = Annotated[Optional[Path], typer.Option("-md", "--model-draft", help="Draft model (GGUF).")]
Pair = Annotated[Optional[str], typer.Option(
    "--pair", help="A named pair from models.toml instead of -m/-md (see `ggspec models`).")]
ModelsDir = Annotated[Optional[Path], typer.Option(
    "--models-dir", help="Where your copies of the public pairs' files are.")]
DFlash = Annotated[Optional[bool], typer.Option(
    "--dflash/--no-dflash", help="Draft with the DFlash draft (auto-detected from the draft when omitted); "
                                 "--no-dflash leaves the draft model unused.")]
SpecType = Annotated[Optional[str], typer.Option(
    "--spec-type", help=f"Speculative type: {', '.join(SPEC_TYPES)} (the ngram-* types draft from the text itself "
                        "and take no -md; draft-simple drafts with an ordinary small LLM given as -md; draft-mtp drafts with the "
                        "target's own MTP block, or with a Gemma 4 drafter given as -md) \\[default: detected from the "
                        "draft (an ordinary LLM: draft-simple), or draft-mtp for a target with an MTP block and no -md].")]
SpecSelect = Annotated[str, typer.Option(
    "--spec-select", help="Several --spec-type types: whose draft a step verifies. first: llama.cpp's rule (the first "
                          "type in its order of preference that drafts anything); cost: per sequence, the draft with "
                          "the most expected committed tokens per second (measured acceptance and call costs).")]
TreeBudgetOption = Annotated[Optional[str], typer.Option(
    "--spec-tree-budget", help="Token trees: draft nodes a step verifies as a tree grown from the draft's candidates "
                               "at each position (plain DFlash drafts, dense targets, greedy). A number is a fixed "
                               "budget (0: chains); auto (the default): chosen every few steps from measured costs "
                               "and acceptance, 0 included, where one sequence decodes; auto:N: chosen, up to N.")]
TreeAxis = Annotated[Optional[str], typer.Option(
    "--spec-tree-budget", help="Token-tree budgets, e.g. 0,16,32,auto (0: chains; see run's --spec-tree-budget) "
                               "\\[default: auto].")]
PMin = Annotated[float, typer.Option(
    "--spec-draft-p-min", "--draft-p-min",
    help="Stop a draft where the draft's confidence falls below this, 0..1 (0: never; drafts with a "
         "confidence: draft models, MTP heads, DSpark).")]
NMin = Annotated[int, typer.Option(
    "--spec-draft-n-min", "--draft-min", help="draft-simple, draft-mtp: drop a draft shorter than this (llama.cpp's meaning).")]
NPredict = Annotated[int, typer.Option("-n", "--n-predict", help="Tokens to generate (per prompt).")]
Temp = Annotated[float, typer.Option(
    "--temp", help="Temperature: 0 decodes greedily (ggspec's default: output equal to plain greedy, token for "
                   "token); above 0 samples, speculatively with rejection sampling (lossless in distribution).")]
TempAxis = Annotated[Optional[str], typer.Option(
    "--temp", help="Temperatures, e.g. 0,0.7,1.0 (0: greedy, outputs compared token for token; above 0: sampled, "
                   "compared by acceptance) \\[default: 0].")]
TopK = Annotated[int, typer.Option("--top-k", help="Sampling: keep the k most likely tokens (<= 0: all).")]
TopP = Annotated[float, typer.Option("--top-p", help="Sampling: keep the most likely tokens up to this total "
                                                     "probability (1.0: off).")]
MinP = Annotated[float, typer.Option("--min-p", help="Sampling: drop tokens below this share of the most likely "
                                                     "one's probability (0.0: off).")]
Seed = Annotated[int, typer.Option("-s", "--seed", help="Sampling seed (4294967295: a random one); with -f, prompt "
                                                        "i uses seed + i.")]
PLAN_POOL = PairConfig.plan_pool  # prepared plans per context (patch 0012): measured in docs/adaptive.md
PlanPool = Annotated[int, typer.Option(
    "--plan-pool", help="Prepared graphs and scheduler plans each context keeps (patch 0012), so the alternating "
                        "shapes of draft, verify and inject stop re-planning each other away; 0: llama.cpp's one plan "
                        "(llama.cpp's own tools take LLAMA_SCHED_POOL=N).")]
Threads = Annotated[int, typer.Option("-t", "--threads", help="CPU threads (use 1 for tiny models on few cores).")]
Fit = Annotated[bool, typer.Option(
    "--fit/--no-fit", help="Before loading, measure what the target, the draft and their caches, planes and "
                           "compute buffers take on each device (llama.cpp's own breakdown, allocations "
                           "simulated) and shrink a context size left to ggspec until it fits, or refuse in one "
                           "line.")]
NoMmap = Annotated[bool, typer.Option(
    "--no-mmap", help="Read the model files into buffers of llama.cpp's own rather than mapping them.")]
GpuLayers = Annotated[Optional[int], typer.Option(
    "-ngl", "--n-gpu-layers", help="Target layers to offload, -1 = all \\[default: all with --rpc, else 0].")]
Rpc = Annotated[Optional[str], typer.Option(
    "--rpc", help="llama.cpp RPC workers host:port\\[,host:port...] to run on (see `ggspec rpc-server`).")]
SplitMode = Annotated[Optional[str], typer.Option(
    "-sm", "--split-mode", help="How to spread the models over the devices: none, layer, row or tensor "
                                "\\[default: none].")]
TensorSplit = Annotated[Optional[str], typer.Option(
    "-ts", "--tensor-split", help="Proportions per device, e.g. 3,1 \\[default: llama.cpp's choice].")]
MirrorOutput = Annotated[bool, typer.Option(
    "--mirror-output", help="-sm tensor: keep a full copy of the output head on every device (patch 0004; "
                            "needed by drafts with their own head / d2t).")]
RpcTimeout = Annotated[float, typer.Option(
    "--rpc-timeout", help="Seconds any llama.cpp call may wait on the RPC workers (the handshake included) "
                          "before the run ends.")]

# the defaults of the options above that are not None (one place; `run` and `bench` use these)
N_PREDICT, THREADS, RPC_TIMEOUT = 128, 1, 120.0
# sampling: llama.cpp's defaults, but greedy unless a temperature is given
TEMP, TOP_K, TOP_P, MIN_P, SEED = 0.0, SamplerSettings.top_k, SamplerSettings.top_p, SamplerSettings.min_p, DEFAULT_SEED
P_MIN, N_MIN = PairConfig.p_min, PairConfig.n_min



def with_type_options(command: Callable) -> Callable:
    """A command that takes every draft type's own options: their flags (llama.cpp's names, help
    and defaults from the registry's option fields) are added to the command's parameters, and
    the command gets the values as `type_options` (flat key -> value). So a new type's options
    reach `run`, `serve` and `bench` without touching their signatures."""
    fields_ = registry.option_fields()
    sig = inspect.signature(command, eval_str=True)  # (the command module's annotations are strings)
    extra = [inspect.Parameter(f.key, inspect.Parameter.KEYWORD_ONLY, default=f.default,
                               annotation=Annotated[f.annotation, typer.Option(*f.flags, help=f.help)])
             for f in fields_]
    params = [p for p in sig.parameters.values() if p.name != "type_options"]

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        type_options = {f.key: kwargs.pop(f.key) for f in fields_ if f.key in kwargs}
        return command(*args, type_options=type_options, **kwargs)

    wrapper.__signature__ = sig.replace(parameters=params + extra)
    return wrapper


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


@dataclass
class Shared:
    """The values of the options `run` and `bench` read alike, as given on the command line."""

    model: Path | None = None
    draft: Path | None = None
    pair: str | None = None
    models_dir: Path | None = None
    dflash: bool | None = None
    spec_type: str | None = None
    spec_select: str = "first"
    tree_budget: str | None = None  # --spec-tree-budget as given (None: auto)
    plan_pool: int = PLAN_POOL
    p_min: float = P_MIN
    n_min: int = N_MIN
    # each draft type's own options as given: flat keys (registry.option_fields) -> values
    type_options: dict[str, Any] = field(default_factory=dict)
    threads: int = THREADS
    n_gpu_layers: int | None = None
    rpc: str | None = None
    split_mode: str | None = None
    tensor_split: str | None = None
    mirror_output: bool = False
    rpc_timeout: float = RPC_TIMEOUT
    no_mmap: bool = False
    sampling: SamplerSettings = SamplerSettings(temp=0.0)

    @property
    def needs_draft(self) -> bool:
        """Whether the draft model is wanted (not with the n-gram types or --no-dflash; with
        draft-mtp it is a Gemma 4 drafter where one is given)."""
        return not registry.text_only(self.spec_type) and self.dflash is not False

    def resolve_models(self, plain: bool = False) -> tuple[Path, Path | None, dict]:
        """Target, draft (None when it is not used) and the recommended settings (empty unless a
        named pair is used). `plain`: no drafting wanted at all (run --no-spec)."""
        if self.pair is not None:
            if self.model is not None or self.draft is not None:
                raise InputError("--pair replaces -m/-md: give one or the other")
            from ggspec.catalogue.pairs import get_entry, resolve

            entry = get_entry(self.pair)
            files = resolve(entry, self.models_dir)
            return files.target, files.draft if self.needs_draft else None, entry.settings
        if self.model is None:
            raise InputError("no target model: give -m FILE (or --pair NAME)")
        if self.draft is None and self.needs_draft and not plain and not registry.draft_file_optional(self.spec_type) \
                and not target_drafts_alone(self.model):
            raise InputError("no draft model: give -md FILE, --spec-type ngram-simple (drafts from the text itself), "
                             "or --no-spec for plain decoding (a target with an MTP block drafts with it)")
        return self.model, self.draft if self.needs_draft else None, {}

    def placement(self):
        """The devices, and the target layers to offload (all of them when --rpc adds devices)."""
        from ggspec.runtime.devices import Placement

        placement = Placement.parse(self.split_mode, self.rpc, self.tensor_split, self.mirror_output, self.rpc_timeout)
        ngl = self.n_gpu_layers if self.n_gpu_layers is not None else (-1 if placement.multi_device else 0)
        return placement, ngl

    def pair_config(self, target: Path, draft: Path | None, *, plain: bool = False, n_gpu_layers_draft: int | None = None,
                    **settings):
        """The PairConfig of these options; `settings`: PairConfig fields (n_max, planes, inject,
        parallel, ctx) a command sets from its own or per-configuration values. Checked (each error
        names its field) before any model is read."""
        from ggspec.runtime import ContextParams

        from ggspec.speculative.rules.tree_budget import parse_tree_budget

        placement, ngl = self.placement()
        settings.setdefault("ctx", ContextParams(n_threads=self.threads))
        if self.tree_budget is not None:
            settings["tree_budget"], settings["tree_auto"] = parse_tree_budget(self.tree_budget)
        cfg = PairConfig(target=target, draft=None if plain else draft, use_draft=not plain and self.dflash is not False, fixed_block=not plain and bool(self.dflash),
                         spec_type=None if plain else self.spec_type, spec_select=self.spec_select,
                         plan_pool=self.plan_pool,
                         p_min=self.p_min, n_min=self.n_min,
                         spec_options=options_from_flat(self.type_options),
                         sampling=self.sampling,
                         n_gpu_layers=ngl, n_gpu_layers_draft=ngl if n_gpu_layers_draft is None else n_gpu_layers_draft,
                         placement=placement, mmap=not self.no_mmap, **settings)
        cfg.validate()
        return cfg


# --- prompt files ---------------------------------------------------------------------------------


def parse_prompt_lines(text: str) -> list[str]:
    """`run -f`: one prompt per line, blank lines skipped; `\\n` in a line is a newline and `\\\\`
    a backslash (any other backslash stays as it is)."""
    prompts = []
    for line in text.splitlines():
        if not line.strip():
            continue
        out, i = [], 0
        while i < len(line):
            c = line[i]
            if c == "\\" and i + 1 < len(line) and line[i + 1] in "n\\":
                out.append("\n" if line[i + 1] == "n" else "\\")
                i += 2
            else:
                out.append(c)
                i += 1
        prompts.append("".join(out))
    return prompts


def parse_int_list(text: str, flag: str) -> tuple[int, ...]:
    """"2,5,9" -> (2, 5, 9); anything else is one line naming the flag."""
    try:
        values = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise InputError(f"{flag} {text}: expected comma-separated integers, e.g. 2,5,9") from None
    return values
