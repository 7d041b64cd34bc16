"""The `suffix` draft type: SuffixDecoding (Snowflake; NeurIPS 2025; vLLM's `suffix` method),
drafting from suffix tries of the text, no draft model.

Two tries (suffix_trie.py) answer each draft, the better draft of the two wins (on a tie the
sequence's own):
- the sequence's own, over its prompt and what it has committed so far;
- a global one over the outputs of the engine's sequences, the running ones' as they grow:
  in `serve` it lives as long as the server (every request drafts from earlier answers), in
  `run -f` and `bench` across the prompts of one run (bench starts each repetition afresh, so
  a prompt never drafts from its own earlier output). It holds at most `cache_tokens` tokens of
  outputs, the oldest evicted first; 0 turns it off.
A draft is at most min(n_max, the asked length, the match length) tokens long; one that follows a
match shorter than `min_match` is dropped, and the first token's estimated probability, capped by
how long the match is (MATCH_SURVIVAL), reaches the adaptive length as the draft's confidence
(proposer.Draft.confidence), with which it decides how much of the draft to verify. What reaches the
output is only what the target itself computes, so another request's text cannot leak into an
answer; whether a draft was accepted, though, shows in timing: a server shared by tenants who
must not learn about each other's text turns the global trie off (`--spec-suffix-cache-tokens
0`). The draft equals arctic-inference's `SuffixDecodingCache.speculate` on the same streams
(tests/test_suffix.py, built from its source by `ggspec build --tools`).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from dataclasses import dataclass, replace
from itertools import count

import numpy as np

from ggspec.errors import InputError
from ggspec.speculative.proposer import Draft, Proposer
from ggspec.speculative.sequence import Sequence
from ggspec.speculative.types.draft_type import TEXT_TRAITS, DraftType, Options, option
from ggspec.speculative.types.ngram import split_history
from ggspec.speculative.types.suffix_trie import SuffixDraft, SuffixTrie

# the longest substring held: a draft and the match it follows fit in it together, so 32 lets a
# 16-token match draft 16 (vLLM's default is 24, arctic-inference's 64: each appended token costs
# a step per depth)
DEFAULT_DEPTH = 32
DEFAULT_N_MAX = 16  # tokens one draft holds at most
DEFAULT_CACHE_TOKENS = 1 << 17  # output tokens the global trie holds (a few tens of MB at most)
DEFAULT_P_MIN = 0.1  # vLLM's suffix_decoding_min_token_prob
NODE_BYTES, LEAF_BYTES = 400, 100  # what a trie's inner node and leaf take in Python, about
# how far a draft is right depends on how long a match it follows far more than the counts say (a
# single earlier occurrence gives every continuation probability 1): Gemma 3 270M on the stdlib
# prompt set, every position drafted from: the first drafted token was right after a match of
# 1-2 tokens 35 % of the time, 3-4: 61 %, 5-8: 83 %, 9-16: 98 %, 17+: 100 %. A draft's first
# token is given at most 1 - MATCH_SURVIVAL ** match as its confidence, and matches shorter than
# min_match draft nothing (on a CPU a verified row costs a third of a decode or more: a guess
# right a third of the time loses)
MATCH_SURVIVAL = 0.7
DEFAULT_MIN_MATCH = 4


class SuffixCache:
    """SuffixDecoding's cache: a trie per running sequence over its prompt and output, and a global
    trie over outputs (`cache_tokens` of them at most, oldest first out; `max_requests`, if set,
    bounds the outputs kept by count, as the reference's max_cached_requests)."""

    def __init__(self, depth: int = DEFAULT_DEPTH, cache_tokens: int = DEFAULT_CACHE_TOKENS,
                 max_requests: int | None = None) -> None:
        self.depth, self.cache_tokens, self.max_requests = depth, cache_tokens, max_requests
        self.shared = SuffixTrie(depth)
        self.own: dict[Hashable, SuffixTrie] = {}
        self._kept: dict[Hashable, int] = {}  # outputs in the global trie, oldest first: key -> tokens
        self._held = 0  # their tokens, together

    @property
    def enabled(self) -> bool:
        return self.cache_tokens > 0 and self.max_requests != 0

    def start(self, key: Hashable, prompt: Iterable[int]) -> None:
        """A request starts: its own trie holds its prompt; its output will go to the global one."""
        if key in self.own:
            raise ValueError(f"request {key!r} is already running")
        self.own[key] = trie = SuffixTrie(self.depth)
        trie.extend(key, prompt)
        if self.enabled:
            self.evict(key)
            self._kept[key] = 0
            self._bound(keep=key)

    def add(self, key: Hashable, tokens: list[int]) -> None:
        """Tokens a running request committed."""
        self.own[key].extend(key, tokens)
        if key in self._kept:
            self.shared.extend(key, tokens)
            self._kept[key] += len(tokens)
            self._held += len(tokens)
            self._bound(keep=key)

    def stop(self, key: Hashable) -> None:
        """A request ends: its own trie goes, its output stays in the global one."""
        del self.own[key]

    def evict(self, key: Hashable) -> None:
        held = self._kept.pop(key, None)
        if held is not None:
            self._held -= held
            self.shared.remove(key)

    def _bound(self, keep: Hashable) -> None:
        """Evict the oldest outputs (not `keep`'s) past the bounds."""
        while self._kept and (self._held > self.cache_tokens
                              or (self.max_requests is not None and len(self._kept) > self.max_requests)):
            oldest = next((k for k in self._kept if k != keep), None)
            if oldest is None:
                return
            self.evict(oldest)

    def speculate(self, key: Hashable, context: list[int], max_tokens: int, factor: float = 1.0,
                  offset: float = 0.0, min_prob: float = DEFAULT_P_MIN, tree: bool = False) -> SuffixDraft:
        """The better of the request's own trie's draft and the global trie's (ties: its own)."""
        context = context[-self.depth:]
        own = self.own[key].speculate(context, max_tokens, factor, offset, min_prob, tree)
        own.own = True
        if not self.enabled or not self._kept:
            return own
        other = self.shared.speculate(context, max_tokens, factor, offset, min_prob, tree)
        return own if own.score >= other.score else other

    def memory(self) -> dict[str, int]:
        """What the global trie holds: outputs, tokens, nodes and about how many bytes."""
        t = self.shared
        return {"outputs": len(self._kept), "tokens": self._held, "nodes": t.inner + t.leaves,
                "bytes": t.inner * NODE_BYTES + t.leaves * LEAF_BYTES}

    def clear(self) -> None:
        self.shared = SuffixTrie(self.depth)
        self.own.clear()
        self._kept.clear()
        self._held = 0


class SuffixProposer(Proposer):
    """Drafts chains from a SuffixCache: each sequence is one request of it, its committed tokens
    added as they come. Drafts are point masses and may be empty."""

    name = "suffix"

    def __init__(self, options: "SuffixOptions") -> None:
        self.options = options
        self.max_draft: int | None = options.n_max
        self.cache = SuffixCache(options.depth, options.cache_tokens)
        self._keys = count()
        self._running: dict[Sequence, tuple[int, int]] = {}  # seq -> (its request key, output tokens added)

    def begin(self, seq: Sequence, cached: int = 0) -> None:
        self.release(seq)
        key = next(self._keys)
        self.cache.start(key, seq.prompt.tolist())
        self._running[seq] = (key, 0)

    def _sync(self, seq: Sequence) -> int:
        """Its request key, once its committed output has reached the cache."""
        if seq not in self._running:
            self.begin(seq)
        key, added = self._running[seq]
        if len(seq.tokens) > added:
            self.cache.add(key, seq.tokens[added:])
            self._running[seq] = (key, len(seq.tokens))
        return key

    def propose(self, seqs: list[Sequence], n: int) -> list[Draft]:
        o, out = self.options, []
        for seq in seqs:
            if not seq.started:
                out.append(Draft.empty())
                continue
            key = self._sync(seq)
            hist, id_last = split_history(seq)  # (prompt and committed tokens, id_last last)
            context = hist[-self.cache.depth:] + ([] if id_last is None else [id_last])
            d = self.cache.speculate(key, context, min(n, o.n_max), o.factor, 0.0, o.p_min)
            if d.match_len < o.min_match:  # too short a match to trust (MATCH_SURVIVAL)
                out.append(Draft.empty())
                continue
            out.append(Draft(np.asarray(d.tokens, dtype=np.int32), confidence=_confidence(d)))
        return out

    def release(self, seq: Sequence, keep: int = 0) -> int:
        if seq in self._running:  # (what it committed after its last draft joins the global trie too)
            self.cache.stop(self._sync(seq))
            del self._running[seq]
        return keep

    def reset(self) -> None:
        self.cache.clear()
        self._running.clear()

    def memory(self) -> dict[str, int]:
        return self.cache.memory()


def _confidence(d: SuffixDraft) -> np.ndarray | None:
    """Each drafted token's estimated chance given the ones before it (the draft's probabilities
    are running products). In the sequence's own trie one occurrence of the matched context is
    the context itself, at the text's end, with nothing after it yet: the first token's estimate
    leaves it out (of two occurrences, one continues: an even chance by the counts, a sure one
    by the text)."""
    if not d.tokens:
        return None
    p = np.asarray(d.probs)
    conf = p / np.concatenate(([1.0], p[:-1]))
    if d.own and d.count > 1:
        conf[0] = min(1.0, conf[0] * d.count / (d.count - 1))
    conf[0] = min(conf[0], 1.0 - MATCH_SURVIVAL ** d.match_len)
    return conf


# --- the registry entry ----------------------------------------------------------------------------

@dataclass(frozen=True)
class SuffixOptions(Options):
    depth: int = option(DEFAULT_DEPTH, "suffix_depth", ("--spec-suffix-depth",),
                        "suffix: the longest substring the tries hold (and match).", high=256)
    n_max: int = option(DEFAULT_N_MAX, "suffix_n_max", ("--spec-suffix-n-max",),
                        "suffix: the most tokens one draft holds (then cut to --spec-draft-n-max).")
    cache_tokens: int = option(DEFAULT_CACHE_TOKENS, "suffix_cache_tokens", ("--spec-suffix-cache-tokens",),
                               "suffix: output tokens the trie shared across requests holds, oldest evicted "
                               "(0: none shared; acceptance timing is a side channel between tenants).",
                               low=0, high=1 << 24)
    p_min: float = option(DEFAULT_P_MIN, "suffix_p_min", ("--spec-suffix-p-min",),
                          "suffix: a draft stops where its estimated probability falls below this.")
    factor: float = option(1.0, "suffix_factor", ("--spec-suffix-factor",),
                           "suffix: a draft holds at most this many tokens per matched token.")
    min_match: int = option(DEFAULT_MIN_MATCH, "suffix_min_match", ("--spec-suffix-min-match",),
                            "suffix: a draft that follows a shorter match of the text is dropped (1: every draft, "
                            "as SuffixDecoding's).", high=256)

    def validate(self) -> None:
        super().validate()
        if not 0.0 <= self.p_min <= 1.0:
            raise InputError(f"the suffix draft's cut-off must be within 0..1 (got {self.p_min})", field="suffix_p_min")
        if not 0.0 < self.factor <= 64.0:
            raise InputError(f"the suffix draft's length factor must be within (0, 64] (got {self.factor})",
                             field="suffix_factor")

    def with_length(self, n_max: int) -> "SuffixOptions":
        return replace(self, n_max=n_max)


SUFFIX = DraftType(
    name="suffix", priority=5, traits=TEXT_TRAITS, options=SuffixOptions, llama_cpp=False,
    make=lambda b: SuffixProposer(b.options), own_n_max=lambda o: o.n_max)
TYPES = (SUFFIX,)
