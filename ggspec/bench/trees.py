"""What token trees would accept, simulated with chains: a check of the tree verify (issue 40).

`TreeCommit` wraps a proposer that grows trees (plain DFlash, draft-simple, EAGLE3): its real
draft is made (the draft's state goes through the same updates as always), a DDTree is grown
from its per-position candidates (Proposer.marginals), and the tree's greedy accepted path,
which is the longest prefix of the target's greedy continuation the tree holds, is what the
engine is made to commit: the draft it
verifies is that prefix followed by a token the target rejects. Steps then land where a tree
verify would leave them, so the engine's tokens per target call are a tree's, at any budget,
on any machine: a hardware-independent figure. What it cannot say is what the tree's verify
costs (B + 1 rows where the chain has n_max + 1): that needs the tree verify itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ggspec.speculative.proposer import Draft
from ggspec.speculative.tree import ddtree


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
        if not getattr(inner, "grows_trees", False):
            raise ValueError(f"{inner.name} drafts give no per-position candidates to grow a tree from")
        self.inner, self.budget, self.k, self.n_vocab = inner, budget, k, n_vocab
        inner.keep_candidates()
        self.name, self.max_draft = inner.name, inner.max_draft
        self.reference = lambda _seq: None
        self.counts = TreeCounts()

    def __getattr__(self, name):  # begin, observe, commit, flush, release, reset, close
        return getattr(self.inner, name)

    def propose(self, seqs, n: int) -> list[Draft]:
        self.inner.want_candidates(True)
        made = self.inner.propose(seqs, n)
        grown = self.inner.marginals(seqs, n, self.k)
        out = []
        for seq, own, candidates in zip(seqs, made, grown):
            reference = self.reference(seq)
            if reference is None or candidates is None or len(own) != n:
                out.append(own)
                continue
            truth = np.asarray(reference[seq.pos + 1:seq.pos + 1 + n], dtype=np.int32)
            tree = ddtree(*candidates, self.budget)
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
