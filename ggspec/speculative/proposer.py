"""What every proposer provides to the engine, and the plain data they exchange.

The engine runs one transaction per step for all active sequences together (see engine.py):
  flush     before every target decode (and before drafting) the proposer may need to move what
            it captured from the last target decode somewhere safe: the engine calls `flush()`
            in exactly one place, right before it calls llama.cpp on the target;
  propose   one call drafts for every sequence that speculates this step;
  observe   after each target decode the engine says which batch rows belong to which sequence;
  commit    after verification, of a sequence's verify span only its first rows stay (`other`:
            the draft verified was another proposer's; several.py), or, for a token tree, the
            rows of its accepted path (`rows`).
A proposer that needs no target features (n-gram) ignores observe/commit/flush. `Proposer` is
the base every proposer derives from: its methods do nothing, so a proposer writes only the calls
it needs (and `hold` / `reset` are always there to call).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ggspec.errors import LlamaError
from ggspec.speculative.sampling import Candidates
from ggspec.speculative.tree import Tree

if TYPE_CHECKING:
    from ggspec.speculative.sequence import Sequence


_EMPTY = np.empty(0, dtype=np.int32)


@dataclass
class Draft:
    """One sequence's proposal: up to n tokens that follow its last committed token."""

    tokens: np.ndarray  # (n,) int32, possibly shorter than asked (p-min truncation, no n-gram match)
    # the draft's distribution at each drafted position after the sampler transforms (n rows), for
    # rejection sampling; None means a point mass on each drafted token (n-gram, DFlash2 walk)
    probs: Candidates | None = None
    # a token tree to verify instead of the chain (tree.py): `tokens` are its top-1 chain
    tree: Tree | None = None
    # the drafter's own estimate of each drafted token's chance to be right, given the ones before
    # it (suffix: SuffixDecoding's count ratios); the adaptive rule starts from it where its own
    # counts of the sequence's drafts are thin; None: no estimate
    confidence: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.tokens)

    @staticmethod
    def empty() -> "Draft":
        return Draft(_EMPTY)

    def head(self, k: int) -> "Draft":
        """The first k tokens (with their distributions); a tree, no deeper than k."""
        if len(self) <= k:
            return self
        return Draft(self.tokens[:k], None if self.probs is None else self.probs[:k],
                     None if self.tree is None else self.tree.within(k),
                     None if self.confidence is None else self.confidence[:k])


@dataclass(slots=True)
class Span:
    """The rows of one target decode that belong to one sequence."""

    seq_id: int
    row0: int  # first row of the sequence in the decode's batch
    n_rows: int
    pos0: int  # position of that first row
    tokens: np.ndarray | None = None  # the rows' tokens (an MTP head pairs each with the row before)


