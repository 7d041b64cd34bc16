"""Stage 2: train the DFlash draft on the captured data (PyTorch, CPU).

One training example is a block: an anchor position a of a continuation, the block
[x_a, MASK x (B-1)] at positions a..a+B-1 that sees the target's features at positions < a and its
own whole block, and labels x[a+1..a+B-1] (the target's own greedy tokens). The loss is the
block's cross-entropy with weights exp(-k / gamma) decaying along the block (a draft token counts
only if every earlier one was accepted). Same seed, data, plan and thread count: same weights.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from ggspec.distill.capture import Dataset
from ggspec.distill.model import DFlashDraft, DraftConfig
from ggspec.distill.vocab import IGNORE, DraftVocab

Log = Callable[[str], None]


@dataclass(frozen=True)
class TrainPlan:
    steps: int = 600
    minutes: float = 0.0  # > 0: stop (and fit the schedule) within this budget; not deterministic
    batch: int = 8  # sequences per step
    anchors: int = 8  # blocks per sequence
    lr: float = 2e-3
    gamma: float = 0.0  # 0: from the block size, as the DFlash paper sets it (7 for 16, 4 for 8)
    seed: int = 0
    threads: int = 2
    eval_seqs: int = 16  # held back from training: the closing acceptance estimate


@dataclass
class TrainReport:
    steps: int
    seconds: float
    loss: float
    accept: list[float]  # held-out P(the first k drafts all match), k = 1..B-1
    tau: float  # held-out estimate of the committed tokens per step at n_max = B - 1
    coverage: float  # share of labels inside the draft vocabulary

    def tau_at(self, n_max: int) -> float:
        return 1.0 + float(sum(self.accept[:n_max]))


def cosine_lr(step: int, total: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def set_cosine_lr(opt: torch.optim.Optimizer, step: int, total: int, peak: float) -> None:
    """The learning rate of `step` of `total`: `cosine_lr` after a warmup of a twentieth of the steps."""
    for g in opt.param_groups:
        g["lr"] = cosine_lr(step, total, peak, max(1, total // 20))


def descend(opt: torch.optim.Optimizer, loss: torch.Tensor, params) -> None:
    """One optimizer step on `loss`, the gradient of `params` clipped to norm 1."""
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    opt.step()


class Blocks:
    """Builds training blocks from a dataset: anchors where the whole block lies in the target's
    own continuation."""

    def __init__(self, ds: Dataset, block: int, mask_id: int, vocab: DraftVocab, seqs: np.ndarray) -> None:
        self.ds, self.B, self.mask_id, self.vocab = ds, block, mask_id, vocab
        lo = np.maximum(ds.prompt_lens[seqs] - 1, 1)
        hi = ds.lengths[seqs] - block  # last anchor: its block ends at the last token
        ok = hi >= lo
        self.seqs, self.lo, self.hi = seqs[ok], lo[ok], hi[ok]

    def __len__(self) -> int:
        return len(self.seqs)

    def sample(self, pick: np.ndarray, anchors: np.ndarray):
        """Tensors of one batch: pick [b] indices into self.seqs, anchors [b, K] positions."""
        b, K = anchors.shape
        B = self.B
        rows = self.seqs[pick]
        L = int(anchors.max())  # context positions < every anchor
        feats = torch.from_numpy(self.ds.rows(rows, L))
        toks = np.asarray(self.ds.tokens[rows])
        block_pos = anchors[..., None] + np.arange(B)  # [b, K, B]
        block_tok = np.full((b, K, B), self.mask_id, np.int64)
        block_tok[..., 0] = np.take_along_axis(toks, anchors, 1)
        labels = np.take_along_axis(toks, block_pos.reshape(b, K * B), 1).reshape(b, K, B)[..., 1:]
        labels = self.vocab.t2d[labels]  # draft rows; IGNORE outside the draft vocabulary
        ctx_ok = np.arange(L)[None, None, :] < anchors[..., None]  # [b, K, L]
        same = np.eye(K, dtype=bool)[None, :, :, None].repeat(b, 0).repeat(B, 3).reshape(b, K, K * B)
        mask = np.concatenate([ctx_ok, same], -1)[:, :, None, :].repeat(B, 2).reshape(b, K * B, L + K * B)
        return (feats, torch.arange(L), torch.from_numpy(block_tok.reshape(b, K * B)),
                torch.from_numpy(block_pos.reshape(b, K * B)), torch.from_numpy(labels), torch.from_numpy(mask))

    def random_batch(self, gen: np.random.Generator, b: int, K: int):
        pick = gen.integers(0, len(self.seqs), b)
        anchors = gen.integers(self.lo[pick, None], self.hi[pick, None] + 1, (b, K))
        return self.sample(pick, anchors)


def feature_rms(ds: Dataset, n_seq: int = 32) -> np.ndarray:
    """RMS of every feature column over the first sequences' prompts: [k*E]. Columns, not layers:
    Gemma's residual stream has a few dimensions ~100x the others, which would swamp fc."""
    n = min(n_seq, ds.n_done)
    rows = ds.rows(np.arange(n), int(ds.prompt_lens[:n].min())).reshape(-1, ds.features.shape[-1])
    rms = np.sqrt((rows.astype(np.float64) ** 2).mean(axis=0))
    return np.where(rms > 0, rms, 1.0)


