"""PyTorch twins of what the pinned llama.cpp computes for `qwen3` (target) and `dflash` (draft).

Weights are laid out exactly as the GGUF wants them (torch Linear [n_out, n_in] is ggml
ne=[n_in, n_out]), RoPE is NEOX (rotate-half), q/k are RMS-normed per head before RoPE, and the
DFlash draft attends to K/V built from the target's layer inputs at all earlier positions plus
its own whole block, non-causally, as `src/models/dflash.cpp` does.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class TargetConfig:
    n_vocab: int
    n_embd: int = 128
    n_layer: int = 4
    n_head: int = 4
    n_head_kv: int = 2
    head_dim: int = 32
    n_ff: int = 384
    rope_base: float = 1e6
    eps: float = 1e-6
    n_ctx: int = 4096


@dataclass(frozen=True)
class DraftConfig:
    n_layer: int = 2
    n_head: int = 4
    n_head_kv: int = 2
    head_dim: int = 32
    n_ff: int = 384
    block_size: int = 8
    target_layers: tuple[int, ...] = (1, 2, 3)  # llama.cpp layer-input ids of the target


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


class Target(nn.Module):
    """qwen3: untied head, q/k norm, NEOX RoPE."""

    def __init__(self, cfg: TargetConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.n_vocab, cfg.n_embd)
        self.blocks = nn.ModuleList(
            Block(cfg.n_embd, cfg.n_head, cfg.n_head_kv, cfg.head_dim, cfg.n_ff, cfg.eps)
            for _ in range(cfg.n_layer)
        )
        self.norm = RMSNorm(cfg.n_embd, cfg.eps)
        self.head = nn.Linear(cfg.n_embd, cfg.n_vocab, bias=False)

    def forward(self, ids: torch.Tensor, pos0: int = 0, cache: list | None = None,
                want_layers: tuple[int, ...] = ()):
        """Logits [B,T,V] and the requested layer inputs (concatenated [B,T,k*E]).

        With `cache` (a list, filled on first use), keys/values of earlier calls are reused:
        incremental greedy generation.
        """
        x = self.embed(ids)
        T = ids.shape[1]
        pos = torch.arange(pos0, pos0 + T)
        feats = []
        for il, blk in enumerate(self.blocks):
            if il in want_layers:
                feats.append(x)
            h = blk.attn_norm(x)
            q = blk.attn.project_q(h, pos, self.cfg.rope_base)
            k, v = blk.attn.project_kv(h, pos, self.cfg.rope_base)
            mask = None
            if cache is not None:
                if len(cache) > il:
                    k = torch.cat([cache[il][0], k], dim=1)
                    v = torch.cat([cache[il][1], v], dim=1)
                    cache[il] = (k, v)
                else:
                    cache.append((k, v))
                if pos0 > 0:  # queries see every cached key and the causal part of their own
                    Tk = k.shape[1]
                    mask = torch.ones(T, Tk, dtype=torch.bool).tril(diagonal=Tk - T)
            x = x + blk.attn.attend(q, k, v, mask=mask, causal=True)
            x = x + blk.ffn(blk.ffn_norm(x))
        logits = self.head(self.norm(x))
        ordered = [feats[sorted(want_layers).index(il)] for il in want_layers] if want_layers else []
        return logits, (torch.cat(ordered, dim=-1) if ordered else None)


class DFlashDraft(nn.Module):
    """The DFlash drafter; borrows the target's embeddings and output head (both frozen)."""

    def __init__(self, cfg: DraftConfig, target: TargetConfig) -> None:
        super().__init__()
        self.cfg, self.tcfg = cfg, target
        E = target.n_embd
        self.fc = nn.Linear(len(cfg.target_layers) * E, E, bias=False)
        self.hidden_norm = RMSNorm(E, target.eps)
        self.blocks = nn.ModuleList(
            Block(E, cfg.n_head, cfg.n_head_kv, cfg.head_dim, cfg.n_ff, target.eps)
            for _ in range(cfg.n_layer)
        )
        self.norm = RMSNorm(E, target.eps)

    def forward(self, ctx_feats, ctx_pos, block_x, block_pos, mask):
        """ctx_feats [B,L,k*E] at ctx_pos [L]; block_x [B,N,E] (embedded block tokens) at
        block_pos [B,N]; mask [B,N,L+N] (True = may attend). Returns hidden [B,N,E]."""
        base = self.tcfg.rope_base
        g = self.hidden_norm(self.fc(ctx_feats))
        x = block_x
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
