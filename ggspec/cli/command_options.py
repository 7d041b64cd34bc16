"""The flags only one command takes (those `run`, `serve` and `bench` share are the option table,
ggspec.cli.options).

Each is an `Annotated` type carrying its flags and help; the commands' signatures (ggspec.cli.commands)
use them with their defaults, so a command reads as its list of options and what it calls.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from ggspec.cli.run import DEFAULT_PROMPT
from ggspec.cli.verdict import COMPARE_MAX_S

# --- build ----------------------------------------------------------------------------------------
BuildCuda = Annotated[bool, typer.Option("--cuda", help="Build the CUDA backend (GGML_CUDA=ON).")]
BuildVulkan = Annotated[bool, typer.Option("--vulkan", help="Build the Vulkan backend (GGML_VULKAN=ON).")]
BuildTools = Annotated[bool, typer.Option(
    "--tools",
    help="Also build llama-server, llama-cli, llama-completion, llama-speculative-simple and llama-quantize "
         "(ggml-rpc-server is always built), and, with the test extra, the suffix type's oracle (arctic-inference's "
         "SuffixTree, from its PyPI source) and the web UI (--ui), best effort.")]
BuildUi = Annotated[bool, typer.Option(
    "--ui", help="Also build llama.cpp's web UI (the pinned tools/ui, with npm; ~2 min once), which `serve` "
                 "shows at /.")]
BuildCudaArch = Annotated[str, typer.Option(
    "--cuda-arch", help="CUDA architectures (CMAKE_CUDA_ARCHITECTURES), e.g. 90 or \"86;89\"; default: the "
                        "visible GPU. No GPU is needed with an arch list.")]
BuildNative = Annotated[bool, typer.Option(
    "--native/--no-native", help="Compile for this machine's CPU (GGML_NATIVE).")]
BuildCudaFa = Annotated[bool, typer.Option(
    "--cuda-fa/--no-cuda-fa", help="With --cuda: compile the flash-attention kernels (GGML_CUDA_FA; about a "
                                   "third of the compile time).")]
BuildForce = Annotated[bool, typer.Option("--force", help="Rebuild even if a cached build matches.")]
BuildCompileCheck = Annotated[bool, typer.Option(
    "--compile-check",
    help="With --cuda: only compile the CUDA units the patches touch, with the build's flags "
         "(a check for CI; no library is built).")]

# --- run ------------------------------------------------------------------------------------------
RunPrompt = Annotated[Optional[str], typer.Option(
    "-p", "--prompt", help=f"Prompt text \\[default: {DEFAULT_PROMPT}].")]
RunPromptFile = Annotated[Optional[Path], typer.Option(
    "-f", "--file", help="Prompts, one per line (blank lines skipped; \\n in a line is a newline, \\\\ a "
                         "backslash), decoded -np at a time; each output is printed in the file's order.")]
RunIgnoreEos = Annotated[bool, typer.Option("--ignore-eos", help="Keep generating past end-of-generation tokens.")]
RunCheck = Annotated[bool, typer.Option(
    "--check", help="Then decode each prompt plain greedy and say whether the outputs are identical; a "
                    "difference is a benign near-tie (target top-2 margin below 0.2 nat) or a REAL divergence.")]
RunGrammar = Annotated[Optional[str], typer.Option(
    "--grammar", help="A GBNF grammar every output follows (llama.cpp's grammar sampler, judged at every verified "
                      "row: speculative output equals plain output under it).")]
RunGrammarFile = Annotated[Optional[Path], typer.Option("--grammar-file", help="The GBNF grammar, from a file.")]
RunJsonSchema = Annotated[Optional[str], typer.Option(
    "-j", "--json-schema", help="A JSON schema every output follows (llama.cpp's converter makes its grammar).")]
RunJsonSchemaFile = Annotated[Optional[Path], typer.Option(
    "-jf", "--json-schema-file", help="The JSON schema, from a file.")]
RunCompare = Annotated[Optional[bool], typer.Option(
    "--compare/--no-compare", help="Then decode the prompt plainly and end with the speedup against plain "
                                   f"decoding \\[default: when the speculative decode took at most {COMPARE_MAX_S:.0f} s].")]

# --- serve ----------------------------------------------------------------------------------------
ServeHost = Annotated[str, typer.Option("--host", help="Address to listen on (loopback by default; anything else "
                                                      "is reachable from other machines).")]
ServePort = Annotated[int, typer.Option("--port", help="Port to listen on.")]
ServeAlias = Annotated[Optional[str], typer.Option(
    "-a", "--alias", help="The model's name in the API \\[default: the pair's name or the target's file name].")]
ServeMaxQueue = Annotated[int, typer.Option(
    "--max-queue", help="Requests that may wait for a slot; past this the server answers 503.")]
ServeChatTemplate = Annotated[Optional[str], typer.Option(
    "--chat-template", help="One of llama.cpp's built-in chat templates (chatml, gemma, llama3, ...) instead of "
                            "the model's.")]
ServeChatTemplateFile = Annotated[Optional[Path], typer.Option(
    "--chat-template-file", help="A Jinja chat template file instead of the model's.")]
ServeReasoningFormat = Annotated[str, typer.Option(
    "--reasoning-format", help="How a chat answer's thinking is returned: deepseek (in reasoning_content), "
                               "deepseek-legacy, auto or none (left in content); a request's reasoning_format wins.")]
ServeReasoningBudget = Annotated[int, typer.Option(
    "--reasoning-budget", help="Tokens a chat answer's thinking block may hold before its end is forced (-1: no "
                               "limit, 0: end it at once); a request's reasoning_budget_tokens wins.")]
ServeReasoningBudgetMessage = Annotated[str, typer.Option(
    "--reasoning-budget-message", help="Text forced before the end of thinking when the budget runs out.")]
ServeCachePrompt = Annotated[bool, typer.Option(
    "--cache-prompt/--no-cache-prompt", help="Keep each slot's cells for a later prompt that starts the same way "
                                             "(only the rest is decoded; a hybrid target's through checkpoints).")]
ServeCtxCheckpoints = Annotated[int, typer.Option(
    "-ctxcp", "--ctx-checkpoints", help="Checkpoints of a hybrid target's recurrent state kept per slot (taken "
                                        "near and at the end of each prompt), from which a later prompt that "
                                        "leaves the cached cells earlier goes on (0: none).")]
ServePrefillChunk = Annotated[int, typer.Option(
    "--prefill-chunk", help="While other requests generate, prompt rows one step decodes: a long prompt goes on "
                            "over the next steps, so no stream waits for all of it (0: every prompt whole).")]
ServeCacheRam = Annotated[int, typer.Option(
    "-cram", "--cache-ram", help="MiB of host memory for copies of slots' cells a new prompt overwrites, given back "
                                 "to a later prompt that starts the same way (-1: no limit, 0: off).")]
ServeDrainTimeout = Annotated[float, typer.Option(
    "--drain-timeout", help="On SIGINT/SIGTERM, seconds the requests in progress may take to finish.")]
ServeUi = Annotated[bool, typer.Option(
    "--ui/--no-ui", help="Serve llama.cpp's web UI at / (built once with npm on the first serve: `ggspec build "
                         "--ui`).")]
ServeApiKey = Annotated[Optional[list[str]], typer.Option(
    "--api-key", envvar="LLAMA_API_KEY", show_envvar=True,
    help="A key every request but /health must bring (Authorization: Bearer KEY, or X-Api-Key: KEY); several: "
         "a comma-separated list, or the flag again.")]
ServeApiKeyFile = Annotated[Optional[Path], typer.Option(
    "--api-key-file", envvar="LLAMA_ARG_API_KEY_FILE", show_envvar=True,
    help="A file of keys, one per line (lines starting with # are comments).")]
ServeSslKeyFile = Annotated[Optional[Path], typer.Option(
    "--ssl-key-file", envvar="LLAMA_ARG_SSL_KEY_FILE", show_envvar=True,
    help="A PEM private key: serve HTTPS (with --ssl-cert-file).")]
ServeSslCertFile = Annotated[Optional[Path], typer.Option(
    "--ssl-cert-file", envvar="LLAMA_ARG_SSL_CERT_FILE", show_envvar=True,
    help="A PEM certificate (chain) for --ssl-key-file.")]

# --- rpc-server -----------------------------------------------------------------------------------
RpcHost = Annotated[str, typer.Option("-H", "--host", help="Address to bind (default: loopback only).")]
RpcPort = Annotated[int, typer.Option("-p", "--port", help="Port to listen on.")]
RpcThreads = Annotated[int, typer.Option("-t", "--threads", help="CPU threads of the worker.")]
RpcCache = Annotated[bool, typer.Option("--cache/--no-cache", help="Let the worker cache tensors on disk.")]

# --- bench ----------------------------------------------------------------------------------------
BenchPrompts = Annotated[Optional[Path], typer.Option(
    "--prompts", help="JSONL file of {\"prompt\": ..., \"category\": ...}, or a shipped set by name: stdlib "
                      "(CPython's standard library: edit, refactor, quote, json, code-gen, prose) \\[default: the "
                      "built-in set: code-gen, code-edit, code-echo, prose].")]
BenchReps = Annotated[int, typer.Option("-r", "--repetitions", help="Repetitions of every configuration.")]
BenchWarmup = Annotated[bool, typer.Option("--warmup/--no-warmup", help="An untimed run before each configuration.")]
BenchMatrix = Annotated[bool, typer.Option("--matrix", help="Run every combination of the comma-list axes.")]
BenchNative = Annotated[bool, typer.Option(
    "--native", help="Add rows from llama.cpp's own C++ loop and plain greedy decoding of the same build "
                     "(needs `ggspec build --tools`; parallel 1 only); without a draft, only the plain rows.")]
BenchProfile = Annotated[Optional[str], typer.Option(
    "--acceptance-profile",
    help="BENCHMARK DEVICE: replay a histogram of accepted counts (dflash, mtp, uniform or a file of "
         "weights) instead of the draft's own proposals; every row says so.")]
BenchOutput = Annotated[str, typer.Option("-o", "--output", help="Output format: md, csv, json or jsonl.")]
BenchSave = Annotated[Optional[Path], typer.Option(
    "--save", help="Also save the JSON document here (after every configuration), plots next to it.")]
BenchResume = Annotated[Optional[Path], typer.Option(
    "--resume", help="Continue the benchmark saved in this file (its own settings), and save there.")]
BenchPlot = Annotated[bool, typer.Option("--plot/--no-plot", help="Write PNG plots next to the saved JSON.")]

# --- models make ----------------------------------------------------------------------------------
MakeName = Annotated[str, typer.Argument(help="A dummy pair of models.toml, e.g. dummy-qwen3-0.6b (NAME@f16, "
                                              "NAME@q8_0 for another file type).")]
MakeThreads = Annotated[int, typer.Option("-t", "--threads", min=1, help="llama-quantize's threads.")]

# --- models pull ----------------------------------------------------------------------------------
PullName = Annotated[str, typer.Argument(help="A registry or Hub pair of models.toml, e.g. gemma-3-270m.")]

# --- distill --------------------------------------------------------------------------------------
DistillOutput = Annotated[Optional[Path], typer.Option("-o", "--output", help="The draft GGUF to write.")]
DistillData = Annotated[Optional[Path], typer.Option(
    "--data", help="Prompts as JSONL ({\"text\": ...} or {\"prompt\": ...} per line) \\[default: built-in "
                   "prose and code from the Python standard library].")]
DistillWork = Annotated[Optional[Path], typer.Option(
    "--work", help="Folder for the captured data \\[default: OUTPUT.work].")]
DistillResume = Annotated[bool, typer.Option(
    "--resume", help="Continue the capture in --work (after Ctrl-C), or reuse its finished data; without it "
                     "the folder's data is replaced.")]
DistillSequences = Annotated[int, typer.Option("--sequences", help="Target continuations to capture.")]
DistillPromptLen = Annotated[int, typer.Option("--prompt-len", help="Tokens of each prompt (at most).")]
DistillGenLen = Annotated[int, typer.Option("--gen-len", help="Tokens the target generates after each prompt.")]
DistillParallel = Annotated[int, typer.Option("-np", "--parallel", help="Sequences per llama.cpp batch.")]
DistillLayers = Annotated[Optional[str], typer.Option(
    "--layers", help="Target layer inputs the draft reads, e.g. 2,5,9 \\[default: five, spread like the z-lab "
                     "drafts].")]
DistillDraftVocab = Annotated[Optional[int], typer.Option(
    "--draft-vocab", help="Draft vocabulary: the N most frequent target tokens of the data, with its own head; "
                          "0: the target's whole vocabulary and head \\[default: for a target vocabulary over "
                          "32768, every token the data's labels use, rounded up to 1024; else 0].")]
DistillBlock = Annotated[int, typer.Option("--block", help="Draft block size (n_max is at most block - 1).")]
DistillDraftLayers = Annotated[int, typer.Option("--draft-layers", help="Layers of the draft.")]
DistillSteps = Annotated[int, typer.Option("--steps", help="Training steps.")]
DistillBatch = Annotated[int, typer.Option("--batch", help="Sequences per training step.")]
DistillAnchors = Annotated[int, typer.Option("--anchors", help="Blocks per sequence per training step.")]
DistillLr = Annotated[float, typer.Option("--lr", help="Peak learning rate (AdamW, cosine schedule).")]
DistillMinutes = Annotated[float, typer.Option(
    "--minutes", help="Training time budget: the schedule is fitted to it (then runs differ slightly); "
                      "0: --steps only, deterministic.")]
DistillSeed = Annotated[int, typer.Option("-s", "--seed", help="Prompt choice, initialisation and batches.")]
DistillThreads = Annotated[int, typer.Option("-t", "--threads", help="CPU threads for llama.cpp and PyTorch.")]
DistillOuttype = Annotated[str, typer.Option("--outtype", help="Draft weight matrices: f16, q8_0 or f32.")]
DistillNoCheck = Annotated[bool, typer.Option("--no-check", help="Skip the llama.cpp parity check.")]
