"""llama.cpp's own C++ speculative loop (llama-speculative-simple from the same patched build),
run as a subprocess so its figures can sit next to ggspec's in one benchmark.

Patch 0003 gives it the deferred DFlash injection (LLAMA_ARG_SPEC_DFLASH_DEFER=1); patch 0005
gives it a full-resolution decode timer and, as a benchmark device, forced acceptance
(GGSPEC_BENCH_FORCED: the target's own greedy continuation corrupted where a profile says).
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from ggspec.errors import InputError, LlamaError
from ggspec.native import build as nb

TOOL = "llama-speculative-simple"
_DECODED = re.compile(r"ggspec-bench: decoded (\d+) tokens in (\d+) us")  # patch 0005
_DRAFTED = re.compile(r"n_drafted\s*=\s*(\d+)")
_ACCEPTED = re.compile(r"n_accept\s*=\s*(\d+)")


@dataclass
class CppResult:
    """What one run of the tool printed: its text (prompt included) and counts."""
    text: str = ""
    n_decoded: int = 0
    seconds: float = 0.0
    drafted: int = 0
    accepted: int = 0

    def add(self, other: "CppResult") -> None:
        self.n_decoded += other.n_decoded
        self.seconds += other.seconds
        self.drafted += other.drafted
        self.accepted += other.accepted

    @property
    def tps(self) -> float:
        return self.n_decoded / self.seconds if self.seconds else 0.0


def find_tool() -> Path:
    """The tool of the current patches' `--tools` build; one line of error when there is none."""
    info = nb.find_build(nb.BuildOptions(tools=True))
    tool = Path(info.lib_dir) / TOOL if info else None
    if tool is None or not tool.is_file():
        raise InputError(f"llama.cpp's own loop ({TOOL}) is not built: run `ggspec build --tools`")
    return tool


def run_cpp(tool: Path, target: Path, draft: Path, prompt: str, n: int, n_max: int, *, defer: bool,
            n_ctx: int = 2048, ctk: str = "f16", ctv: str = "f16", flash_attn: str = "off", threads: int = 1,
            forced: Path | None = None, timeout: float = 600) -> CppResult:
    """One greedy DFlash run of llama.cpp's loop. `forced`: a GGSPEC_BENCH_FORCED file."""
    env = {k: v for k, v in os.environ.items() if k not in ("LLAMA_ARG_SPEC_DFLASH_DEFER", "GGSPEC_BENCH_FORCED")}
    if defer:
        env["LLAMA_ARG_SPEC_DFLASH_DEFER"] = "1"
    if forced is not None:
        env["GGSPEC_BENCH_FORCED"] = str(forced)
    cmd = [str(tool), "-m", str(target), "-md", str(draft), "--spec-type", "draft-dflash",
           "--spec-draft-n-max", str(n_max), "-p", prompt, "-n", str(n), "--temp", "0",
           "-t", str(threads), "-td", str(threads), "-c", str(n_ctx), "-ctk", ctk, "-ctv", ctv,
           "--ignore-eos", "-fa", flash_attn]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise LlamaError(f"{tool.name} did not finish within {timeout:.0f} s") from None
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise LlamaError(f"{tool.name} failed (exit {proc.returncode}): {last}")
    m = _DECODED.search(proc.stderr)
    if not m:
        raise LlamaError(f"could not read the decode time from {tool.name}'s output (is patch 0005 applied?)")
    drafted, accepted = _DRAFTED.search(proc.stderr), _ACCEPTED.search(proc.stderr)
    # the tool prints "\n\n" before the prompt and twice after the generated text
    text = proc.stdout[proc.stdout.find(prompt[:32]):]
    text = text[:-4] if text.endswith("\n\n\n\n") else text
    return CppResult(text, int(m.group(1)), int(m.group(2)) / 1e6,
                     int(drafted.group(1)) if drafted else 0, int(accepted.group(1)) if accepted else 0)
