"""The draft loop of the autoregressive drafters (draft-simple, draft-eagle3, draft-mtp): one model
call per draft position for every sequence still drafting, each choosing its next token from its
row (greedy, or drawn under its sampler), stopping where the argmax's confidence falls below
p_min, as llama.cpp's loops do (common/speculative.cpp, the draft loops of these types).

What differs between the three is only how a call is made and how a chosen token becomes the
next call's row: `step` and `feed` below.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ggspec.speculative.dflash import top_k_confidence
from ggspec.speculative.sampling import Candidates, candidates
from ggspec.speculative.verifier import DRAFT


def draft_tokens(seqs: Sequence, n: int, p_min: float, step: Callable[[int], tuple[np.ndarray, Any]],
                 feed: Callable[[int, Any, int, int, Any], None],
                 ids: np.ndarray | None = None) -> list[tuple[list[int], list[Candidates]]]:
    """Up to n drafts per sequence. `step(i)` makes draft position i's model call (or none, when
    the logits are already there) and returns its logits, one row per sequence still drafting in
    order, with whatever `feed` needs of it; `feed(row, seq, token, i, extra)` adds `token`, chosen
    from `row`, as that sequence's input of the next call. Returns each sequence's tokens and, where
    they were drawn, their distributions (proposer.model_draft makes the Draft). `ids`: the token
    of each logits column when the head scores a reduced vocabulary (None: column = token)."""
    tokens: list[list[int]] = [[] for _ in seqs]
    dists: list[list[Candidates]] = [[] for _ in seqs]
    live = list(range(len(seqs)))
    draws = [None if seq.sampling.greedy else seq.rng(DRAFT) for seq in seqs]  # one stream per step
    for i in range(n):
        logits, extra = step(i)
        conf = top_k_confidence(logits) if p_min > 0 else None
        still = []
        for r, k in enumerate(live):
            seq = seqs[k]
            if conf is not None and conf[r] < p_min:
                continue  # llama.cpp stops on the argmax's confidence, also for sampled drafts
            if seq.sampling.greedy:
                token = int(logits[r].argmax())
                token = token if ids is None else int(ids[token])
            else:  # drawn from the draft's distribution under the sequence's sampler
                q = candidates(logits[r:r + 1], seq.sampling)
                if ids is not None:  # columns -> tokens: the reduced vocabulary's distribution
                    q = q.of_tokens(ids)
                token = int(q.sample(np.array([draws[k].random()]))[0])
                dists[k].append(q)
            tokens[k].append(token)
            if i + 1 < n:
                feed(r, seq, token, i, extra)
                still.append(k)
        live = still
        if not live:
            break
    return list(zip(tokens, dists))
