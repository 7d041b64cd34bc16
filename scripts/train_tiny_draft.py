"""Train the classic draft model (draft-simple) for the shipped tiny-coder target.

    pip install -e '.[train]'
    python scripts/train_tiny_draft.py --out models/tiny           # ~15 min on one CPU thread
    python scripts/train_tiny_draft.py --out /tmp/smoke --smoke    # seconds: checks the pipeline

The target is read from its GGUF file (models/tiny/tiny-coder.gguf, not retrained), so the draft
fits the file that ships. Draft: a 2-layer qwen3, hidden 64, with its own embeddings and head and
the target's tokenizer copied verbatim (llama.cpp's vocabulary rules then hold by construction).
It is distilled: the loss is KL(target || draft) over the whole vocabulary at every position of
windows of the training text and of the target's own greedy continuations (the text a draft sees
when it drafts). Corpus and held-out split are train_tiny_pair.py's. Same seed and thread count
-> byte-identical GGUF file (printed with its sha256).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import asdict
from pathlib import Path

import gguf
import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))

from tinypair import corpus, export  # noqa: E402
from tinypair import tokenizer as tk  # noqa: E402
from tinypair.model import Target, TargetConfig  # noqa: E402
from tinypair.train import deterministic, greedy_continuations, log, random_windows  # noqa: E402

from ggspec.distill.export import block_tensors  # noqa: E402
from ggspec.distill.target_file import _field_value  # noqa: E402
from ggspec.distill.train import descend, set_cosine_lr  # noqa: E402
from ggspec.files import file_sha256  # noqa: E402

DRAFT_FILE = "tiny-coder-draft.gguf"
DRAFT = dict(n_embd=64, n_layer=2, n_head=2, n_head_kv=1, head_dim=32, n_ff=192)


def load_target(path: Path) -> tuple[Target, dict]:
    """The shipped target as a torch `Target`, and its tokenizer keys (key -> (value, type, sub))."""
    reader = gguf.GGUFReader(str(path))
    key = lambda name: _field_value(reader.fields[f"qwen3.{name}"])[0]  # noqa: E731
    tensors = {t.name: torch.from_numpy(np.array(t.data, dtype=np.float32)) for t in reader.tensors}
    tokenizer = {n: _field_value(f) for n, f in reader.fields.items() if n.startswith("tokenizer.")}
    cfg = TargetConfig(n_vocab=len(tokenizer["tokenizer.ggml.tokens"][0]), n_embd=key("embedding_length"),
                       n_layer=key("block_count"), n_head=key("attention.head_count"),
                       n_head_kv=key("attention.head_count_kv"), head_dim=key("attention.key_length"),
                       n_ff=key("feed_forward_length"), rope_base=key("rope.freq_base"),
                       eps=key("attention.layer_norm_rms_epsilon"), n_ctx=key("context_length"))
    model = Target(cfg)
    named = [("token_embd.weight", model.embed.weight), ("output_norm.weight", model.norm.weight),
             ("output.weight", model.head.weight)]
    for il, blk in enumerate(model.blocks):
        named += block_tensors(f"blk.{il}.", blk)
    with torch.no_grad():
        for name, p in named:
            p.copy_(tensors[name].reshape(p.shape))
    return model.eval(), tokenizer


def write_draft(path: Path, model: Target, tokenizer: dict, name: str) -> None:
    """The draft as a qwen3 GGUF with the target's tokenizer keys copied as they are."""
    c = model.cfg
    w = export.start(path, "qwen3", name, n_ctx_train=c.n_ctx, n_embd=c.n_embd, n_layer=c.n_layer, n_ff=c.n_ff,
                     n_head=c.n_head, n_head_kv=c.n_head_kv, head_dim=c.head_dim, rms_eps=c.eps,
                     rope_freq_base=c.rope_base)
    export.copy_keys(w, tokenizer)
    tensors = [("token_embd.weight", model.embed.weight)]
    for il, blk in enumerate(model.blocks):
        tensors += block_tensors(f"blk.{il}.", blk)
    tensors += [("output_norm.weight", model.norm.weight), ("output.weight", model.head.weight)]
    export.finish(w, tensors)


