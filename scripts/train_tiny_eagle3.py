"""Train the EAGLE3 head (draft-eagle3) for the shipped tiny-coder target.

    pip install -e '.[train]'
    python scripts/train_tiny_eagle3.py --out models/tiny          # ~12 min on one CPU thread
    python scripts/train_tiny_eagle3.py --out /tmp/smoke --smoke   # seconds: checks the pipeline

The target is read from models/tiny/tiny-coder.gguf (not retrained). The head is what the pinned
llama.cpp's `src/models/eagle3.cpp` computes: an encoder `fc` over three target features
concatenated — the inputs of the target's layers 1, 2 and 3 — and one
decoder layer over [RMSNorm(token embedding), RMSNorm(g)] (the target's embeddings, borrowed),
NORM-style RoPE, the raw g as the attention residual, its own head over the 512 tokens the
target predicts most often, and `d2t` mapping those rows to target ids. Training is EAGLE3's
"training-time test" unrolled for 3 steps: step 1 reads g from the target's features at each
position, step s > 1 its own pre-norm state of step s - 1 (as drafting does), attending to the
step-1 pairs up to the chain's start and to its own chain. Labels are the target's greedy tokens
on its own continuations. Same seed and thread count -> byte-identical GGUF file.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))

from tinypair import corpus, export  # noqa: E402
from tinypair import tokenizer as tk  # noqa: E402
from tinypair.train import deterministic, log, random_windows  # noqa: E402
from train_tiny_draft import load_target  # noqa: E402

from ggspec.catalogue.gguf_write import add_i32_arr, add_u32  # noqa: E402
from ggspec.distill.model import RMSNorm, SwiGLU  # noqa: E402
from ggspec.distill.train import descend, set_cosine_lr  # noqa: E402
from ggspec.files import file_sha256  # noqa: E402

OUT_FILE = "tiny-coder-eagle3.gguf"
# llama.cpp ids: the inputs of layers 1, 2 and 3 (an id of n_layer would mean the final normed state,
# which a qwen3 graph does not export: llama.cpp would read an unwritten buffer; see eagle3.py)
TARGET_LAYERS = (1, 2, 3)
N_VOCAB_DRAFT = 512
HEADS, HEADS_KV, HEAD_DIM, N_FF = 4, 2, 32, 384
STEPS_TTT = 3
STEP_WEIGHTS = (1.0, 0.8, 0.64)


def rope_norm(x: torch.Tensor, pos: torch.Tensor, base: float) -> torch.Tensor:
    """llama.cpp's NORM RoPE (LLAMA_ROPE_TYPE_NORM): adjacent pairs (x[2i], x[2i+1]) rotate;
    x [..., T, H, hd], pos [T]."""
    hd = x.shape[-1]
    inv = base ** (-torch.arange(0, hd, 2, dtype=torch.float32) / hd)
    theta = pos.to(torch.float32)[:, None] * inv  # [T, hd/2]
    cos, sin = theta.cos()[:, None, :], theta.sin()[:, None, :]
    x0, x1 = x[..., 0::2], x[..., 1::2]
    return torch.stack([x0 * cos - x1 * sin, x0 * sin + x1 * cos], dim=-1).flatten(-2)


class Eagle3(nn.Module):
    def __init__(self, n_embd: int, n_embd_tgt: int, eps: float, rope_base: float) -> None:
        super().__init__()
        self.rope_base = rope_base
        self.fc = nn.Linear(len(TARGET_LAYERS) * n_embd_tgt, n_embd, bias=False)
        self.attn_norm = RMSNorm(n_embd, eps)
        self.hidden_norm = RMSNorm(n_embd, eps)
        self.q = nn.Linear(2 * n_embd, HEADS * HEAD_DIM, bias=False)
        self.k = nn.Linear(2 * n_embd, HEADS_KV * HEAD_DIM, bias=False)
        self.v = nn.Linear(2 * n_embd, HEADS_KV * HEAD_DIM, bias=False)
        self.o = nn.Linear(HEADS * HEAD_DIM, n_embd, bias=False)
        self.ffn_norm = RMSNorm(n_embd, eps)
        self.ffn = SwiGLU(n_embd, N_FF)
        self.norm = RMSNorm(n_embd, eps)
        self.head = nn.Linear(n_embd, N_VOCAB_DRAFT, bias=False)

    def qkv(self, emb: torch.Tensor, g: torch.Tensor, pos: torch.Tensor):
        x = torch.cat([self.attn_norm(emb), self.hidden_norm(g)], dim=-1)
        q = self.q(x).unflatten(-1, (HEADS, HEAD_DIM))
        k = self.k(x).unflatten(-1, (HEADS_KV, HEAD_DIM))
        v = self.v(x).unflatten(-1, (HEADS_KV, HEAD_DIM))
        return rope_norm(q, pos, self.rope_base), rope_norm(k, pos, self.rope_base), v

    def finish(self, attn: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        """The pre-norm state after attention output [B,T,H,hd] (residual: the raw g)."""
        h = self.o(attn.flatten(-2)) + g
        return h + self.ffn(self.ffn_norm(h))

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(h))

    def unrolled(self, emb_next: torch.Tensor, feats: torch.Tensor, steps: int) -> list[torch.Tensor]:
        """Logits of each training-time-test step. emb_next[:, k] = embedding of token k+1 (the
        pair at position k), feats[:, k] = target features at k. Chain k's step s sits at position
        k + s - 1 with token k + s; it attends the step-1 keys at positions <= k and the keys of
        steps 2..s of chain k."""
        B, L, _ = emb_next.shape
        rep = HEADS // HEADS_KV
        pos = torch.arange(L)
        g = self.fc(feats)
        q, k1, v1 = self.qkv(emb_next, g, pos)
        k1r, v1r = k1.repeat_interleave(rep, 2), v1.repeat_interleave(rep, 2)
        scale = 1.0 / math.sqrt(HEAD_DIM)
        causal = torch.ones(L, L, dtype=torch.bool).tril()
        s1 = torch.einsum("bqhd,bkhd->bhqk", q, k1r) * scale
        h = self.finish(torch.einsum("bhqk,bkhd->bqhd", s1.masked_fill(~causal, -1e30).softmax(-1), v1r), g)
        out = [self.logits(h)]
        own_k, own_v = [], []
        for s in range(2, steps + 1):
            # chain k: token k + s (shifted in: the last chains have none and are masked by the labels)
            emb = torch.cat([emb_next[:, s - 1:], emb_next[:, -1:].expand(B, s - 1, -1)], dim=1)
            qs, ks, vs = self.qkv(emb, h, pos + s - 1)
            own_k.append(ks.repeat_interleave(rep, 2))
            own_v.append(vs.repeat_interleave(rep, 2))
            sc = torch.einsum("bqhd,bkhd->bhqk", qs, k1r) * scale
            sc = sc.masked_fill(~causal, -1e30)
            diag = torch.stack([(qs * kk).sum(-1).transpose(1, 2) * scale for kk in own_k], dim=-1)  # [B,H,L,s-1]
            w = torch.cat([sc, diag], dim=-1).softmax(-1)
            attn = torch.einsum("bhqk,bkhd->bqhd", w[..., :L], v1r)
            attn = attn + sum(w[..., L + t].transpose(1, 2)[..., None] * own_v[t] for t in range(len(own_v)))
            h = self.finish(attn, h)
            out.append(self.logits(h))
        return out


@torch.no_grad()
def target_features(target, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's features at TARGET_LAYERS ([B, L, 3E]) and its greedy token at each position."""
    cfg = target.cfg
    x = target.embed(ids)
    pos = torch.arange(ids.shape[1])
    feats = {}
    for il, blk in enumerate(target.blocks):
        feats[il] = x
        h = blk.attn_norm(x)
        q = blk.attn.project_q(h, pos, cfg.rope_base)
        k, v = blk.attn.project_kv(h, pos, cfg.rope_base)
        x = x + blk.attn.attend(q, k, v, causal=True)
        x = x + blk.ffn(blk.ffn_norm(x))
    feats[cfg.n_layer] = target.norm(x)
    greedy = target.head(feats[cfg.n_layer]).argmax(-1)
    return torch.cat([feats[il] for il in TARGET_LAYERS], dim=-1), greedy


