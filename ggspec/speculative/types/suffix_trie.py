"""SuffixDecoding's suffix trie: every substring of at most `depth` tokens of the sequences it
holds, each counted by its occurrences, drafting by walking from the context's match.

The algorithm is SuffixDecoding's (Oliaro et al., NeurIPS 2025; vLLM's `suffix` method; the
reference implementation is arctic-inference's C++ `SuffixTree`), written here from its rules:

- Appending a token to a sequence extends each of its last `depth` suffixes by it: the node of
  each grows a child for the token (count 1) or that child's count grows by one.
- A node's children are kept in order of decreasing count, and equal counts in the order the
  reference keeps them (its drafts follow the first child, so this order decides ties): a new
  child goes last; a child whose count grows moves to the front of its new equal-count group if
  it led its old group, else to the back of the new group; a child whose count falls moves behind
  the children that still have its old count. `_raise` and `_lower` do exactly that.
- A chain that only one suffix passes through (count 1) is one leaf holding a slice of its
  sequence, as the reference's path compression does: the trie holds a node per repeated
  substring and a leaf per suffix, not a node per token of every suffix.
- A draft (`speculate`): for each match length m = 1 .. len(context) - 1 whose last m tokens
  are in the trie, walk from there to the first child at each step, each token's probability the
  running product of count(child) / count(node), until it falls below `min_prob` or the draft
  holds min(max_tokens, m * factor + offset) tokens; the draft with the largest sum of
  probabilities wins, a later (longer) match on ties (a match whose one occurrence ends its
  sequence, as the context's own tail does in its own trie, drafts nothing, nor does any longer
  one: the walk stops there, which keeps drafting on text that does not repeat in microseconds). `tree=True` grows a tree instead: the
  likeliest open node next, as the reference's priority queue (libstdc++'s heap) pops them.
  Probabilities and scores are float32 as the reference computes them, so drafts are equal
  to its drafts, ties included (tests/test_suffix.py compares them).
"""

from __future__ import annotations

import struct
from bisect import bisect_left, bisect_right
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field

_F32 = struct.Struct("f")


def f32(x: float) -> float:
    """x rounded to float32 (the reference's arithmetic: one float op, then rounding, is exact)."""
    return _F32.unpack(_F32.pack(x))[0]


def _neg_count(node: "_Node") -> int:
    return -node.count


class _Node:
    """A substring of the trie: an inner node (`kids` a dict; one token), or a leaf (`kids` None):
    a chain only one suffix passes through, the slice seq[idx : idx + length] of its sequence."""

    __slots__ = ("count", "token", "kids", "order", "seq", "idx", "length")

    def __init__(self, count: int, token: int, seq: list[int] | None = None, idx: int = 0, length: int = 1) -> None:
        self.count = count
        self.token = token  # its first token
        self.kids: dict[int, _Node] | None = None if seq is not None else {}
        self.order: list[_Node] | None = None if seq is not None else []  # kids by decreasing count (module)
        self.seq, self.idx, self.length = seq, idx, length

    def token_at(self, i: int) -> int:
        return self.token if i == 0 else self.seq[self.idx + i]


def _raise(order: list[_Node], node: _Node) -> None:
    """node.count + 1, and its place among its siblings as the reference moves it."""
    c = node.count
    i = order.index(node)
    if i == 0 or order[i - 1].count > c + 1:  # it stays where it is
        node.count = c + 1
        return
    j = bisect_left(order, -order[i - 1].count, hi=i, key=_neg_count)  # the head of the group before it
    del order[i]
    node.count = c + 1
    order.insert(j, node)


def _lower(order: list[_Node], node: _Node) -> None:
    """node.count - 1, and its place among its siblings as the reference moves it."""
    c = node.count
    i = order.index(node)
    if i + 1 < len(order) and order[i + 1].count == c:  # behind the last sibling that keeps count c
        del order[i]
        order.insert(bisect_right(order, -c, lo=i, key=_neg_count), node)
    node.count = c - 1


