"""`distill`: capture, train, export and check, with the time and peak memory of each stage."""

from __future__ import annotations

import json
import resource
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from ggspec.distill.capture import CapturePlan, Dataset
from ggspec.distill.train import TrainPlan
from ggspec.errors import InputError, LlamaError

Log = Callable[[str], None]
DEFAULT_FEATURE_LAYERS = 5  # the z-lab drafts of 8B-class targets read five target layers
AUTO_DRAFT_VOCAB = 32768  # targets with more tokens than this get a reduced draft vocabulary ...
AUTO_VOCAB_STEP = 1024  # ... of every token the data's labels use, rounded up to a multiple of this


@dataclass(frozen=True)
class DistillOptions:
    target: Path
    output: Path
    work: Path
    capture: CapturePlan = field(default_factory=CapturePlan)
    train: TrainPlan = field(default_factory=TrainPlan)
    data: Path | None = None  # JSONL prompts; None: the built-in corpus
    resume: bool = False
    layers: tuple[int, ...] = ()  # target layer-input ids; () = spread like the z-lab drafts
    draft_vocab: int | None = None  # 0 = the target's whole vocabulary (borrows its head); None = auto
    block: int = 16
    draft_layers: int = 2
    n_ff: int = 0  # 0 = 2.4 x the hidden size
    outtype: str = "f16"
    check: bool = True


@dataclass
class StageReport:
    seconds: float
    peak_rss_mb: float  # the process's peak so far, after the stage


@dataclass
class DistillReport:
    output: str
    layers: list[int]
    draft_vocab: int
    stages: dict[str, StageReport] = field(default_factory=dict)
    capture: dict = field(default_factory=dict)
    train: dict = field(default_factory=dict)
    parity: str = ""