class Proposer:
    """Drafts tokens for many sequences at once (see the module docstring for the call order)."""

    name: str = ""  # llama.cpp's speculative type name, e.g. "draft-dflash", "ngram-simple"
    max_draft: int | None = None  # the most tokens one draft can hold (a DFlash block - 1), None: no limit
    # `hold` keeps what observe() captured in host memory instead of handing it to the draft
    # (the adaptive length's k = 0 steps then cost no draft-context call); False: hold() is flush()
    holds: bool = False
    # `marginals` gives each drafted position's likeliest tokens, from which a token tree grows
    grows_trees: bool = False
    # with the prompt cache, positions before the end of a shared prefix whose target rows must be
    # decoded again (an EAGLE3 head's cell at P pairs P with the token after it: the pair at the
    # last shared position needs the target's features there)
    cache_lag: int = 0

    def begin(self, seq: Sequence, cached: int = 0) -> None:
        """A sequence joins; its prompt is decoded on the target next (observe() follows). The
        first `cached` positions of its slot are kept from the slot's previous sequence (the
        prompt cache): what the proposer kept of them (see release) stays, the rest goes."""

    def observe(self, spans: list[Span]) -> None:
        """The target's last decode computed these rows (readable until the next target decode)."""

    def commit(self, seq: Sequence, pos0: int, n_committed: int, other: bool = False,
               rows: list[int] | None = None) -> None:
        """Of the verify span observed at pos0 for this sequence, the first n_committed rows stay;
        with `rows` (a token tree's accepted path), the span's rows at those offsets hold the
        committed positions pos0, pos0 + 1, ... instead. `other`: the verified draft was another
        proposer's (several types at once): what it keeps of the rows is the same, but statistics
        of its own drafts must not count this one."""

    def flush(self) -> None:
        """Make what observe() captured survive the next target decode (the engine calls this)."""

    def hold(self) -> None:
        """As flush, in a step that drafts nothing (see `holds`)."""
        self.flush()

    def propose(self, seqs: list[Sequence], n: int) -> list[Draft]:
        """Draft up to n tokens after each sequence's last committed token, in one pass."""
        raise NotImplementedError

    def marginals(self, seqs: list[Sequence], n: int, k: int) -> list[tuple[np.ndarray, np.ndarray]]:
        """After propose(seqs, n): per sequence, each drafted position's k likeliest tokens, best
        first, and their log-probabilities ((n, k) arrays each; None: none kept for it; only
        where `grows_trees`)."""
        raise NotImplementedError

    def keep_candidates(self) -> None:
        """Trees will be grown from this proposer's drafts (marginals after a propose)."""

    def want_candidates(self, on: bool) -> None:
        """Whether the next propose's candidates will be read (a drafter that must keep them while
        drafting does so only then)."""

    def release(self, seq: Sequence, keep: int = 0) -> int:
        """A sequence left (finished or cancelled): forget it and free what it held beyond its
        first `keep` positions (the prompt cache). Returns how many leading positions it still
        holds (at most keep)."""
        return keep

    def reset(self) -> None:
        """Forget every sequence and whatever was learnt (Engine.reset)."""

    def memory(self) -> dict[str, int] | None:
        """What it keeps across requests, for the server's report (suffix: its global trie's
        outputs, tokens, nodes and bytes); None: nothing worth reporting."""
        return None

    def close(self) -> None:
        """Free owned llama.cpp objects."""


def verify_span(id_last: int, drafts: np.ndarray, width: int | None) -> np.ndarray:
    """A verify span [id_last, d1..dn], padded with id_last to `width` tokens when given."""
    span = np.empty(width or len(drafts) + 1, dtype=np.int32)
    span[0] = id_last
    span[1:len(drafts) + 1] = drafts
    span[len(drafts) + 1:] = id_last
    return span


def capture_rows(rows: dict, spans: list[Span], what: str, done: str, keep=lambda sp: sp.n_rows) -> None:
    """observe() of a proposer that reads the target's rows: note each sequence's rows of the last
    target decode, (first row, first position, keep(span)), until its flush uses them. Rows still
    noted from an earlier decode were overwritten unused: a flush was missed ("{what} of sequence N
    were never {done}")."""
    for sp in spans:
        if sp.seq_id in rows:
            raise LlamaError(f"{what} of sequence {sp.seq_id} were never {done} and the target has decoded again "
                             "since (flush before every target decode)")
        if sp.n_rows:
            rows[sp.seq_id] = (sp.row0, sp.pos0, keep(sp))


def row_runs(row0: int, pos0: int, n: int, path: list[int] | None) -> list[tuple[int, int, int]]:
    """The captured rows that hold a sequence's committed positions pos0..pos0 + n - 1, as runs
    of consecutive rows (first row, first position, count): one run, but for a token tree's path
    (`path`: the span's row offsets of those positions, commit's `rows`)."""
    if n <= 0:
        return []
    if path is None:
        return [(row0, pos0, n)]
    runs: list[tuple[int, int, int]] = []
    for i, off in enumerate(path[:n]):
        if runs and runs[-1][0] + runs[-1][2] == row0 + off:
            runs[-1] = (runs[-1][0], runs[-1][1], runs[-1][2] + 1)
        else:
            runs.append((row0 + off, pos0 + i, 1))
    return runs


def model_draft(tokens: list[int], dists: list[Candidates], n_min: int) -> Draft:
    """A model drafter's result for one sequence (draft-simple, draft-eagle3, draft-mtp): dropped
    when shorter than n_min (llama.cpp's rule); sampled drafts carry their rows' distributions."""
    if len(tokens) < n_min:
        return Draft(np.empty(0, dtype=np.int32))
    return Draft(np.asarray(tokens, dtype=np.int32), Candidates.stack(dists) if dists else None)
