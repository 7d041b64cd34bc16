"""`ggspec run`: decode every prompt, print the outputs in order, end with the verdict.

Prompts are decoded -np at a time (continuous batching, speculative.driver: a prompt joins as soon
as a slot and enough cache cells are free); the outputs are printed in the prompts' order, the first
one streamed as it is committed, each followed by its stats line (`printer`). The last line says whether speculation
paid against plain decoding; `--check` compares every output with plain greedy (`verdict`).
"""

from __future__ import annotations

from pathlib import Path

from ggspec.cli.console import err, note, warn
from ggspec.cli.printer import OrderedPrinter
from ggspec.cli.verdict import check_lossless, verdict
from ggspec.errors import InputError

DEFAULT_PROMPT = "def fibonacci(n):"
REAL_DIVERGENCE = 2  # the exit status when --check found a REAL divergence


def prompts_to_run(prompt: str | None, prompt_file: Path | None, *, n_predict: int, check: bool, plain: bool,
                   temp: float | None) -> list[str]:
    """The prompts of -p or -f (one per line, see parse_prompt_lines), after the checks of run's
    flags that need no model; each failure is an InputError naming its flag."""
    from ggspec.files import check_text, read_text
    from ggspec.streams import stdout_closed

    if n_predict < 1:
        raise InputError("-n must be at least 1")
    if prompt is not None and prompt_file is not None:
        raise InputError("-p and -f are exclusive: give one prompt or a file of prompts")
    if prompt_file is not None:
        prompts = parse_prompt_lines(read_text(prompt_file, f"-f {prompt_file}"))
        if not prompts:
            raise InputError(f"-f {prompt_file}: no prompt in the file (only blank lines)")
    else:
        prompts = [check_text(DEFAULT_PROMPT if prompt is None else prompt, "-p")]
    if stdout_closed():
        raise InputError("standard output is closed: nowhere to write the text")
    if check and (plain or (temp or 0) > 0):
        raise InputError("--check compares speculative greedy output with plain greedy: it needs speculation and "
                         "temperature 0")
    return prompts


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


def output_grammar(grammar: str | None, grammar_file: Path | None, json_schema: str | None,
                   json_schema_file: Path | None) -> str | None:
    """The GBNF grammar of --grammar / --grammar-file / -j / -jf (at most one of them), a JSON
    schema through llama.cpp's converter (llama-cli's flags); None: free output."""
    import json

    from ggspec.files import read_text
    from ggspec.runtime.chat import ChatError, json_schema_to_grammar

    given = [(flag, v) for flag, v in (("--grammar", grammar), ("--grammar-file", grammar_file),
                                       ("-j", json_schema), ("-jf", json_schema_file)) if v is not None]
    if len(given) > 1:
        raise InputError(f"{given[0][0]} and {given[1][0]} are exclusive: give one grammar or schema")
    if not given:
        return None
    flag, value = given[0]
    text = read_text(value, f"{flag} {value}") if isinstance(value, Path) else value
    if flag in ("--grammar", "--grammar-file"):
        if not text.strip():
            raise InputError(f"{flag}: the grammar is empty")
        return text
    try:
        schema = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"{flag}: not JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") from None
    try:
        return json_schema_to_grammar(schema)
    except ChatError as exc:
        raise InputError(f"{flag}: {exc}") from None


def bench_args(pair: str | None, model: Path | None, draft: Path | None) -> str:
    """The models as `ggspec bench` takes them, for the verdict's suggestion."""
    return f"--pair {pair}" if pair else " ".join(f"{flag} {path}" for flag, path in (("-m", model), ("-md", draft)) if path)


def decode_prompts(cfg, prompts: list[str], n_predict: int, ignore_eos: bool, prompt_file: Path | None = None,
                   check: bool = False, compare: bool | None = False, bench_args: str = "",
                   grammar: str | None = None) -> int:
    """Decode and print every prompt (see the module) under `grammar` (GBNF, None: free); the exit
    status: 0, or REAL_DIVERGENCE."""
    from contextlib import closing

    from ggspec.speculative.driver import Request, drive, request_seed
    from ggspec.speculative.engine import Engine
    from ggspec.speculative.stats import merge

    with Engine.open(cfg) as sp:
        for w in sp.warnings:
            warn(w)
        for n in sp.notes:
            note(n)
        tokens = [sp.target_model.tokenize(p) for p in prompts]
        for k, t in enumerate(tokens):  # every prompt before the first is decoded
            try:
                sp.check_prompt(t)
            except InputError as exc:
                if prompt_file is None:
                    raise
                raise InputError(f"-f {prompt_file}: prompt {k + 1}: {exc}") from None
        _warn_context(sp.capacity, max(len(t) for t in tokens), n_predict, len(prompts))
        printer = OrderedPrinter(prompts, sp)
        requests = [Request(t, n_predict, tag=i, seed=request_seed(cfg.sampling.seed, i), ignore_eos=ignore_eos,
                            grammar=grammar) for i, t in enumerate(tokens)]
        by_prompt = {}
        with closing(drive(sp, requests)) as events:
            for ev in events:
                by_prompt.setdefault(ev.tag, ev.seq)
                printer.add(ev.tag, ev.tokens)
                if ev.finished:
                    printer.finish(ev.tag, ev.seq.stats)
        seqs = [by_prompt[i] for i in sorted(by_prompt)]
        if len(prompts) > 1:
            s, total = sp.stats, merge(seq.stats for seq in seqs)
            line = (f"[bold]{len(seqs)} sequences[/] (-np {cfg.parallel})  {s.tokens} tokens  aggregate decode "
                    f"{s.tokens / s.t_steps if s.t_steps else 0.0:.1f} t/s  "
                    f"{s.calls_per_step:.2f} llama.cpp calls per step ({s.steps} steps)")
            if sp.speculative:
                line += f"  τ {total.tau:.2f} (pooled)  accept {100 * total.acceptance_rate:.1f}%"
            err.print(line, soft_wrap=True)
        if cfg.placement.multi_device:
            _device_line(sp, cfg.placement)
        last = verdict(sp, tokens, seqs, n_predict, ignore_eos, compare, bench_args, check, grammar) \
            if sp.speculative and compare is not False else None
        real = check and check_lossless(sp, tokens, {seq.tag: seq.tokens for seq in seqs}, n_predict, ignore_eos,
                                        grammar)
        if last:
            err.print(last, soft_wrap=True)
        return REAL_DIVERGENCE if real else 0


def _warn_context(room: int, longest: int, n_predict: int, n_prompts: int) -> None:
    """Generation stops when the context is full: say so before, when -n cannot fit."""
    if longest + n_predict > room:
        which = "the prompt" if n_prompts == 1 else "the longest prompt"
        warn(f"-n {n_predict}: {which} ({longest} tokens) leaves room for about "
             f"{max(room - longest, 0)} generated tokens in the {room}-token context; raise -c to get them all")


def _device_line(sp, placement) -> None:
    """Several devices: the memory each one holds (and how the output head is placed)."""
    from ggspec.runtime.devices import memory_report

    mirror = "mirrored" if sp.target_model.mirrored_output else "split by vocabulary rows"
    head = f", output head {mirror}" if placement.split_mode == "tensor" else ""
    err.print(f"devices (-sm {placement.split_mode}{head}): " + "; ".join(memory_report(placement)), soft_wrap=True)
