"""What token trees would accept, measured before trees are verified (issue 40).

`TreeCommit` wraps a DFlash proposer: its real block is drafted (the draft cache goes through the
same injections as always), a DDTree is grown from the block's per-position distributions
(speculative.tree), and the tree's greedy accepted path, which is the longest prefix of the
target's greedy continuation the tree holds, is what the engine is made to commit: the draft it
verifies is that prefix followed by a token the target rejects. Steps then land where a tree
verify would leave them, so the engine's tokens per target call are a tree's, at any budget,
on any machine: a hardware-independent figure. What it cannot say is what the tree's verify
costs (B + 1 rows where the chain has n_max + 1): that needs the tree verify itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ggspec.speculative.proposer import Draft
from ggspec.speculative.tree import ddtree, top_k


@dataclass
class TreeCounts:
    """Per budget: steps, drafted chain tokens the tree held, tree nodes."""

    steps: int = 0
    accepted: int = 0  # the tree's accepted draft tokens, summed
    chain_accepted: int = 0  # what the top-1 chain alone would have accepted at the same steps
    nodes: int = 0
    depths: list[int] = field(default_factory=list)


class TreeCommit:
    """Wraps a DFlash proposer (module docstring). `reference(seq)`: the prompt followed by its
    plain greedy continuation (None: the proposer's own draft, as for calibration)."""

    def __init__(self, inner, budget: int, k: int = 8, n_vocab: int = 0) -> None:
        if not getattr(inner, "samples_drafts", False):  # (plain DFlash: its block rows are distributions)
            raise ValueError(f"trees are grown from a DFlash block's distributions, not {inner.name}'s")
        self.inner, self.budget, self.k, self.n_vocab = inner, budget, k, n_vocab
        self.name, self.max_draft = inner.name, inner.max_draft
        self.reference = lambda _seq: None
        self.counts = TreeCounts()

    def __getattr__(self, name):  # begin, observe, commit, flush, release, reset, close
        return getattr(self.inner, name)

    def propose(self, seqs, n: int) -> list[Draft]:
        made = self.inner.propose(seqs, n)
        logits = self.inner.draft.logits_view()
        rows = logits.shape[0] // len(seqs)
        blocks = logits[:len(seqs) * rows].reshape(len(seqs), rows, -1)[:, rows - n:]  # row i predicts pos + 1 + i
        out = []
        for seq, own, block in zip(seqs, made, blocks):
            reference = self.reference(seq)
            if reference is None:
                out.append(own)
                continue
            truth = np.asarray(reference[seq.pos + 1:seq.pos + 1 + n], dtype=np.int32)
            cols, logprobs = top_k(np.asarray(block, dtype=np.float32), self.k)
            tree = ddtree(self.inner._tokens(cols), logprobs, self.budget)
            depth = tree.accepted(truth)
            c = self.counts
            c.steps += 1
            c.accepted += depth
            c.chain_accepted += _prefix(own.tokens, truth)
            c.nodes += len(tree)
            c.depths.append(depth)
            tokens = np.zeros(n, dtype=np.int32)
            tokens[:len(truth)] = truth
            if depth < n:
                tokens[depth] = (tokens[depth] + 1) % self.n_vocab  # rejected right there
            out.append(Draft(tokens))
        return out


def _prefix(drafted: np.ndarray, truth: np.ndarray) -> int:
    """How many leading drafted tokens equal the continuation."""
    m = min(len(drafted), len(truth))
    differ = np.flatnonzero(drafted[:m] != truth[:m])
    return int(differ[0]) if len(differ) else m
