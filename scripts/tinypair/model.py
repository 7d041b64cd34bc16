"""PyTorch twins of what the pinned llama.cpp computes for `qwen3` (target) and `dflash` (draft).

Weights are laid out exactly as the GGUF wants them (torch Linear [n_out, n_in] is ggml
ne=[n_in, n_out]), RoPE is NEOX (rotate-half), q/k are RMS-normed per head before RoPE, and the
DFlash draft attends to K/V built from the target's layer inputs at all earlier positions plus
its own whole block, non-causally, as `src/models/dflash.cpp` does.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

# the layers and the drafter are ggspec's own (ggspec.distill.model)
from ggspec.distill import model as distill
from ggspec.distill.model import Block, RMSNorm


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


class DFlashDraft(distill.DFlashDraft):
    """ggspec's DFlash drafter (ggspec.distill.model) sized from the tiny pair's configs; borrows
    the target's embeddings and output head (both frozen). `tcfg` is the target's config."""

    def __init__(self, cfg: DraftConfig, target: TargetConfig) -> None:
        super().__init__(distill.DraftConfig(
            n_embd=target.n_embd, target_layers=cfg.target_layers, n_layer=cfg.n_layer, n_head=cfg.n_head,
            n_head_kv=cfg.n_head_kv, head_dim=cfg.head_dim, n_ff=cfg.n_ff, block_size=cfg.block_size,
            rope_base=target.rope_base, eps=target.eps))
        self.tcfg = target
