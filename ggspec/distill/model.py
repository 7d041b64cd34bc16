"""The DFlash draft in PyTorch, as the pinned llama.cpp's `src/models/dflash.cpp` computes it.

Weights are laid out as the GGUF wants them (a torch Linear [n_out, n_in] is ggml ne=[n_in,
n_out]); RoPE is NEOX (rotate-half); q/k are RMS-normed per head before RoPE. The draft fuses the
target's layer inputs through `fc` + a hidden norm into per-layer K/V at the context positions,
then runs its block `[x_a, MASK x (B-1)]` through its layers, attending non-causally to the
context before the anchor and to its whole block.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class DraftConfig:
    n_embd: int  # the target's hidden size (the draft borrows its token embeddings)
    target_layers: tuple[int, ...]  # llama.cpp layer-input ids of the target
    n_layer: int = 2
    n_head: int = 4
    n_head_kv: int = 2
    head_dim: int = 64
    n_ff: int = 1536
    block_size: int = 16
    rope_base: float = 1e6
    eps: float = 1e-6
    embed_scale: float = 1.0  # the block's token embeddings are multiplied by this (GGUF embedding_scale)
    n_vocab_draft: int = 0  # > 0: the draft has its own head over that many target tokens (d2t)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope(x: torch.Tensor, pos: torch.Tensor, base: float) -> torch.Tensor:
    """NEOX RoPE over the last dim of x [..., T, H, hd] at positions pos [..., T]."""
    hd = x.shape[-1]
    half = hd // 2
    inv = base ** (-torch.arange(0, half, dtype=torch.float32) * 2 / hd)
    theta = pos.to(torch.float32)[..., None] * inv  # [..., T, half]
    cos, sin = theta.cos()[..., None, :], theta.sin()[..., None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


class SwiGLU(nn.Module):
    def __init__(self, n_embd: int, n_ff: int) -> None:
        super().__init__()
        self.gate = nn.Linear(n_embd, n_ff, bias=False)
        self.up = nn.Linear(n_embd, n_ff, bias=False)
        self.down = nn.Linear(n_ff, n_embd, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))


class Attention(nn.Module):
    def __init__(self, n_embd: int, n_head: int, n_head_kv: int, head_dim: int, eps: float) -> None:
        super().__init__()
        self.n_head, self.n_head_kv, self.head_dim = n_head, n_head_kv, head_dim
        self.q = nn.Linear(n_embd, n_head * head_dim, bias=False)
        self.k = nn.Linear(n_embd, n_head_kv * head_dim, bias=False)
        self.v = nn.Linear(n_embd, n_head_kv * head_dim, bias=False)
        self.o = nn.Linear(n_head * head_dim, n_embd, bias=False)
        self.q_norm = RMSNorm(head_dim, eps)
        self.k_norm = RMSNorm(head_dim, eps)

    def project_q(self, h, pos, base):
        q = self.q(h).unflatten(-1, (self.n_head, self.head_dim))
        return rope(self.q_norm(q), pos, base)

    def project_kv(self, h, pos, base):
        k = self.k(h).unflatten(-1, (self.n_head_kv, self.head_dim))
        v = self.v(h).unflatten(-1, (self.n_head_kv, self.head_dim))
        return rope(self.k_norm(k), pos, base), v

    def attend(self, q, k, v, mask=None, causal=False):
        """q [B,Tq,H,hd], k/v [B,Tk,Hkv,hd]; GQA maps query head h to kv head h // n_rep."""
        rep = self.n_head // self.n_head_kv
        k = k.repeat_interleave(rep, dim=2)
        v = v.repeat_interleave(rep, dim=2)
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
            attn_mask=mask, is_causal=causal and mask is None,
        )
        return self.o(out.transpose(1, 2).flatten(-2))


class Block(nn.Module):
    def __init__(self, n_embd, n_head, n_head_kv, head_dim, n_ff, eps) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(n_embd, eps)
        self.attn = Attention(n_embd, n_head, n_head_kv, head_dim, eps)
        self.ffn_norm = RMSNorm(n_embd, eps)
        self.ffn = SwiGLU(n_embd, n_ff)


class DFlashDraft(nn.Module):
    """The drafter. Token embeddings are the target's (frozen, passed in); the head is its own
    (`head`, reduced vocabulary) or the target's (passed to `logits`)."""

    def __init__(self, cfg: DraftConfig) -> None:
        super().__init__()
        self.cfg = cfg
        E = cfg.n_embd
        self.fc = nn.Linear(len(cfg.target_layers) * E, E, bias=False)
        # per-input-column factors applied before fc during training (1 / each column's RMS: a deep
        # Gemma layer's inputs are ~20x a shallow one's, a few columns ~100x the rest); folded into
        # fc.weight on export
        self.register_buffer("feature_scale", torch.ones(len(cfg.target_layers) * E))
        self.hidden_norm = RMSNorm(E, cfg.eps)
        self.blocks = nn.ModuleList(
            Block(E, cfg.n_head, cfg.n_head_kv, cfg.head_dim, cfg.n_ff, cfg.eps) for _ in range(cfg.n_layer)
        )
        self.norm = RMSNorm(E, cfg.eps)
        self.head = nn.Linear(E, cfg.n_vocab_draft, bias=False) if cfg.n_vocab_draft else None

    def forward(self, ctx_feats, ctx_pos, block_x, block_pos, mask):
        """ctx_feats [B,L,k*E] at ctx_pos [L]; block_x [B,N,E] (embedded block tokens, unscaled) at
        block_pos [B,N]; mask [B,N,L+N] (True = may attend). Returns hidden [B,N,E]."""
        base = self.cfg.rope_base
        g = self.hidden_norm(self.fc(ctx_feats * self.feature_scale))
        x = block_x * self.cfg.embed_scale if self.cfg.embed_scale != 1.0 else block_x
        for blk in self.blocks:
            k_ctx, v_ctx = blk.attn.project_kv(g, ctx_pos, base)  # no attn_norm on g
            h = blk.attn_norm(x)
            q = blk.attn.project_q(h, block_pos, base)
            k_blk, v_blk = blk.attn.project_kv(h, block_pos, base)
            k = torch.cat([k_ctx, k_blk], dim=1)
            v = torch.cat([v_ctx, v_blk], dim=1)
            x = x + blk.attn.attend(q, k, v, mask=mask[:, None])
            x = x + blk.ffn(blk.ffn_norm(x))
        return self.norm(x)

    @torch.no_grad()
    def fold_scales(self) -> None:
        """Move feature_scale into fc.weight (llama.cpp's graph has none: fc reads the raw features)."""
        self.fc.weight.mul_(self.feature_scale[None, :])
        self.feature_scale.fill_(1.0)

    def logits(self, hidden: torch.Tensor, target_head: torch.Tensor | None = None) -> torch.Tensor:
        """Logits over the draft vocabulary (own head) or the target's (its head weight [V,E])."""
        if self.head is not None:
            return self.head(hidden)
        if target_head is None:
            raise ValueError("a full-vocabulary draft needs the target's head")
        return hidden @ target_head.T
