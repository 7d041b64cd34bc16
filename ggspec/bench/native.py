"""llama.cpp's own C++ loops of the same patched build, run as subprocesses so their figures can
sit next to ggspec's in one benchmark: the speculative loop (llama-speculative-simple) and plain
greedy decoding (llama-completion, llama.cpp's text-completion program).

Patch 0003 gives the speculative loop the deferred DFlash injection (LLAMA_ARG_SPEC_DFLASH_DEFER=1);
patch 0005 gives it a full-resolution decode timer and, as a benchmark device, forced acceptance
(GGSPEC_BENCH_FORCED: the target's own greedy continuation corrupted where a profile says).
Patch 0007 gives llama-completion the same timer line: the wall clock of its decode loop, from
the first sampled token on (what ggspec's plain decode time measures too).
Patch 0009 makes the speculative loop write every draft call's tokens to the file named by
GGSPEC_BENCH_DRAFTS, one line per call: "<pos> <id_last> : <d1> ... <dn>" (pos: the target
position of id_last; draft token i goes to pos + 1 + i; an empty draft ends at the colon). The
drafts are what the speculative implementation proposed, before any forced replacement.

Why llama-completion for the plain row: llama-speculative-simple refuses to run without a
speculator, llama-cli is a chat client of the server in this tree, and llama-simple cannot be
given the context size, cache types, threads, flash attention or --ignore-eos.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ggspec.errors import InputError, LlamaError
from ggspec.native import build as nb
from ggspec.speculative.types import registry
from ggspec.speculative.types.draft_type import Options
from ggspec.speculative.sampling import SamplerSettings

TOOL = "llama-speculative-simple"
PLAIN_TOOL = "llama-completion"
_DECODED = re.compile(r"ggspec-bench: decoded (\d+) tokens in (\d+) us")  # patches 0005 and 0007
_DRAFTED = re.compile(r"n_drafted\s*=\s*(\d+)")
_ACCEPTED = re.compile(r"n_accept\s*=\s*(\d+)")

# llama.cpp's --spec-type names run_cpp accepts are those ggspec runs (SPEC_TYPES): the draft-* types but
# draft-mtp need a draft file, the n-gram types draft from the context itself (n_max is their m-gram size)
DRAFTS_ENV = "GGSPEC_BENCH_DRAFTS"  # patch 0009
_REUSED = re.compile(r"graphs reused\s*=\s*(\d+)")
_ENV_DROPPED = ("LLAMA_ARG_SPEC_DFLASH_DEFER", "GGSPEC_BENCH_FORCED", DRAFTS_ENV)


@dataclass
class CppResult:
    """What one run of the tool printed: its text (prompt included) and counts."""
    text: str = ""
    n_decoded: int = 0
    seconds: float = 0.0
    drafted: int = 0
    accepted: int = 0
    # with dump_drafts: every draft call of the loop, in order, as (pos, tokens) -- pos is the
    # target position of the token drafted from (id_last), draft token i goes to pos + 1 + i --
    # and the id_last of each call (same order)
    drafts: list[tuple[int, list[int]]] = field(default_factory=list)
    draft_anchors: list[int] = field(default_factory=list)
    # the graphs each context reused, as llama.cpp's perf lines print them (target first)
    graphs_reused: list[int] = field(default_factory=list)

    def add(self, other: "CppResult") -> None:
        self.n_decoded += other.n_decoded
        self.seconds += other.seconds
        self.drafted += other.drafted
        self.accepted += other.accepted

    @property
    def tps(self) -> float:
        return self.n_decoded / self.seconds if self.seconds else 0.0


def find_tool(name: str = TOOL) -> Path:
    """A tool of the current patches' `--tools` build; one line of error when there is none."""
    info = nb.find_build(nb.BuildOptions(tools=True))
    tool = Path(info.lib_dir) / name if info else None
    if tool is None or not tool.is_file():
        raise InputError(f"llama.cpp's {name} is not built: run `ggspec build --tools`")
    return tool


def _run(tool: Path, cmd: list[str], env: dict, timeout: float) -> subprocess.CompletedProcess:
    try:
        # stdin closed: a tool that turns interactive (chat template, EOF) must not wait for input
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout,
                              stdin=subprocess.DEVNULL, errors="replace")
    except subprocess.TimeoutExpired:
        raise LlamaError(f"{tool.name} did not finish within {timeout:.0f} s") from None
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise LlamaError(f"{tool.name} failed (exit {proc.returncode}): {last}")
    return proc