@dataclass
class SuffixDraft:
    """A draft: its tokens, each one's parent index (-1: the root; a chain's is i - 1), each one's
    estimated probability, their float32 sum, and the length of the context match it came from."""

    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    probs: list[float] = field(default_factory=list)
    score: float = 0.0
    match_len: int = 0
    count: int = 0  # occurrences of the matched context (not the reference's: the confidence's)
    own: bool = False  # it came from the sequence's own trie (SuffixCache)


class SuffixTrie:
    """The suffix trie of several sequences (by key), each suffix cut at `depth` tokens."""

    def __init__(self, depth: int) -> None:
        self.depth = depth
        self.root = _Node(0, -1)
        self.seqs: dict[Hashable, list[int]] = {}
        self._active: dict[Hashable, list[_Node]] = {}  # each sequence's last `depth` suffixes' nodes
        self.inner = self.leaves = 0  # nodes held (the memory report)

    def extend(self, key: Hashable, tokens: Iterable[int]) -> None:
        """Append tokens to a sequence (a new key starts one)."""
        seq = self.seqs.setdefault(key, [])
        active = self._active.setdefault(key, [])
        root, depth = self.root, self.depth
        for token in tokens:
            token = int(token)
            active.append(root)
            root.count += 1
            if len(active) > depth:
                del active[0]
            seq.append(token)
            end = len(seq)
            for i, node in enumerate(active):
                active[i] = self._extend(node, seq, end, token)

    def _extend(self, node: _Node, seq: list[int], end: int, token: int) -> _Node:
        """The node of one suffix (ending at `node`) once `token`, seq[end - 1], is appended."""
        if node.kids is None:  # a leaf: the suffix is the only one through it and ends where it ends
            node.length += 1
            return node
        child = node.kids.get(token)
        if child is None:
            leaf = _Node(1, token, seq, end - 1, 1)
            node.kids[token] = leaf
            node.order.append(leaf)
            self.leaves += 1
            return leaf
        if child.kids is None:  # a leaf's first token now holds two suffixes: an inner node
            if child.length == 1:
                child.kids, child.order, child.seq = {}, [], None
                self.leaves -= 1
            else:
                split = _Node(child.count, token)
                node.kids[token] = split
                node.order[node.order.index(child)] = split
                child.idx, child.length = child.idx + 1, child.length - 1  # (the leaf, still its suffix's node)
                child.token = child.seq[child.idx]
                split.kids[child.token] = child
                split.order.append(child)
                child = split
            self.inner += 1
        _raise(node.order, child)
        return child

    def remove(self, key: Hashable) -> None:
        """Drop a sequence: each of its suffixes leaves the counts (and the nodes it alone held)."""
        seq = self.seqs.pop(key, None)
        self._active.pop(key, None)
        if seq is None:
            return
        for start in range(len(seq)):
            node = self.root
            node.count -= 1
            idx = start
            while idx < len(seq) and node.kids is not None:
                child = node.kids.get(seq[idx])
                if child is None:
                    break
                if child.count > 1:
                    _lower(node.order, child)
                else:  # this suffix alone passes through it: it goes, with what is below it
                    del node.kids[child.token]
                    node.order.remove(child)
                    self._forget(child)
                    break
                idx += 1
                node = child

    def _forget(self, node: _Node) -> None:
        stack = [node]
        while stack:
            n = stack.pop()
            if n.kids is None:
                self.leaves -= 1
            else:
                self.inner -= 1
                stack.extend(n.order)

    def _match(self, context: list[int], start: int) -> tuple[_Node, int] | None:
        """The node where context[start:] ends, and how many of its tokens it used (None: no match)."""
        node, used = self.root, 0
        for t in context[start:]:
            if node.kids is not None:
                node = node.kids.get(t)
                if node is None:
                    return None
                used = 1
            elif used < node.length and node.seq[node.idx + used] == t:
                used += 1
            else:
                return None
        return node, used

    def speculate(self, context: list[int], max_tokens: int, factor: float = 1.0, offset: float = 0.0,
                  min_prob: float = 0.1, tree: bool = False) -> SuffixDraft:
        """The best draft after `context` (module docstring)."""
        best = SuffixDraft()
        factor, offset, min_prob = f32(factor), f32(offset), f32(min_prob)
        caps = [max(0, min(max_tokens, int(f32(f32(m * factor) + offset) + 1e-6))) for m in range(len(context))]
        # the most any longer match can score: its tokens, at most its cap and what the depth leaves
        later = [0] * (len(context) + 1)
        for m in range(len(context) - 1, 0, -1):
            later[m - 1] = max(later[m], min(caps[m], self.depth - m))
        for m in range(1, len(context)):
            if best.score > later[m - 1]:  # no longer match can win (nor tie): the rest is not walked
                break
            at = self._match(context, len(context) - m)
            if at is None:
                break
            node, used = at
            if node.kids is None and used == node.length and node.idx + used == len(node.seq):
                # its one occurrence ends its sequence: no draft, nor from any longer match
                if best.score == 0.0:
                    best = SuffixDraft(match_len=_longest_tail(context, node.seq, m, self.depth))
                break
            draft = (_tree if tree else _path)(node, used, caps[m], min_prob)
            if draft.score >= best.score:
                best = draft
                best.match_len, best.count = m, node.count
        return best


