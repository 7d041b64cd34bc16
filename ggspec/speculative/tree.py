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

Here: the trees, their greedy walk over a verify's rows, and their pruning to a draft length or a
smaller budget. The verify itself (one target decode, a node attending to its ancestors only,
then the accepted path's cells kept) is tree_verify.py; which budget a step uses, tree_budget.py.
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

    def children(self) -> dict[int, dict[int, int]]:
        """Each node's children by token (-1: the root's), the first node of a token kept."""
        out: dict[int, dict[int, int]] = {}
        for i, (t, p) in enumerate(zip(self.tokens.tolist(), self.parents.tolist())):
            out.setdefault(p, {}).setdefault(t, i)
        return out

    def held(self, continuation) -> list[int]:
        """The nodes of the longest root path whose tokens are the continuation's first ones."""
        children, node, path = self.children(), -1, []
        for token in continuation:
            node = children.get(node, {}).get(int(token), -2)
            if node == -2:
                break
            path.append(node)
        return path

    def walk(self, best) -> tuple[list[int], int]:
        """Greedy acceptance over a verify's rows: `best(r)` is the target's choice after row r
        (row 0: the root, row i + 1: node i). From the root, follow the child holding the target's
        choice while there is one. Returns the accepted nodes and the target's own next token."""
        children, path = self.children(), []
        token = best(0)
        while (node := children.get(path[-1] if path else -1, {}).get(token)) is not None:
            path.append(node)
            token = best(node + 1)
        return path, token

    def within(self, depth: int, budget: int | None = None) -> "Tree":
        """The tree of its first `budget` nodes (a smaller DDTree budget: the same best-first
        order) no deeper than `depth` (a draft cut to that length)."""
        n = len(self) if budget is None else min(budget, len(self))
        keep = np.flatnonzero(self.depths[:n] <= depth)
        if len(keep) == len(self):
            return self
        index = np.full(len(self) + 1, -1, dtype=np.int32)  # old node -> new (index 0 for the root's -1)
        index[keep + 1] = np.arange(len(keep), dtype=np.int32)
        return Tree(self.tokens[keep], index[self.parents[keep] + 1], self.depths[keep],
                    int(min(self.n_chain, depth, n)))

    def accepted(self, continuation) -> int:
        """Greedy: how many tokens of the target's `continuation` (its argmax after the committed
        text, then after each of those) the tree holds as a root path: the accepted draft length."""
        return len(self.held(continuation))


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
    """Each row's k likeliest columns, best first (a tie's lowest column first, as argmax), and
    their log-probabilities (log-softmax). k argmax passes over a copy: for the few candidates a
    tree takes, 4x faster than a partition of 150k-column rows (3 ms for 7 rows here)."""
    rows = np.asarray(logits, dtype=np.float32)
    k = min(k, rows.shape[1])
    work = rows.copy()
    r = np.arange(rows.shape[0])
    cols = np.empty((rows.shape[0], k), dtype=np.int32)
    picked = np.empty((rows.shape[0], k), dtype=np.float64)
    for j in range(k):
        c = work.argmax(axis=1)
        cols[:, j], picked[:, j] = c, work[r, c]
        work[r, c] = -np.inf
    top = picked[:, :1]
    log_z = top + np.log(np.exp(rows - top.astype(np.float32)).sum(axis=1, keepdims=True, dtype=np.float64))
    return cols, picked - log_z


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
