"""Token trees: several draft continuations at once, verified in one target call (issue 40).

A tree's nodes are draft tokens; node i has a parent (-1: the root, the sequence's last committed
token) and a depth (1 for the root's children). A DFlash block gives a distribution at each of its
positions, each computed without knowing the tokens drafted before it (a marginal): DDTree
(arXiv 2604.12989) takes the K likeliest tokens at each position and grows the tree best-first by
the joint log-probability of a node's path (the sum of its tokens' log-probabilities), under a
budget of nodes. The top-1 chain, what a chain verify would check, is always in: its nodes come
first, so node i < n_chain is the chain's i-th token.

Greedy acceptance of a tree is the longest root path whose every token equals the target's argmax
after the path before it; as the target's greedy continuation is the same whatever was drafted,
that path is the longest prefix of the continuation the tree holds (`accepted`).

What is here: the trees and their greedy walk. What is not yet: verifying a tree in one target
decode (a node attends to its ancestors only) and committing the accepted path's cells; until
then `scripts/tree_acceptance.py` measures what trees would accept, per target call, by making the
engine commit exactly the tree's accepted path at every step.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Tree:
    """Draft tokens in a tree: `tokens[i]`, `parents[i]` (-1: the root) and `depths[i]` (1: a child
    of the root); parents come before their children. The first `n_chain` nodes are the top-1 chain."""

    tokens: np.ndarray  # (n,) int32
    parents: np.ndarray  # (n,) int32
    depths: np.ndarray  # (n,) int32
    n_chain: int

    def __len__(self) -> int:
        return len(self.tokens)

    def path(self, node: int) -> list[int]:
        """The tokens from the root down to `node`, that node's included."""
        out = []
        while node >= 0:
            out.append(int(self.tokens[node]))
            node = int(self.parents[node])
        return out[::-1]

    def accepted(self, continuation) -> int:
        """Greedy: how many tokens of the target's `continuation` (its argmax after the committed
        text, then after each of those) the tree holds as a root path: the accepted draft length."""
        children: dict[int, dict[int, int]] = {}
        for i, (t, p) in enumerate(zip(self.tokens.tolist(), self.parents.tolist())):
            children.setdefault(p, {}).setdefault(t, i)
        node, depth = -1, 0
        for token in continuation:
            node = children.get(node, {}).get(int(token), -2)
            if node == -2:
                break
            depth += 1
        return depth


def branch_sequences(tree: Tree, first: int) -> tuple[list[list[int]], int]:
    """The sequence ids of each verify row (row 0: the root, row i + 1: node i) when every leaf's
    branch is a sequence of its own, numbered from `first`: a row belongs to every branch through
    it, so in llama.cpp's mask (a row sees the cells of its first sequence id at earlier positions)
    it sees exactly its ancestors. Also the number of branches."""
    has_child = np.zeros(len(tree), dtype=bool)
    has_child[tree.parents[tree.parents >= 0]] = True
    rows: list[list[int]] = [[] for _ in range(len(tree) + 1)]  # row 0: the root
    leaves = np.flatnonzero(~has_child)
    for k, leaf in enumerate(leaves.tolist()):
        node = leaf
        while node >= 0:
            rows[node + 1].append(first + k)
            node = int(tree.parents[node])
        rows[0].append(first + k)
    return rows, len(leaves)


def top_k(logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Each row's k likeliest columns, best first, and their log-probabilities (log-softmax)."""
    k = min(k, logits.shape[1])
    cols = np.argpartition(-logits, k - 1, axis=1)[:, :k]
    picked = np.take_along_axis(logits, cols, axis=1)
    order = np.argsort(-picked, axis=1, kind="stable")
    cols, picked = np.take_along_axis(cols, order, axis=1), np.take_along_axis(picked, order, axis=1)
    top = logits.max(axis=1, keepdims=True)
    log_z = top + np.log(np.exp(logits - top).sum(axis=1, keepdims=True))
    return cols.astype(np.int32), (picked - log_z).astype(np.float64)


def ddtree(tokens: np.ndarray, logprobs: np.ndarray, budget: int) -> Tree:
    """DDTree from per-position candidates: `tokens[d, j]` is position d + 1's j-th likeliest token
    (best first), `logprobs[d, j]` its log-probability. The top-1 chain first (cut at the budget),
    then the best of the rest by the joint log-probability of their paths until `budget` nodes."""
    n, k = tokens.shape
    budget = max(0, budget)
    chain = min(n, budget)
    out_t, out_p, out_d, score = [], [], [], []
    for d in range(chain):
        out_t.append(int(tokens[d, 0]))
        out_p.append(d - 1)
        out_d.append(d + 1)
        score.append((score[-1] if score else 0.0) + float(logprobs[d, 0]))
    # candidates: (-joint log-prob, tie order, parent node, depth index, rank at that depth)
    heap: list[tuple[float, int, int, int, int]] = []
    order = 0

    def offer(parent: int, d: int, first_rank: int) -> None:
        nonlocal order
        if d >= n:
            return
        base = score[parent] if parent >= 0 else 0.0
        for j in range(first_rank, k):
            heapq.heappush(heap, (-(base + float(logprobs[d, j])), order, parent, d, j))
            order += 1

    offer(-1, 0, 1)  # the root's other children (its first is the chain's)
    for i in range(chain):
        offer(i, i + 1, 1)  # each chain node's children but the chain's own next
    while len(out_t) < budget and heap:
        neg, _, parent, d, j = heapq.heappop(heap)
        node = len(out_t)
        out_t.append(int(tokens[d, j]))
        out_p.append(parent)
        out_d.append(d + 1)
        score.append(-neg)
        offer(node, d + 1, 0)
    return Tree(np.asarray(out_t, dtype=np.int32), np.asarray(out_p, dtype=np.int32),
                np.asarray(out_d, dtype=np.int32), chain)


def chain(tokens) -> Tree:
    """A chain as a tree (each node the previous one's child)."""
    n = len(tokens)
    return Tree(np.asarray(tokens, dtype=np.int32), np.arange(-1, n - 1, dtype=np.int32),
                np.arange(1, n + 1, dtype=np.int32), n)
