"""Training: the target on stdlib text, then the DFlash drafter on the target's own outputs."""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F

from ggspec.distill.train import descend, set_cosine_lr
from tinypair.model import DFlashDraft, DraftConfig, Target, TargetConfig

Log = Callable[[str], None]


def log(msg: str) -> None:
    print(msg, flush=True)


def deterministic(threads: int) -> None:
    """Same seed and thread count -> the same weights, and so byte-identical files."""
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True)


def random_windows(stream: np.ndarray, n: int, length: int, gen: torch.Generator) -> torch.Tensor:
    starts = torch.randint(0, len(stream) - length - 1, (n,), generator=gen)
    return torch.stack([torch.from_numpy(stream[s:s + length + 1].astype(np.int64)) for s in starts.tolist()])


# --- target ---------------------------------------------------------------------------------------


def train_target(cfg: TargetConfig, stream: np.ndarray, steps: int, batch: int, seq: int,
                 lr: float, seed: int, log: Log) -> Target:
    torch.manual_seed(seed)
    model = Target(cfg)
    for name, p in model.named_parameters():
        if p.dim() == 2:
            torch.nn.init.normal_(p, std=0.02 if "embed" in name or "head" in name else 1 / math.sqrt(p.shape[1]))
    decay = [p for n, p in model.named_parameters() if p.dim() == 2 and "embed" not in n]
    rest = [p for n, p in model.named_parameters() if p.dim() < 2 or "embed" in n]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                            lr=lr, betas=(0.9, 0.95))
    gen = torch.Generator().manual_seed(seed)
    t0 = time.time()
    for step in range(steps):
        set_cosine_lr(opt, step, steps, lr)
        xy = random_windows(stream, batch, seq, gen)
        logits, _ = model(xy[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1), xy[:, 1:].flatten())
        descend(opt, loss, model.parameters())
        if step % 50 == 0 or step == steps - 1:
            log(f"target step {step:5d}/{steps}  loss {loss.item():.3f}  {time.time() - t0:6.0f} s")
    return model.eval()


@torch.no_grad()
def evaluate(model: Target, stream: np.ndarray, seq: int, n: int = 16) -> float:
    gen = torch.Generator().manual_seed(1234)
    xy = random_windows(stream, n, seq, gen)
    logits, _ = model(xy[:, :-1])
    return F.cross_entropy(logits.flatten(0, 1), xy[:, 1:].flatten()).item()


# --- drafter data: the target's own greedy continuations and its layer inputs ---------------------


@torch.no_grad()
def greedy_continuations(model: Target, stream: np.ndarray, n_seq: int, prompt_len: int,
                         gen_len: int, batch: int, seed: int, layers: tuple[int, ...],
                         log: Log) -> tuple[torch.Tensor, torch.Tensor]:
    """Token sequences [n_seq, prompt+gen] (prompts from the training text, then the target's
    greedy continuation) and the target's layer inputs for every position [n_seq, L, k*E]."""
    gen = torch.Generator().manual_seed(seed)
    prompts = random_windows(stream, n_seq, prompt_len - 1, gen)
    seqs, feats = [], []
    t0 = time.time()
    for b in range(0, n_seq, batch):
        ids = prompts[b:b + batch]
        cache: list = []
        logits, _ = model(ids, 0, cache)
        out = [ids]
        nxt = logits[:, -1].argmax(-1, keepdim=True)
        pos = ids.shape[1]
        for _ in range(gen_len):
            out.append(nxt)
            logits, _ = model(nxt, pos, cache)
            nxt = logits[:, -1].argmax(-1, keepdim=True)
            pos += 1
        full = torch.cat(out, dim=1)
        _, f = model(full, want_layers=layers)  # features of every position in one pass
        seqs.append(full)
        feats.append(f)
        log(f"continuations {min(b + batch, n_seq)}/{n_seq}  {time.time() - t0:5.0f} s")
    return torch.cat(seqs), torch.cat(feats)


# --- drafter ----------------------------------------------------------------------------------------


def draft_batch(seqs, feats, idx, anchors_per_seq, block, first_anchor, mask_id, gen):
    """Build one DFlash training batch: for each sequence, several random anchors a; each block
    [x_a, MASK x (B-1)] at positions a..a+B-1 sees the context features at positions < a and
    its own whole block (non-causal), and learns x[a+1..a+B-1]."""
    x = seqs[idx]  # [b, L]
    f = feats[idx]
    b, L = x.shape
    K, B = anchors_per_seq, block
    anchors = torch.stack([
        torch.randperm(L - B - first_anchor + 1, generator=gen)[:K] + first_anchor for _ in range(b)
    ])  # [b, K]
    offs = torch.arange(B)
    block_pos = (anchors[..., None] + offs).reshape(b, K * B)  # [b, N]
    block_tok = torch.full((b, K, B), mask_id, dtype=torch.long)
    block_tok[..., 0] = x.gather(1, anchors)
    labels = x.gather(1, block_pos).reshape(b, K, B)[..., 1:]  # row i predicts x[a+i]
    ctx_ok = torch.arange(L)[None, None, :] < anchors[..., None]  # [b, K, L]
    same_block = torch.eye(K, dtype=torch.bool)[None, :, :, None].expand(b, K, K, B).reshape(b, K, K * B)
    mask = torch.cat([ctx_ok, same_block], dim=-1)  # [b, K, L + N]
    mask = mask[:, :, None, :].expand(b, K, B, L + K * B).reshape(b, K * B, L + K * B)
    return f, block_tok.reshape(b, K * B), block_pos, labels, mask


def train_draft(target: Target, dcfg: DraftConfig, seqs, feats, steps: int, batch: int,
                anchors_per_seq: int, first_anchor: int, lr: float, gamma: float, mask_id: int,
                seed: int, log: Log) -> DFlashDraft:
    torch.manual_seed(seed)
    draft = DFlashDraft(dcfg, target.cfg)
    for p in draft.parameters():
        if p.dim() == 2:
            torch.nn.init.normal_(p, std=1 / math.sqrt(p.shape[1]))
    embed = target.embed.weight.detach()
    head = target.head.weight.detach()
    opt = torch.optim.AdamW(draft.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    gen = torch.Generator().manual_seed(seed)
    B = dcfg.block_size
    weights = torch.exp(-torch.arange(B - 1, dtype=torch.float32) / gamma)  # decays with position
    L = seqs.shape[1]
    t0 = time.time()
    for step in range(steps):
        set_cosine_lr(opt, step, steps, lr)
        idx = torch.randint(0, len(seqs), (batch,), generator=gen)
        f, tok, pos, labels, mask = draft_batch(seqs, feats, idx, anchors_per_seq, B, first_anchor, mask_id, gen)
        hidden = draft(f, torch.arange(L), F.embedding(tok, embed), pos, mask)
        logits = (hidden @ head.T).reshape(batch, anchors_per_seq, B, -1)[:, :, 1:]
        ce = F.cross_entropy(logits.flatten(0, 2), labels.flatten(), reduction="none").reshape(labels.shape)
        loss = (ce * weights).sum(-1).mean() / weights.sum()
        descend(opt, loss, draft.parameters())
        if step % 50 == 0 or step == steps - 1:
            with torch.no_grad():
                acc = (logits.argmax(-1) == labels).float().mean(dim=(0, 1))
            log(f"draft step {step:5d}/{steps}  loss {loss.item():.3f}  acc/pos "
                + " ".join(f"{a:.2f}" for a in acc.tolist()) + f"  {time.time() - t0:5.0f} s")
    return draft.eval()
