"""Verifying token trees in the target's one decode, with llama.cpp's own sequences (issue 40).

A tree's node must attend to its ancestors only. llama.cpp lets a batch row see the cells of its
first sequence id at positions up to its own, and a row tagged with several sequence ids stores
its cell for all of them. So every leaf's branch gets a sequence id of its own (`branch_sequences`),
the sequence's prefix is shared with each branch (a unified cache adds the ids to the cells:
nothing is copied), and each node's row is tagged with every branch through it: its first id's
cells are then exactly its ancestors, at positions prefix + depth. This needs no mask patch and
costs what a chain of as many rows costs, plus 0.1-0.2 ms of bookkeeping
(scripts/tree_verify_probe.py; a parent-index mask patch would save only that).

Acceptance. Greedy: the walk along the target's argmax (Tree.walk). Sampling (T > 0): a tree's
nodes are point masses (DDTree takes each position's likeliest tokens, it does not draw them), and
for point masses the exact rule is to draw the token from the target's distribution at the node's
row and move to the child holding it, if one does: each committed token is then a draw from the
target's own distribution after the text before it, as plain sampling's (lossless in distribution),
and a node's children are accepted with the whole probability the target gives them together, the
most any exact rule can accept (SpecInfer's multi-draft rejection with point-mass drafts reduces to
it: accept sibling x with p(x), else renormalise p without x and try the next).

After the walk, the accepted path's cells are given to the sequence (they carry the ids of
the branch through the path's last node) and every branch is dropped, which frees the other
nodes' cells: the sequence then holds prompt + path, as if a chain had accepted it.

Branch ids: slot s's branches are parallel + s * leaves ... + leaves - 1, so a target context
with trees has parallel * (1 + leaves) sequence ids (llama.cpp holds at most 256) on one unified
cache.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ggspec.runtime import Batch, Context
from ggspec.speculative.sampling import candidates
from ggspec.speculative.tree import Tree, branch_sequences
from ggspec.speculative.verifier import VERIFY, Outcome

MAX_SEQ = 256  # LLAMA_MAX_SEQ


def tree_seq_ids(parallel: int, leaves: int) -> int:
    """Sequence ids a target context needs for `parallel` slots whose trees have up to `leaves`
    leaves each (a tree of B nodes has at most B)."""
    return parallel * (1 + leaves)


@dataclass
class Placed:
    """A tree added to a verify batch: its first row, its rows' branch ids, its branches."""

    tree: Tree
    row0: int
    rows: list[list[int]]  # per row (0: the root) the branch ids through it
    branches: range


class TreeVerify:
    """The verify side of token trees over one target context (module docstring)."""

    def __init__(self, target: Context, parallel: int, leaves: int) -> None:
        self.target = target
        self.parallel = parallel
        self.leaves = leaves

    def add(self, batch: Batch, seq, tree: Tree, row0: int) -> Placed:
        """Add the sequence's verify rows (its last token as the root, then the tree's nodes) and
        give its branches the sequence's prefix."""
        first = self.parallel + seq.seq_id * self.leaves
        rows, n = branch_sequences(tree, first)
        assert n <= self.leaves, f"a tree with {n} leaves, {self.leaves} branch ids"
        branches = range(first, first + n)
        for b in branches:
            self.target.share_cells(seq.seq_id, b, 0, seq.pos)
        batch.add_shared(seq.id_last, seq.pos, [*rows[0], seq.seq_id])  # the root is the sequence's own cell
        pos, tokens, depths = seq.pos, tree.tokens.tolist(), tree.depths.tolist()
        for i, (token, depth) in enumerate(zip(tokens, depths)):
            batch.add_shared(token, pos + depth, rows[i + 1])
        return Placed(tree, row0, rows, branches)

    @staticmethod
    def accept(argmax: list[int], placed: Placed) -> tuple[Outcome, list[int]]:
        """The greedy walk over the tree's rows (`argmax`: the target's choice after each of them,
        the root's first): the accepted path's tokens and the target's own next token, and the
        offsets of the rows that hold the committed positions (the root's, then the path's nodes')."""
        path, token = placed.tree.walk(argmax.__getitem__)
        tokens = placed.tree.tokens
        return Outcome(len(path), [int(tokens[i]) for i in path] + [token]), [0, *(i + 1 for i in path)]

    @staticmethod
    def sample(rows: np.ndarray, placed: Placed, seq) -> tuple[Outcome, list[int]]:
        """The walk of a sampling sequence over its tree's rows (rows[0]: the root's): at each node a
        token drawn from the target's distribution there under the sequence's sampler (a draw of
        its own, keyed by its seed and position), then the child holding it; the first drawn token
        no child holds is the target's own. Returns what accept() does."""
        tree = placed.tree
        children, path = tree.children(), []
        draws = seq.rng(VERIFY)
        while True:
            p = candidates(rows[path[-1] + 1 if path else 0][None], seq.sampling)
            token = int(p.sample(np.array([draws.random()]))[0])
            child = children.get(path[-1] if path else -1, {}).get(token)
            if child is None:
                tokens = tree.tokens
                return Outcome(len(path), [int(tokens[i]) for i in path] + [token]), [0, *(i + 1 for i in path)]
            path.append(child)

    def commit(self, seq, placed: Placed, offsets: list[int]) -> None:
        """The accepted path's cells become the sequence's next positions; every branch goes."""
        depth = len(offsets) - 1
        if depth:
            last = offsets[-1]
            self.target.share_cells(placed.rows[last][0], seq.seq_id, seq.pos + 1, seq.pos + 1 + depth)
        for b in placed.branches:
            self.target.drop_sequence(b)