def default_layers(n_layer: int, count: int = DEFAULT_FEATURE_LAYERS) -> tuple[int, ...]:
    """z-lab's spread (hidden-state outputs 1 .. n-3, evenly), as llama.cpp layer-input ids (+1);
    a target too shallow for it gets every layer input from 1 on, evenly thinned."""
    if count == 1:
        return (n_layer // 2 + 1,)
    start, end = 1, n_layer - 3
    ids = sorted({round(start + i * (end - start) / (count - 1)) + 1 for i in range(count)})
    if len(ids) < min(count, n_layer - 1):
        pool = list(range(1, n_layer))
        ids = sorted({pool[round(i * (len(pool) - 1) / max(1, min(count, len(pool)) - 1))]
                      for i in range(min(count, len(pool)))})
    return tuple(ids)


def draft_vocab_size(requested: int | None, n_vocab: int, n_distinct: int) -> int:
    """The draft vocabulary: as requested; by default, for a target vocabulary above AUTO_DRAFT_VOCAB
    (a 262k-row head and softmax are too slow to train on a CPU), every distinct label token of the
    data rounded up to AUTO_VOCAB_STEP, at most AUTO_DRAFT_VOCAB; else the whole vocabulary (0)."""
    if requested is not None:
        return requested
    if n_vocab <= AUTO_DRAFT_VOCAB:
        return 0
    return min(AUTO_DRAFT_VOCAB, -(-max(n_distinct, 1) // AUTO_VOCAB_STEP) * AUTO_VOCAB_STEP)


def validate(opts: DistillOptions, meta) -> tuple[int, ...]:
    """Refuse what cannot work before any decode; returns the layers to read."""
    from ggspec.speculative.types.archs import LAYER_INPUT_ARCHS

    if meta.arch not in LAYER_INPUT_ARCHS:
        raise InputError(f"the target's architecture '{meta.arch}' has no layer-input extraction in this llama.cpp "
                         "build, so no DFlash draft can read it", field="target")
    n_main = meta.n_layer_main
    layers = opts.layers or default_layers(n_main)
    bad = [il for il in layers if not 0 <= il < n_main]
    if bad:
        raise InputError(f"layer(s) {bad} out of range: the target's layer inputs are 0..{n_main - 1}", field="layers")
    if len(set(layers)) != len(layers):
        raise InputError(f"layers {list(layers)} repeat a layer", field="layers")
    if opts.draft_vocab is not None and opts.draft_vocab > meta.n_vocab:
        raise InputError(f"a draft vocabulary of {opts.draft_vocab} tokens is larger than the target's "
                         f"({meta.n_vocab})", field="draft_vocab")
    if opts.draft_vocab is not None and opts.draft_vocab < 0:
        raise InputError("the draft vocabulary must be >= 0 (0: the target's whole vocabulary)", field="draft_vocab")
    if not 2 <= opts.block <= 64:
        raise InputError(f"block size {opts.block} is out of range (2..64)", field="block")
    n_ctx = meta.arch_key("context_length")
    if isinstance(n_ctx, int) and n_ctx > 0 and opts.capture.seq_len > n_ctx:
        raise InputError(f"prompts of {opts.capture.prompt_len} + continuations of {opts.capture.gen_len} tokens "
                         f"exceed the target's context of {n_ctx}", field="prompt_len")
    if opts.capture.gen_len < opts.block:
        raise InputError(f"continuations of {opts.capture.gen_len} tokens hold no block of {opts.block}", field="gen_len")
    if opts.draft_layers < 1:
        raise InputError("the draft needs at least one layer", field="draft_layers")
    return tuple(layers)


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def distill(opts: DistillOptions, log: Log, on_group=None, on_step=None) -> DistillReport:
    from ggspec.runtime.gguf_meta import read_meta

    meta = read_meta(opts.target, "target")
    layers = validate(opts, meta)
    report = DistillReport(output=str(opts.output), layers=list(layers), draft_vocab=opts.draft_vocab or 0)

    # 1. data
    t0 = time.time()
    from ggspec.distill import capture, corpus

    texts = corpus.read_jsonl(opts.data) if opts.data else corpus.split(corpus.builtin_texts())[0]
    cmeta = capture.capture(opts.work, opts.target, opts.capture, layers, texts, opts.resume, on_group)
    ds = Dataset.open(opts.work)
    n_tokens = int(sum(int(ln) - int(p) for ln, p in zip(ds.lengths, ds.prompt_lens)))
    report.capture = {"sequences": ds.n_done, "generated_tokens": n_tokens, "decode_seconds": round(cmeta["seconds"], 1),
                      "bytes": int(ds.features.nbytes + ds.scales.nbytes + ds.tokens.nbytes)}
    report.stages["capture"] = StageReport(time.time() - t0, _rss_mb())
    log(f"data: {ds.n_done} sequences, {n_tokens} generated tokens, features {ds.features.nbytes / 1e6:.0f} MB "
        f"({report.stages['capture'].seconds:.0f} s)")

    # 2. train
    t0 = time.time()
    import numpy as np

    from ggspec.distill import train as trainer
    from ggspec.distill import vocab as dv
    from ggspec.distill.model import DraftConfig
    from ggspec.distill.target_file import read_target

    target = read_target(opts.target)
    gen_tokens = np.concatenate([np.asarray(ds.tokens[i, ds.prompt_lens[i]:ds.lengths[i]]) for i in range(ds.n_done)])
    opts = replace(opts, draft_vocab=draft_vocab_size(opts.draft_vocab, target.n_vocab, len(np.unique(gen_tokens))))
    report.draft_vocab = opts.draft_vocab
    if opts.draft_vocab:
        all_tokens = np.concatenate([np.asarray(ds.tokens[i, :ds.lengths[i]]) for i in range(ds.n_done)])
        vocab = dv.choose(gen_tokens, all_tokens, opts.draft_vocab, target.n_vocab)
    else:
        vocab = dv.full(target.n_vocab)
    cfg = DraftConfig(n_embd=target.n_embd, target_layers=layers, n_layer=opts.draft_layers,
                      head_dim=128 if target.n_embd >= 512 else 64 if target.n_embd >= 256 else 32, n_head=4,
                      n_head_kv=2, n_ff=opts.n_ff or int(2.4 * target.n_embd) // 64 * 64,
                      block_size=opts.block, rope_base=target.rope_base, eps=target.eps,
                      embed_scale=target.embed_scale, n_vocab_draft=opts.draft_vocab)
    log(f"draft: {cfg.n_layer} layers, {cfg.n_head} heads x {cfg.head_dim}, ffn {cfg.n_ff}, block {cfg.block_size}, "
        f"layers {list(layers)}, vocabulary {vocab.size} ({vocab.coverage:.1%} of the data's labels)")
    draft, tr = trainer.train(ds, cfg, vocab, target.embed, target.head, target.mask_id,
                              opts.train, log, on_step)
    report.train = {**asdict(tr), "config": asdict(cfg), "plan": asdict(opts.train)}
    report.stages["train"] = StageReport(time.time() - t0, _rss_mb())
    log(f"trained {tr.steps} steps in {tr.seconds:.0f} s: loss {tr.loss:.3f}, held-out acceptance "
        + " ".join(f"{a:.2f}" for a in tr.accept[:7]) + f", τ estimate {tr.tau_at(7):.2f} at n_max 7")

    # 3. export + parity
    t0 = time.time()
    from ggspec.distill import export, parity

    opts.output.parent.mkdir(parents=True, exist_ok=True)
    name = f"ggspec distill of {opts.target.name} (seed {opts.train.seed})"
    staged = opts.output.with_name(opts.output.name + ".partial")  # becomes the output once it passes
    export.write_draft(staged, draft, vocab if opts.draft_vocab else None, target, name, opts.outtype)
    if opts.check:
        res = parity.check(draft, staged, opts.target, ds, target.mask_id, vocab.d2t, target.embed, target.head,
                           opts.outtype)
        report.parity = res.line()
        log(res.line())
        if not res.ok:
            raise LlamaError(f"the exported draft does not match its PyTorch original in llama.cpp ({res.line()}); "
                             f"kept as {staged} for inspection")
    staged.replace(opts.output)
    report.stages["export"] = StageReport(time.time() - t0, _rss_mb())
    Path(str(opts.output) + ".json").write_text(json.dumps(asdict(report), indent=2, default=str) + "\n")
    return report