def distill(target: Target, draft: Target, streams: list[np.ndarray], steps: int, batch: int, seq: int,
            lr: float, seed: int, log) -> Target:
    """KL(target || draft) on windows drawn evenly from each stream."""
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(draft.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    t0 = time.time()
    per = batch // len(streams)
    for step in range(steps):
        set_cosine_lr(opt, step, steps, lr)
        x = torch.cat([random_windows(s, per, seq, gen)[:, :-1] for s in streams])
        with torch.no_grad():
            p_log = F.log_softmax(target(x)[0], dim=-1)
        q_log = F.log_softmax(draft(x)[0], dim=-1)
        loss = F.kl_div(q_log.flatten(0, 1), p_log.flatten(0, 1), log_target=True, reduction="batchmean")
        descend(opt, loss, draft.parameters())
        if step % 50 == 0 or step == steps - 1:
            with torch.no_grad():
                agree = (q_log.argmax(-1) == p_log.argmax(-1)).float().mean().item()
            log(f"draft step {step:5d}/{steps}  KL {loss.item():.3f}  argmax agreement {agree:.3f}  "
                f"{time.time() - t0:5.0f} s")
    return draft.eval()


@torch.no_grad()
def agreement(target: Target, draft: Target, stream: np.ndarray, seq: int, n: int = 32) -> float:
    """How often the draft's argmax is the target's on held-out windows."""
    x = random_windows(stream, n, seq, torch.Generator().manual_seed(1234))[:, :-1]
    return (draft(x)[0].argmax(-1) == target(x)[0].argmax(-1)).float().mean().item()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", type=Path, default=Path("models/tiny/tiny-coder.gguf"))
    ap.add_argument("--out", type=Path, default=Path("models/tiny"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (the bytes depend on it)")
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--n-seq", type=int, default=512, help="target continuations to train on")
    ap.add_argument("--smoke", action="store_true", help="a few steps of everything (pipeline check)")
    args = ap.parse_args()

    deterministic(args.threads)
    t_start = time.time()
    plan = dict(steps=args.steps, n_seq=args.n_seq, batch=16, seq=256, prompt_len=64, gen_len=192, lr=3e-3)
    if args.smoke:
        plan.update(steps=3, n_seq=4, batch=4, seq=64, gen_len=32)

    target, tokenizer = load_target(args.target)
    train_files, held_files = corpus.split(corpus.stdlib_files())
    train_texts = corpus.read_texts(train_files)
    tok = tk.train_tokenizer(train_texts, target.cfg.n_vocab)
    vocab = tk.vocab_of(tok)
    if vocab.tokens != tokenizer["tokenizer.ggml.tokens"][0]:
        sys.exit("the stdlib here trains another tokenizer than the target's: train with the Python "
                 "that made it (see models/tiny/train.json)")
    train_ids = tk.encode(tok, train_texts, vocab.eos)
    held_ids = tk.encode(tok, corpus.read_texts(held_files), vocab.eos)
    log(f"corpus: {len(train_ids)} train tokens, {len(held_ids)} held out")

    seqs, _ = greedy_continuations(target, train_ids, plan["n_seq"], plan["prompt_len"], plan["gen_len"],
                                   batch=64, seed=args.seed + 1, layers=(0,), log=log)
    cont = seqs.numpy().astype(np.int32).reshape(-1)  # the continuations back to back

    torch.manual_seed(args.seed)
    dcfg = TargetConfig(n_vocab=target.cfg.n_vocab, rope_base=target.cfg.rope_base, eps=target.cfg.eps,
                        n_ctx=target.cfg.n_ctx, **DRAFT)
    draft = Target(dcfg)
    for name, p in draft.named_parameters():
        if p.dim() == 2:
            torch.nn.init.normal_(p, std=0.02 if "embed" in name or "head" in name else 1 / math.sqrt(p.shape[1]))
    draft = distill(target, draft, [train_ids, cont], plan["steps"], plan["batch"], plan["seq"], plan["lr"],
                    args.seed + 2, log)
    held = agreement(target, draft, held_ids, plan["seq"])
    log(f"held-out argmax agreement {held:.3f}")

    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / DRAFT_FILE
    write_draft(path, draft, tokenizer, f"ggspec tiny-coder draft model (seed {args.seed})")
    report = {"seed": args.seed, "threads": args.threads, "torch": torch.__version__, "target": str(args.target),
              "target_sha256": file_sha256(args.target), "plan": plan, "draft": asdict(dcfg),
              "heldout_argmax_agreement": round(held, 4), "minutes": round((time.time() - t_start) / 60, 1),
              "file": {"name": path.name, "sha256": file_sha256(path), "bytes": path.stat().st_size}}
    (args.out / "train-draft.json").write_text(json.dumps(report, indent=2) + "\n")
    log(f"{path}  {path.stat().st_size} bytes  sha256 {file_sha256(path)}  ({report['minutes']} min)")


if __name__ == "__main__":
    main()