def _longest_tail(context: list[int], seq: list[int], m: int, depth: int) -> int:
    """The longest match (< len(context), <= depth) of the context's end with seq's end, at least m."""
    while m + 1 < len(context) and m + 1 <= min(len(seq), depth) and seq[-m - 1] == context[-m - 1]:
        m += 1
    return m


def _path(node: _Node, used: int, cap: int, min_prob: float) -> SuffixDraft:
    """A chain: the first child at every step."""
    d = SuffixDraft()
    prob, score = 1.0, 0.0
    while len(d.tokens) < cap and prob >= min_prob:
        if used < node.length:
            d.parents.append(len(d.tokens) - 1)
            d.tokens.append(node.token_at(used))
            d.probs.append(prob)
            score = f32(score + prob)
            used += 1
        elif node.order:
            child = node.order[0]
            prob = f32(prob * f32(child.count / node.count))
            node, used = child, 0
        else:
            break
    d.score = score
    return d


def _tree(node: _Node, used: int, cap: int, min_prob: float) -> SuffixDraft:
    """A tree: the likeliest open node next (the reference's priority queue, popped in its order)."""
    d = SuffixDraft()
    score = 0.0
    heap = [(1.0, *_onward(node, used), -1)]
    while len(d.tokens) < cap and heap:
        prob, nd, u, parent = _heap_pop(heap)
        if u < nd.length:
            d.tokens.append(nd.token_at(u))
            d.parents.append(parent)
            d.probs.append(prob)
            score = f32(score + prob)
            _heap_push(heap, (prob, *_onward(nd, u + 1), len(d.tokens) - 1))
            continue
        for child in nd.order or ():
            p = f32(f32(prob * child.count) / nd.count)
            if p < min_prob:
                break
            _heap_push(heap, (p, child, 0, parent))
    d.score = score
    return d


def _onward(node: _Node, used: int) -> tuple[_Node, int]:
    """Where a walk goes on from: past a node's end into its only child when that child holds all
    its count (one node of the reference's compressed trie: no step of probability, no pop)."""
    while used >= node.length and node.order and node.order[0].count == node.count:
        node, used = node.order[0], 0
    return node, used


# std::priority_queue<..., less by probability> as libstdc++ keeps it: equal probabilities pop in
# the order its heap algorithms leave them, which decides the tree's ties

def _sift_up(heap: list, hole: int, value: tuple) -> None:
    while hole > 0:
        parent = (hole - 1) // 2
        if not heap[parent][0] < value[0]:
            break
        heap[hole] = heap[parent]
        hole = parent
    heap[hole] = value


def _heap_push(heap: list, value: tuple) -> None:
    heap.append(value)
    _sift_up(heap, len(heap) - 1, value)


def _heap_pop(heap: list) -> tuple:
    top, value = heap[0], heap.pop()
    n = len(heap)
    if n == 0:
        return top
    hole = child = 0
    while child < (n - 1) // 2:
        child = 2 * (child + 1)
        if heap[child][0] < heap[child - 1][0]:
            child -= 1
        heap[hole] = heap[child]
        hole = child
    if n % 2 == 0 and child == (n - 2) // 2:
        child = 2 * (child + 1)
        heap[hole] = heap[child - 1]
        hole = child - 1
    _sift_up(heap, hole, value)
    return top