def init_draft(cfg: DraftConfig, vocab: DraftVocab, head: np.ndarray, seed: int,
               column_rms: np.ndarray | None = None) -> DFlashDraft:
    """Random layers; a reduced head starts as the target's head rows and trains with the rest (on
    Gemma 3's data a trainable head reached a bigram loss of 2.65 in 150 steps, a frozen one 3.2);
    each feature column enters fc at unit RMS. The final norm starts at 1: the target's own
    final-norm weights (up to ~150 in Gemma 3) made the first logits huge."""
    torch.manual_seed(seed)
    draft = DFlashDraft(cfg)
    if column_rms is not None:
        draft.feature_scale.copy_(torch.from_numpy((1.0 / column_rms).astype(np.float32)))
    for name, p in draft.named_parameters():
        if p.dim() == 2 and not name.startswith("head"):
            torch.nn.init.normal_(p, std=1 / math.sqrt(p.shape[1]))
    with torch.no_grad():
        if draft.head is not None:
            draft.head.weight.copy_(torch.from_numpy(np.array(head[vocab.d2t], np.float32)))
    return draft


def _loss(draft, batch, embed, target_head, weights, K: int):
    feats, ctx_pos, tok, pos, labels, mask = batch
    b = tok.shape[0]
    B = weights.numel() + 1
    hidden = draft(feats, ctx_pos, F.embedding(tok, embed), pos, mask)
    logits = draft.logits(hidden.reshape(b, K, B, -1)[:, :, 1:], target_head)
    ce = F.cross_entropy(logits.flatten(0, 2), labels.flatten(), ignore_index=IGNORE, reduction="none")
    ce = ce.reshape(labels.shape)
    valid = (labels != IGNORE).float()
    loss = (ce * valid * weights).sum() / (valid * weights).sum().clamp_min(1e-6)
    return loss, logits, labels


def train(ds: Dataset, cfg: DraftConfig, vocab: DraftVocab, embed: np.ndarray, head: np.ndarray,
          mask_id: int, plan: TrainPlan, log: Log, on_step=None) -> tuple[DFlashDraft, TrainReport]:
    torch.set_num_threads(plan.threads)
    torch.use_deterministic_algorithms(True)
    n = ds.n_done
    eval_n = min(plan.eval_seqs, n // 8)
    train_blocks = Blocks(ds, cfg.block_size, mask_id, vocab, np.arange(0, n - eval_n))
    eval_blocks = Blocks(ds, cfg.block_size, mask_id, vocab, np.arange(n - eval_n, n))
    if len(train_blocks) == 0:
        raise ValueError("no captured sequence is long enough for one block")
    draft = init_draft(cfg, vocab, head, plan.seed, feature_rms(ds))
    embed_t = torch.from_numpy(embed)
    head_t = None if draft.head is not None else torch.from_numpy(head)
    opt = torch.optim.AdamW(draft.parameters(), lr=plan.lr, betas=(0.9, 0.95), weight_decay=0.0)
    gen = np.random.default_rng(plan.seed)
    B = cfg.block_size
    gamma = plan.gamma or (7.0 if B >= 16 else 4.0 if B >= 8 else 2.0)
    weights = torch.exp(-torch.arange(B - 1, dtype=torch.float32) / gamma)
    total = plan.steps
    t0 = time.time()
    step = 0
    loss = torch.tensor(0.0)
    while step < total:
        set_cosine_lr(opt, step, total, plan.lr)
        batch = train_blocks.random_batch(gen, plan.batch, plan.anchors)
        loss, logits, labels = _loss(draft, batch, embed_t, head_t, weights, plan.anchors)
        descend(opt, loss, draft.parameters())
        step += 1
        elapsed = time.time() - t0
        if plan.minutes > 0 and step == 5:  # fit the schedule to the time budget
            total = max(step + 1, min(plan.steps, int(plan.minutes * 60 / (elapsed / step))))
        if plan.minutes > 0 and elapsed > plan.minutes * 60:
            break
        if on_step:
            on_step(step, total, loss.item())
        if step % 25 == 0 or step == total:
            with torch.no_grad():
                hit = (logits.argmax(-1) == labels).float().mean(dim=(0, 1))
            log(f"step {step}/{total}  loss {loss.item():.3f}  hit@1..4 "
                + " ".join(f"{a:.2f}" for a in hit[:4].tolist()) + f"  {elapsed:.0f} s")
    draft.eval()
    accept = evaluate(draft, eval_blocks if len(eval_blocks) else train_blocks, embed_t, head_t, weights,
                      plan.anchors, plan.seed)
    report = TrainReport(steps=step, seconds=time.time() - t0, loss=float(loss.detach()), accept=accept,
                         tau=1.0 + float(sum(accept)), coverage=vocab.coverage)
    return draft, report


@torch.no_grad()
def evaluate(draft, blocks: Blocks, embed, target_head, weights, K: int, seed: int, n_batches: int = 4) -> list[float]:
    """P(the first k drafts all equal the target's tokens), k = 1..B-1, over random held-out blocks
    (greedy acceptance without the verify: an estimate of what the draft will get)."""
    gen = np.random.default_rng(seed + 1)
    runs = []
    for _ in range(n_batches):
        batch = blocks.random_batch(gen, min(8, len(blocks)), K)
        _, logits, labels = _loss(draft, batch, embed, target_head, weights, K)
        hit = (logits.argmax(-1) == labels).flatten(0, 1)  # [blocks, B-1]
        runs.append(hit.cumprod(dim=1).float())
    return torch.cat(runs).mean(0).tolist()
