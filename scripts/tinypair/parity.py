"""Check the exported GGUFs in the patched llama.cpp against their PyTorch originals."""

from __future__ import annotations

import numpy as np
import torch


def _llama_side(target_path, draft_path, prompt: np.ndarray):
    """(target logits of every prompt row, first greedy token, draft logits rows 1..7)."""
    from ggspec.runtime import Batch, ContextParams
    from ggspec.speculative.engine import Engine
    from ggspec.speculative.models import PairConfig
    from ggspec.speculative.proposer import Span
    from ggspec.speculative.request import Request
    from ggspec.speculative.sequence import Sequence

    params = ContextParams(n_ctx=512, n_batch=256, n_ubatch=256, type_k="f32", type_v="f32", flash_attn="off")
    with Engine.open(PairConfig(target=target_path, draft=draft_path, fixed_block=True, n_max=7, ctx=params)) as sp:
        with Batch(sp.target) as b:
            b.add_tokens(prompt, 0, outputs="all")
            sp.target.decode(b)
        logits = sp.target.logits()
        sp.proposer.observe([Span(0, 0, len(prompt), 0)])
        sp.proposer.flush()
        id_last = int(logits[-1].argmax())
        seq = Sequence(0, Request(prompt, 1), id_last=id_last, pos=len(prompt))
        drafts = sp.proposer.propose([seq], sp.n_max)[0].tokens
        return logits, id_last, drafts, sp.draft_ctx.logits()[1:]  # rows 1..7 are the drafts


@torch.no_grad()
def check(target, draft, target_path, draft_path, held_ids: np.ndarray, log) -> None:
    try:
        from ggspec.native.bindings import load

        load()
    except Exception as exc:  # no build: the check is optional
        log(f"parity check skipped ({exc})")
        return
    prompt = held_ids[1000:1064].astype(np.int32)
    ll_logits, id_last, ll_drafts, ll_dlogits = _llama_side(target_path, draft_path, prompt)

    ids = torch.from_numpy(prompt.astype(np.int64))[None]
    logits, feats = target(ids, want_layers=draft.cfg.target_layers)
    pt_logits = logits[0].numpy()
    n = len(prompt)
    block = torch.full((1, draft.cfg.block_size), 1, dtype=torch.long)
    block[0, 0] = id_last
    block[0, 1:] = int(draft_mask_id(target_path))
    hidden = draft(feats, torch.arange(n), target.embed(block), torch.arange(n, n + 8)[None],
                   torch.ones(1, 8, n + 8, dtype=torch.bool))
    pt_dlogits = (hidden[0] @ target.head.weight.T).numpy()[1:]

    d_t = float(np.abs(ll_logits - pt_logits).max())
    d_d = float(np.abs(ll_dlogits - pt_dlogits).max())
    pt_drafts = pt_dlogits.argmax(-1)
    log(f"parity: target logits max |diff| {d_t:.2e}; draft logits max |diff| {d_d:.2e}; "
        f"drafts llama.cpp {ll_drafts.tolist()} torch {pt_drafts.tolist()}")
    if d_t > 1e-2 or d_d > 1e-2 or not np.array_equal(ll_drafts, pt_drafts):
        raise SystemExit("parity check FAILED: the GGUF export does not match the PyTorch model")


def draft_mask_id(path) -> int:
    from ggspec.runtime.gguf_meta import read_meta

    return int(read_meta(path).get("tokenizer.ggml.mask_token_id"))