@torch.no_grad()
def continuations(target, stream: np.ndarray, n_seq: int, prompt_len: int, gen_len: int, seed: int, log):
    """Prompts from the training text, then the target's greedy continuation (incremental)."""
    gen = torch.Generator().manual_seed(seed)
    prompts = random_windows(stream, n_seq, prompt_len - 1, gen)
    out = []
    for b in range(0, n_seq, 64):
        ids, cache = prompts[b:b + 64], []
        logits, _ = target(ids, 0, cache)
        seq, pos = [ids], ids.shape[1]
        nxt = logits[:, -1].argmax(-1, keepdim=True)
        for _ in range(gen_len):
            seq.append(nxt)
            logits, _ = target(nxt, pos, cache)
            nxt = logits[:, -1].argmax(-1, keepdim=True)
            pos += 1
        out.append(torch.cat(seq, dim=1))
        log(f"continuations {min(b + 64, n_seq)}/{n_seq}")
    return torch.cat(out)


def train(target, seqs: torch.Tensor, steps: int, batch: int, lr: float, seed: int, log):
    feats, greedy = [], []
    for b in range(0, len(seqs), 64):
        f, g = target_features(target, seqs[b:b + 64])
        feats.append(f)
        greedy.append(g)
    feats, greedy = torch.cat(feats), torch.cat(greedy)
    counts = torch.bincount(greedy.flatten(), minlength=target.cfg.n_vocab)
    d2t = counts.argsort(descending=True, stable=True)[:N_VOCAB_DRAFT].sort().values  # draft row -> target id
    t2d = torch.full((target.cfg.n_vocab,), -100, dtype=torch.long)
    t2d[d2t] = torch.arange(N_VOCAB_DRAFT)
    log(f"draft vocabulary: {N_VOCAB_DRAFT} tokens cover {counts[d2t].sum() / counts.sum():.3f} of the target's greedy tokens")
    torch.manual_seed(seed)
    model = Eagle3(target.cfg.n_embd, target.cfg.n_embd, target.cfg.eps, target.cfg.rope_base)
    for p in model.parameters():
        if p.dim() == 2:
            nn.init.normal_(p, std=1 / math.sqrt(p.shape[1]))
    embed = target.embed.weight.detach()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    gen = torch.Generator().manual_seed(seed)
    L = seqs.shape[1]
    t0 = time.time()
    for step in range(steps):
        set_cosine_lr(opt, step, steps, lr)
        idx = torch.randint(0, len(seqs), (batch,), generator=gen)
        x, f, y = seqs[idx], feats[idx], greedy[idx]
        emb_next = F.embedding(torch.cat([x[:, 1:], x[:, -1:]], dim=1), embed)  # token k + 1 at position k
        outs = model.unrolled(emb_next, f, STEPS_TTT)
        loss, accs = 0.0, []
        for s, logits in enumerate(outs, start=1):
            # chain k, step s predicts the token after position k + s: the target's greedy at k + s
            lab = torch.full((batch, L), -100, dtype=torch.long)
            lab[:, :L - s] = t2d[y[:, s:]]
            lab[:, :8] = -100  # too little context
            lab[:, L - s - 1:] = -100  # the chain's own tokens run out
            loss = loss + STEP_WEIGHTS[s - 1] * F.cross_entropy(logits.flatten(0, 1), lab.flatten(), ignore_index=-100)
            ok = lab != -100
            accs.append(((logits.argmax(-1) == lab) & ok).sum().item() / max(1, ok.sum().item()))
        descend(opt, loss, model.parameters())
        if step % 50 == 0 or step == steps - 1:
            log(f"eagle3 step {step:5d}/{steps}  loss {loss.item():.3f}  acc/step "
                + " ".join(f"{a:.2f}" for a in accs) + f"  {time.time() - t0:5.0f} s")
    return model.eval(), d2t