def _decoded(tool: Path, proc: subprocess.CompletedProcess, patch: str) -> tuple[int, float]:
    m = _DECODED.search(proc.stderr)
    if not m:
        raise LlamaError(f"could not read the decode time from {tool.name}'s output (is patch {patch} applied?)")
    return int(m.group(1)), int(m.group(2)) / 1e6


def _text(stdout: str, prompt: str) -> str:
    """The printed text from the prompt on; the tools print "\n\n" before the prompt and twice
    after the generated text."""
    text = stdout[stdout.find(prompt[:32]):]
    return text[:-4] if text.endswith("\n\n\n\n") else text[:-2] if text.endswith("\n\n") else text


def sampler_args(s: SamplerSettings | None) -> list[str]:
    """The tools' sampling flags: greedy (--temp 0) for None or a zero temperature. The tools'
    other samplers (penalties, DRY, XTC, typical-p, top-n-sigma) are off by default, as in ggspec."""
    if s is None or s.greedy:
        return ["--temp", "0"]
    return ["--temp", str(s.temp), "--top-k", str(s.top_k), "--top-p", str(s.top_p), "--min-p", str(s.min_p),
            "--seed", str(s.seed)]


def parse_drafts(text: str) -> tuple[list[tuple[int, list[int]]], list[int]]:
    """A GGSPEC_BENCH_DRAFTS file (patch 0009): the (pos, tokens) of every draft call and the
    id_last of each. A line that does not parse raises LlamaError."""
    drafts: list[tuple[int, list[int]]] = []
    anchors: list[int] = []
    for i, line in enumerate(text.splitlines(), 1):
        head, sep, tail = line.partition(":")
        try:
            pos, id_last = (int(x) for x in head.split())
            tokens = [int(x) for x in tail.split()]
        except ValueError:
            raise LlamaError(f"{DRAFTS_ENV} line {i} is not '<pos> <id_last> : <tokens>': {line!r}") from None
        if not sep:
            raise LlamaError(f"{DRAFTS_ENV} line {i} is not '<pos> <id_last> : <tokens>': {line!r}")
        drafts.append((pos, tokens))
        anchors.append(id_last)
    return drafts, anchors


def draft_steps(drafts: list[tuple[int, list[int]]], accepted: int) -> list[tuple[int, int]]:
    """(drafted, accepted) of every draft call of a dump (patch 0009): each call commits its
    accepted drafts and one target token, so the next call's position says how many were
    accepted; the last call's are what the run's total (llama.cpp's n_accept) leaves."""
    steps = []
    for (pos, tokens), (nxt, _) in zip(drafts, drafts[1:]):
        steps.append((len(tokens), min(nxt - pos - 1, len(tokens))))
    if drafts:
        steps.append((len(drafts[-1][1]), max(0, min(accepted - sum(a for _, a in steps), len(drafts[-1][1])))))
    return steps


def gpu_layer_args(n_gpu_layers: int, draft: bool = False) -> list[str]:
    """ggspec's -ngl for llama.cpp's tools, whose default is "auto" (offload what fits): -1 -> all,
    0 stays on the CPU, so both loops of one row run on the same devices."""
    value = "all" if n_gpu_layers < 0 else str(n_gpu_layers)
    return ["-ngl", value] + (["-ngld", value] if draft else [])


