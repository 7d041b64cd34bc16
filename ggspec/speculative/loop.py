"""The speculative loop: a generator of committed tokens with per-step statistics.

Each step is one transaction on the target:
  propose  the proposer drafts d1..dn after id_last (at position P);
  verify   one target decode of [id_last, d1..dn] with logits on every row;
  accept   the longest prefix of drafts matching the target's argmax, plus its bonus token;
  commit   drop the rejected tail from the target cache (seq_rm) and hand the committed rows'
           features [id_last, d1..da] to the proposer for its next draft.
`generate_greedy` is the plain baseline (`--no-spec`), yielding the same kind of steps.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import numpy as np

from ggspec.errors import InputError
from ggspec.runtime import Batch, Context
from ggspec.speculative.accept import accept_greedy
from ggspec.speculative.stats import Step, top2_margin


def check_prompt(prompt: np.ndarray, n_ctx: int, n_draft: int) -> None:
    """Reject prompts llama.cpp cannot take, before anything is decoded."""
    if len(prompt) == 0:
        raise InputError("the prompt is empty (it tokenized to zero tokens)")
    need = len(prompt) + 1 + n_draft  # prompt, then one verify block [id_last, d1..dn]
    if need > n_ctx:
        room = "a draft block" if n_draft else "one generated token"
        raise InputError(
            f"the prompt has {len(prompt)} tokens: with {room} it needs {need} positions, "
            f"but the context holds {n_ctx} (raise -c or shorten the prompt)"
        )


def _prefill(target: Context, batch: Batch, prompt: np.ndarray, capture=None) -> tuple[int, float]:
    """Decode the prompt in n_batch chunks; returns (first generated token, seconds).
    `capture(n_rows, pos0)` is called after each chunk, while its features are readable."""
    t0 = time.perf_counter()
    n = len(prompt)
    for off in range(0, n, target.n_batch):
        chunk = prompt[off:off + target.n_batch]
        last = off + len(chunk) == n
        batch.clear().add_tokens(chunk, off, outputs="last" if last else "none")
        target.decode(batch)
        if capture is not None:
            capture(len(chunk), off)
    first = int(target.argmax_rows()[-1])
    return first, time.perf_counter() - t0


def _inject_now(proposer) -> Callable[[int, int], None]:
    """Prompt rows have nothing to verify: they are committed, so they reach the draft during
    the prefill whatever the injection mode (deferring them would save nothing and only move the
    prompt's injection into the first decode step); and each chunk's features must be injected
    before the next chunk's decode overwrites them."""
    def capture(n_rows: int, pos0: int) -> None:
        proposer.capture(n_rows, pos0)
        proposer.flush()
    return capture


def _margins(target: Context, record: bool) -> list[float]:
    return [top2_margin(target.logits_view()[-1])] if record else []


def _replay(target: Context, batch: Batch, committed: np.ndarray, pos: int) -> float:
    """Rebuild a recurrent state no plane kept: restore the input plane (the state before this
    verify batch) and decode the committed tokens again. No outputs are needed: the bonus token
    is already known, and the draft gets these rows' features from the verify batch."""
    t = time.perf_counter()
    target.truncate(pos)
    batch.clear().add_tokens(committed, pos, outputs="none")
    target.decode(batch)
    return time.perf_counter() - t


def _finish(tokens: list[int], budget: int, is_eog) -> tuple[list[int], bool]:
    """Cut a step's tokens at the budget or after an end-of-generation token."""
    out = []
    for t in tokens[:budget]:
        out.append(t)
        if is_eog(t):
            return out, True
    return out, len(out) >= budget


def generate_greedy(target: Context, prompt: np.ndarray, n_predict: int,
                    record_margins: bool = False, ignore_eos: bool = False) -> Iterator[Step]:
    """Plain greedy decoding, one target decode per token. With `record_margins`, each step
    carries the target's top-2 logit margin of its token (the losslessness gate's tie check)."""
    check_prompt(prompt, target.n_ctx, 0)
    is_eog = (lambda _t: False) if ignore_eos else target.model.is_eog
    with Batch(target) as batch:
        t0 = time.perf_counter()
        token, t_prompt = _prefill(target, batch, prompt)
        tokens, done = _finish([token], n_predict, is_eog)
        yield Step(tokens, "prefill", n_prompt=len(prompt), t_verify=t_prompt,
                   t_total=time.perf_counter() - t0, margins=_margins(target, record_margins))
        pos, left = len(prompt), n_predict - 1
        while not done and pos < target.n_ctx:
            t0 = time.perf_counter()
            batch.clear().add_tokens([token], pos, outputs="last")
            target.decode(batch)
            token = int(target.argmax_rows()[-1])
            t_verify = time.perf_counter() - t0
            tokens, done = _finish([token], left, is_eog)
            pos, left = pos + 1, left - 1
            yield Step(tokens, "plain", t_verify=t_verify, t_total=time.perf_counter() - t0,
                       margins=_margins(target, record_margins))


def generate_spec(target: Context, proposer, prompt: np.ndarray, n_predict: int,
                  n_max: int, ignore_eos: bool = False,
                  on_accept: Callable[[int, int], None] | None = None) -> Iterator[Step]:
    """Speculative greedy decoding; output equals `generate_greedy`'s token for token.

    `proposer` provides `capture(n_rows, pos0)`, `accept(n_committed, pos0)`, `flush() -> rows`
    and `propose(id_last, pos, n) -> tokens` (see DFlashProposer). `on_accept(accepted, drafted)` is
    told every step's outcome (the `auto` plane layout learns from it).
    """
    if n_max < 1:
        raise InputError("--spec-draft-n-max must be at least 1")
    check_prompt(prompt, target.n_ctx, n_max)
    is_eog = (lambda _t: False) if ignore_eos else target.model.is_eog
    with Batch(target) as batch:
        t0 = time.perf_counter()
        id_last, t_prompt = _prefill(target, batch, prompt, capture=_inject_now(proposer))
        tokens, done = _finish([id_last], n_predict, is_eog)
        yield Step(tokens, "prefill", n_prompt=len(prompt), t_verify=t_prompt,
                   t_total=time.perf_counter() - t0)
        pos, left = len(prompt), n_predict - 1  # pos: position of id_last, not yet decoded
        while not done:
            # never draft past the token budget or the end of the context
            n = min(n_max, left - 1, target.n_ctx - pos - 1)
            if n < 0:
                break
            step = Step([], "spec" if n > 0 else "plain", drafted=n)
            t_start = time.perf_counter()

            t = time.perf_counter()
            proposer.flush()
            step.t_inject = time.perf_counter() - t

            t = time.perf_counter()
            draft = proposer.propose(id_last, pos, n) if n > 0 else np.empty(0, dtype=np.int32)
            step.t_draft = time.perf_counter() - t

            t = time.perf_counter()
            block = np.empty(n + 1, dtype=np.int32)
            block[0] = id_last
            block[1:] = draft
            batch.clear().add_tokens(block, pos, outputs="all")
            target.decode(batch)
            argmax = target.argmax_rows()
            step.t_verify = time.perf_counter() - t

            a = accept_greedy(draft, argmax)
            step.accepted = a
            t = time.perf_counter()
            proposer.capture(n + 1, pos)  # the verify rows' features (flushed before the next target decode)
            proposer.accept(a + 1, pos)  # committed: [id_last, d1..da]
            step.t_inject += time.perf_counter() - t
            if a < n:
                if target.can_truncate(pos + a + 1):
                    target.truncate(pos + a + 1)  # roll back the rejected drafts d(a+1)..dn
                else:
                    t = time.perf_counter()
                    proposer.flush()  # the replay decode overwrites the captured features
                    step.t_inject += time.perf_counter() - t
                    step.t_replay = _replay(target, batch, block[:a + 1], pos)
                    step.replayed = True
            if on_accept is not None and n > 0:
                on_accept(a, n)
            committed = [int(x) for x in draft[:a]] + [int(argmax[a])]

            step.tokens, done = _finish(committed, left, is_eog)
            id_last = committed[-1]
            pos += a + 1
            left -= len(step.tokens)
            step.t_total = time.perf_counter() - t_start
            yield step
