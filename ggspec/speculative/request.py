"""One generation request, from the edge (a command line, a server body) to its engine sequence.

A `Request` is built once where the request arrives (`ggspec run`'s prompts, bench's, a server
body), checked once on its own (`check`) and against the engine that takes it
(`Engine.check`), and handed whole to `Engine.add`; the sequence keeps it (`Sequence.request`).
A new per-request option is a field here, its check here, and the line that reads it where it
acts.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ggspec.errors import InputError
from ggspec.runtime.grammar import GrammarSpec
from ggspec.speculative.proposer import Draft
from ggspec.speculative.sampling import SamplerSettings


@dataclass(frozen=True)
class DraftLimits:
    """One sequence's own speculation within its engine's (a server request's `speculative.*`):
    drafts of at most n_max tokens (0: it decodes plainly) and none shorter than n_min (a shorter
    draft is not verified, as llama.cpp's --spec-draft-n-min; the engine's own n_min still applies
    where its drafter has one); `p_min`, the confidence cut-off of its drafts (None: the engine's);
    `types`, the speculative types that may draft for it (None: the engine's own; a server also
    holds the n-gram types for the requests that name them: Engine.request_types)."""

    n_max: int
    n_min: int = 0
    p_min: float | None = None
    types: tuple[str, ...] | None = None

    def cut(self, draft: Draft) -> Draft:
        draft = draft.head(self.n_max)
        return draft if len(draft) >= self.n_min else Draft.empty()

    def check(self) -> None:
        """What is wrong whatever the engine is (Engine.check_limits checks the rest)."""
        if self.p_min is not None and not 0.0 <= self.p_min <= 1.0:
            raise InputError(f"a sequence's confidence cut-off must be within 0..1 (got {self.p_min})", field="p_min")
        if not 0 <= self.n_min <= max(self.n_max, 0):
            raise InputError(f"a sequence's shortest draft must be within 0..{self.n_max} (its n_max; got "
                             f"{self.n_min})", field="n_min")


@dataclass(frozen=True)
class Request:
    """One prompt to continue: its tokens, its budget, how its tokens are chosen and what it asks
    back. Defaults are the engine's (None) or llama.cpp's."""

    prompt: object  # token ids (a list or an int32 array; kept as an int32 array)
    n_predict: int  # tokens to generate at most (fewer at an end-of-generation token or a full slot)
    tag: object = None  # the caller's label, handed back on its sequence (a prompt index, a server job)
    # its random draws when sampling (None: the settings' seed; llama.cpp's default seed: a random one)
    seed: int | None = None
    sampling: SamplerSettings | None = None  # how its tokens are chosen (None: the engine's settings)
    ignore_eos: bool = False  # an end-of-generation token does not end it
    speculate: bool = True  # False: plain decoding (the baseline) on a speculative engine
    record_margins: bool = False  # keep the target's top-2 margin of each plain step (the lossless oracle)
    limits: DraftLimits | None = None  # its own draft lengths within the engine's (None: the engine's)
    # GBNF its tokens must follow: each one is the best the grammar allows, drafts are cut where it
    # stops allowing them, sampled tokens follow the distribution it leaves (llama.cpp's grammar sampler)
    grammar: str | GrammarSpec | None = None
    n_probs: int = 0  # each committed token's probability and the n likeliest tokens of its row (Step.probs)
    # False: its whole prompt is decoded even where a slot's cells hold its beginning (llama-server's
    # cache_prompt: a cached prompt's last token is decoded alone, and llama.cpp's arithmetic depends
    # on the batch, so the text can differ from an uncached run's)
    cached: bool = True
    # llama-server's t_max_predict_ms: once a line has ended, generation stops when this many ms
    # have passed since its first token (0 or less: no limit)
    t_max_predict_ms: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "prompt", np.ascontiguousarray(self.prompt, dtype=np.int32))

    def check(self) -> None:
        """What is wrong with the request whatever engine takes it (Engine.check: the rest, its
        draft limits included)."""
        if self.n_predict < 1:
            raise InputError(f"the token budget must be at least 1 (got {self.n_predict})", field="n_predict")
        if self.n_probs < 0:
            raise InputError(f"n_probs must be at least 0 (got {self.n_probs})", field="n_probs")
        if isinstance(self.t_max_predict_ms, bool) or not isinstance(self.t_max_predict_ms, int):
            raise InputError(f"t_max_predict_ms must be a whole number of milliseconds (got {self.t_max_predict_ms!r})",
                             field="t_max_predict_ms")
        if self.sampling is not None:
            self.sampling.validate()
