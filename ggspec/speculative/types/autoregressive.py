"""The draft loop of the autoregressive drafters (draft-simple, draft-eagle3, draft-mtp): one model
call per draft position for every sequence still drafting, each choosing its next token from its
row (greedy, or drawn under its sampler), stopping where the argmax's confidence falls below
p_min, as llama.cpp's loops do (common/speculative.cpp, the draft loops of these types).

What differs between the three is only how a call is made and how a chosen token becomes the
next call's row: `step` and `feed` below. A call's rows come back as logits on the host, or
(draft-simple) as what the device picked of them for the greedy sequences: `PickedRows`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ggspec.speculative.sampling import Candidates, candidates
from ggspec.speculative.tree import top_k
from ggspec.speculative.types.confidence import CONFIDENCE_TOP_K, best_picked, picked_ranked, top_k_confidence
from ggspec.speculative.verifier import DRAFT


class HostRows:
    """A draft call's output rows as vocabulary-wide logits on the host."""

    def __init__(self, logits: np.ndarray) -> None:
        self.logits = logits

    def argmax(self, r: int) -> int:
        return int(self.logits[r].argmax())

    def confidence(self) -> np.ndarray:
        return top_k_confidence(self.logits)

    def row(self, r: int) -> np.ndarray:
        return self.logits[r:r + 1]


class PickedRows:
    """A draft call's output rows where the device picked some (Context.pick_on_device): a greedy
    sequence's row is its argmax, or its 10 largest logits where the confidence matters (p_min > 0),
    so no vocabulary-wide row crosses to the host for it; other sequences' rows are full logits.
    `seq_ids`: the sequence of each row; `n_cols`: the columns a full row may draft from."""

    def __init__(self, ctx, seq_ids: Sequence[int], n_cols: int) -> None:
        self.ctx, self.seq_ids, self.n_cols = ctx, seq_ids, n_cols
        self._tops: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # row -> picked top (read once)

    def _top(self, r: int) -> tuple[np.ndarray, np.ndarray]:
        if r not in self._tops:
            self._tops[r] = self.ctx.picked_top(r)
        return self._tops[r]

    def argmax(self, r: int) -> int:
        k = self.ctx.picked_on_device(self.seq_ids[r])
        if k is None:
            return int(self.row(r).argmax())
        if k == 0:
            return self.ctx.picked_argmax(r)
        return best_picked(*self._top(r))

    def confidence(self) -> np.ndarray:
        conf = np.empty(len(self.seq_ids))
        for r, seq_id in enumerate(self.seq_ids):
            if self.ctx.picked_on_device(seq_id):
                conf[r] = top_k_confidence(self._top(r)[1][None], CONFIDENCE_TOP_K)[0]
            else:  # a full row (an argmax alone has no confidence: p_min > 0 picks the top 10)
                conf[r] = top_k_confidence(self.row(r))[0]
        return conf

    def row(self, r: int) -> np.ndarray:
        return self.ctx.logits_view()[r:r + 1, :self.n_cols]


def row_candidates(rows, r: int, k: int, ids: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """Row r's k likeliest tokens, best first, and their log-probabilities: from the full row, or
    from the top logits the device picked (normalised among themselves)."""
    if isinstance(rows, PickedRows) and rows.ctx.picked_on_device(rows.seq_ids[r]):
        cols, logprobs = picked_ranked(*rows._top(r), k)
    else:
        cols, logprobs = top_k(rows.row(r), k)
        cols, logprobs = cols[0], logprobs[0]
    return (cols if ids is None else ids[cols]).astype(np.int32), logprobs


class RowCandidates:
    """Token trees for an autoregressive drafter (a mixin of its proposer): each drafted
    position's likeliest tokens, read from the chain's own rows while drafting. The siblings at a
    depth are then the draft's alternatives given the chain before them; a node below a sibling
    takes the chain's candidates at its depth, computed after the chain's token there, not its
    own (like DFlash's marginals: the target's verify decides, so the output stays exact)."""

    grows_trees = True
    trees = False  # keep_candidates() was called: a device that picks a row keeps its top logits
    _wanted = False  # this step's propose keeps its rows' candidates (want_candidates)
    _candidates: dict = {}

    def keep_candidates(self) -> None:
        self.trees = True

    def want_candidates(self, on: bool) -> None:
        self._wanted = on

    def _keeping(self, seqs) -> list[list] | None:
        """Where this propose's rows' candidates go (draft_tokens' `kept`), None: not kept."""
        self._candidates = {}
        return [[] for _ in seqs] if self._wanted and self.trees else None

    def _kept(self, seqs, kept: list[list] | None) -> None:
        if kept is None:
            return
        self._candidates = {seq.seq_id: (np.stack([c for c, _ in rows]), np.stack([p for _, p in rows]))
                            for seq, rows in zip(seqs, kept) if rows}

    def marginals(self, seqs, n: int, k: int) -> list[tuple[np.ndarray, np.ndarray] | None]:
        return [self._candidates.get(seq.seq_id) for seq in seqs]


def draft_tokens(seqs: Sequence, n: int, p_min: float, step: Callable[[int], tuple[Any, Any]],
                 feed: Callable[[int, Any, int, int, Any], None],
                 ids: np.ndarray | None = None, kept: list[list] | None = None,
                 top: int = 8) -> list[tuple[list[int], list[Candidates]]]:
    """Up to n drafts per sequence. `step(i)` makes draft position i's model call (or none, when
    the logits are already there) and returns its rows, one per sequence still drafting in order
    (logits, HostRows or PickedRows), with whatever `feed` needs of it; `feed(row, seq, token, i,
    extra)` adds `token`, chosen from `row`, as that sequence's input of the next call. Returns
    each sequence's tokens and, where they were drawn, their distributions (proposer.model_draft
    makes the Draft). `ids`: the token of each logits column when the head scores a reduced
    vocabulary (None: column = token). `p_min`: the proposer's cut-off, where a sequence has none
    of its own (Sequence.p_min). `kept`: per sequence, a list that gets each drafted position's
    `top` candidates (row_candidates), for a token tree."""
    cuts = [seq.p_min(p_min) for seq in seqs]
    tokens: list[list[int]] = [[] for _ in seqs]
    dists: list[list[Candidates]] = [[] for _ in seqs]
    live = list(range(len(seqs)))
    draws = [None if seq.sampling.greedy else seq.rng(DRAFT) for seq in seqs]  # one stream per step
    for i in range(n):
        rows, extra = step(i)
        rows = HostRows(rows) if isinstance(rows, np.ndarray) else rows
        conf = rows.confidence() if any(cuts[k] > 0 for k in live) else None
        still = []
        for r, k in enumerate(live):
            seq = seqs[k]
            if conf is not None and conf[r] < cuts[k]:
                continue  # llama.cpp stops on the argmax's confidence, also for sampled drafts
            if seq.sampling.greedy:
                token = rows.argmax(r)
                token = token if ids is None else int(ids[token])
                if kept is not None:
                    kept[k].append(row_candidates(rows, r, top, ids))
            else:  # drawn from the draft's distribution under the sequence's sampler
                q = candidates(rows.row(r), seq.sampling)
                if ids is not None:  # columns -> tokens: the reduced vocabulary's distribution
                    q = q.of_tokens(ids)
                token = int(q.sample(np.array([draws[k].random()]))[0])
                dists[k].append(q)
                if kept is not None:
                    kept[k].append(row_candidates(rows, r, top, ids))
            tokens[k].append(token)
            if i + 1 < n:
                feed(r, seq, token, i, extra)
                still.append(k)
        live = still
        if not live:
            break
    return list(zip(tokens, dists))