def write(path: Path, model: Eagle3, d2t: torch.Tensor, target, tokenizer: dict, name: str) -> None:
    c = target.cfg
    w = export.start(path, "eagle3", name, n_ctx_train=c.n_ctx, n_embd=c.n_embd, n_layer=1, n_ff=N_FF, n_head=HEADS,
                     n_head_kv=HEADS_KV, head_dim=HEAD_DIM, rms_eps=c.eps, rope_freq_base=c.rope_base)
    add_i32_arr(w, "eagle3.target_layers", TARGET_LAYERS)
    add_u32(w, "eagle3.target_hidden_size", c.n_embd)
    export.copy_keys(w, tokenizer)
    tensors = [("fc.weight", model.fc.weight), ("blk.0.attn_norm.weight", model.attn_norm.weight),
               ("blk.0.attn_norm_2.weight", model.hidden_norm.weight), ("blk.0.attn_q.weight", model.q.weight),
               ("blk.0.attn_k.weight", model.k.weight), ("blk.0.attn_v.weight", model.v.weight),
               ("blk.0.attn_output.weight", model.o.weight), ("blk.0.ffn_norm.weight", model.ffn_norm.weight),
               ("blk.0.ffn_gate.weight", model.ffn.gate.weight), ("blk.0.ffn_up.weight", model.ffn.up.weight),
               ("blk.0.ffn_down.weight", model.ffn.down.weight), ("output_norm.weight", model.norm.weight),
               ("output.weight", model.head.weight),
               ("d2t", d2t.numpy().astype(np.int64))]  # absolute target ids (what the converter writes)
    export.finish(w, tensors)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", type=Path, default=Path("models/tiny/tiny-coder.gguf"))
    ap.add_argument("--out", type=Path, default=Path("models/tiny"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--n-seq", type=int, default=512)
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args()
    deterministic(args.threads)
    t_start = time.time()
    plan = dict(steps=args.steps, n_seq=args.n_seq, batch=16, prompt_len=64, gen_len=192, lr=3e-3)
    if args.smoke:
        plan.update(steps=3, n_seq=4, batch=4, gen_len=32)
    target, tokenizer = load_target(args.target)
    train_files, _ = corpus.split(corpus.stdlib_files())
    texts = corpus.read_texts(train_files)
    tok = tk.train_tokenizer(texts, target.cfg.n_vocab)
    if tk.vocab_of(tok).tokens != tokenizer["tokenizer.ggml.tokens"][0]:
        sys.exit("the stdlib here trains another tokenizer than the target's: train with the Python that made it")
    stream = tk.encode(tok, texts, tk.vocab_of(tok).eos)
    seqs = continuations(target, stream, plan["n_seq"], plan["prompt_len"], plan["gen_len"], args.seed + 1, log)
    model, d2t = train(target, seqs, plan["steps"], plan["batch"], plan["lr"], args.seed + 2, log)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / OUT_FILE
    write(path, model, d2t, target, tokenizer, f"ggspec tiny-coder EAGLE3 head (seed {args.seed})")
    report = {"seed": args.seed, "threads": args.threads, "torch": torch.__version__, "target": str(args.target),
              "target_sha256": file_sha256(args.target), "plan": plan, "target_layers": list(TARGET_LAYERS),
              "n_vocab_draft": N_VOCAB_DRAFT, "ttt_steps": STEPS_TTT,
              "minutes": round((time.time() - t_start) / 60, 1),
              "file": {"name": path.name, "sha256": file_sha256(path), "bytes": path.stat().st_size}}
    (args.out / "train-eagle3.json").write_text(json.dumps(report, indent=2) + "\n")
    log(f"{path}  {path.stat().st_size} bytes  sha256 {file_sha256(path)}  ({report['minutes']} min)")


if __name__ == "__main__":
    main()