def run_cpp(tool: Path, target: Path, draft: Path | None, prompt: str, n: int, n_max: int, *, defer: bool,
            n_ctx: int = 2048, ctk: str = "f16", ctv: str = "f16", flash_attn: str = "off", threads: int = 1,
            spec_type: str, forced: Path | None = None, timeout: float = 600,
            p_min: float | None = None, n_min: int | None = None, options: Mapping[str, Options] | None = None,
            dump_drafts: bool = False, sampling: SamplerSettings | None = None, n_gpu_layers: int = 0) -> CppResult:
    """One run of llama.cpp's speculative loop (greedy unless `sampling` has a temperature) with `spec_type` (one,
    or a comma list, of the registry's types; a type that needs a draft model needs `draft`, draft-mtp only for a
    Gemma 4 drafter). `options`: the types' own options by type name, as ggspec runs them (registry entries'
    `llama_args`); a type without any gets llama.cpp's defaults with `n_max` as its own length (the n-gram
    types' m-gram size). `forced`: a GGSPEC_BENCH_FORCED file. `p_min`:
    --spec-draft-p-min (DSpark: the confidence threshold; llama.cpp's default is 0), `n_min`:
    --spec-draft-n-min (draft-mtp drops shorter drafts). With
    `dump_drafts`, the result carries every draft call's tokens (patch 0009)."""
    types = registry.parse(spec_type)  # one, or a comma list
    names = ",".join(t.name for t in types)
    if any(t.traits.draft_model == "required" for t in types) and draft is None:
        raise InputError(f"--spec-type {spec_type} needs a draft model")
    if all(t.traits.draft_model == "none" for t in types) and draft is not None:
        raise InputError(f"--spec-type {spec_type} takes no draft model")
    env = {k: v for k, v in os.environ.items() if k not in _ENV_DROPPED}
    if defer:
        env["LLAMA_ARG_SPEC_DFLASH_DEFER"] = "1"
    if forced is not None:
        env["GGSPEC_BENCH_FORCED"] = str(forced)
    cmd = [str(tool), "-m", str(target)]
    if draft is not None:
        cmd += ["-md", str(draft)]
    cmd += ["--spec-type", names, "--spec-draft-n-max", str(n_max)]
    for t in types:
        cmd += t.llama_args((options or {}).get(t.name), n_max)
    if p_min is not None:
        cmd += ["--spec-draft-p-min", str(p_min)]
    if n_min is not None:
        cmd += ["--spec-draft-n-min", str(n_min)]
    # (--no-escape: the prompt is raw text; llama.cpp would turn a "\\t" in code into a tab)
    cmd += ["-p", prompt, "--no-escape", "-n", str(n), *sampler_args(sampling),
            "-t", str(threads), "-td", str(threads), "-c", str(n_ctx), "-ctk", ctk, "-ctv", ctv,
            "--ignore-eos", "-fa", flash_attn, *gpu_layer_args(n_gpu_layers, draft=draft is not None)]
    with tempfile.TemporaryDirectory(prefix="ggspec-drafts-") as tmp:
        dump = Path(tmp) / "drafts.txt"
        if dump_drafts:
            env[DRAFTS_ENV] = str(dump)
        proc = _run(tool, cmd, env, timeout)
        if dump_drafts:
            if not dump.is_file():
                raise LlamaError(f"{tool.name} wrote no draft dump (is patch 0009 applied?)")
            drafts, anchors = parse_drafts(dump.read_text())
        else:
            drafts, anchors = [], []
    n_decoded, seconds = _decoded(tool, proc, "0005")
    drafted, accepted = _DRAFTED.search(proc.stderr), _ACCEPTED.search(proc.stderr)
    return CppResult(_text(proc.stdout, prompt), n_decoded, seconds,
                     int(drafted.group(1)) if drafted else 0, int(accepted.group(1)) if accepted else 0,
                     drafts, anchors, [int(x) for x in _REUSED.findall(proc.stderr)])


def run_plain(tool: Path, target: Path, prompt: str, n: int, *, n_ctx: int = 2048, ctk: str = "f16",
              ctv: str = "f16", flash_attn: str = "off", threads: int = 1, timeout: float = 600,
              sampling: SamplerSettings | None = None, n_gpu_layers: int = 0) -> CppResult:
    """One plain run of llama.cpp's llama-completion (greedy unless `sampling` has a temperature):
    exactly n tokens (EOG never sampled), raw prompt (no chat template), decode timed by patch 0007."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLAMA_ARG_")}
    cmd = [str(tool), "-m", str(target), "-p", prompt, "--no-escape", "-n", str(n), *sampler_args(sampling), "-no-cnv",
           "-t", str(threads), "-tb", str(threads), "-c", str(n_ctx), "-ctk", ctk, "-ctv", ctv,
           "--ignore-eos", "-fa", flash_attn, *gpu_layer_args(n_gpu_layers)]
    proc = _run(tool, cmd, env, timeout)
    n_decoded, seconds = _decoded(tool, proc, "0007")
    return CppResult(_text(proc.stdout, prompt), n_decoded, seconds)
