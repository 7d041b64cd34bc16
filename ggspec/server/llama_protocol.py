"""llama-server's own request bodies and answers: /completion, /tokenize, /detokenize,
/apply-template, /props and /slots, in the shapes of the pinned llama.cpp's tools/server
(server-task.cpp, server-context.cpp). Where ggspec knows more (its speculative settings and
figures) it adds fields; it never changes llama-server's.

Requests follow protocol.py's rules: strict types, unknown fields ignored, unimplemented
features accepted only at their no-op values.
"""

from __future__ import annotations

import math
from typing import Annotated, Literal

from pydantic import AliasChoices, Field

from ggspec.server.protocol import SEED_MAX, Body, ChatFields, Constrained, Generation, Penalties, Speculation
from ggspec.speculative.sampling import DEFAULT_SEED, SamplerSettings

Prompt = str | Annotated[list[Annotated[int, Field(ge=0)] | str], Field(min_length=1)]
STOP_TYPES = {"stop": "eos", "length": "limit"}  # a Done's reason -> llama-server's stop_type ("word": a stop string)


class CompletionRequest(Speculation, Constrained, Penalties, Generation):
    """POST /completion (and /completions): llama-server's native completion."""

    prompt: Prompt
    n_predict: Annotated[int, Field(ge=-1)] = Field(-1, validation_alias=AliasChoices(
        "n_predict", "max_tokens", "max_completion_tokens"))  # -1: until an end token or a full slot
    temperature: Annotated[float, Field(ge=0.0)] | None = None
    top_k: int | None = None
    top_p: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    min_p: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    seed: Annotated[int, Field(ge=-1, le=SEED_MAX + 1)] | None = None  # -1 (or 2^32 - 1): a random one
    stop: Annotated[list[str], Field(max_length=16)] | None = None
    stream: bool = False
    return_tokens: bool = False
    timings_per_token: bool = False
    n_probs: Annotated[int, Field(ge=0, le=100)] = 0
    n_cmpl: Literal[1] = Field(1, validation_alias=AliasChoices("n_cmpl", "n"))
    typical_p: Literal[1] = 1
    mirostat: Literal[0] = 0
    dry_multiplier: Literal[0] = 0
    xtc_probability: Literal[0] = 0

    @property
    def stops(self) -> list[str]:
        return list(self.stop or [])

    @property
    def limit(self) -> int | None:
        return None if self.n_predict < 0 else self.n_predict

    @property
    def request_seed(self) -> int | None:
        return None if self.seed is None else (DEFAULT_SEED if self.seed < 0 else self.seed)


class TokenizeRequest(Body):
    content: Prompt | None = None
    add_special: bool = False
    parse_special: bool = True
    with_pieces: bool = False


class DetokenizeRequest(Body):
    tokens: list[int] = Field(default_factory=list)


class ApplyTemplateRequest(ChatFields, Constrained):
    """llama-server's /apply-template: a chat request's rendering fields."""


def generation_settings(sampling: SamplerSettings, n_predict: int, stream: bool, ignore_eos: bool,
                        speculative: dict, n_probs: int = 0) -> dict:
    """task_params::to_json's fields that ggspec has (the sampler chain's no-op stages at their
    no-op values), and the request's speculative settings."""
    return {"seed": sampling.seed, "temperature": sampling.temp, "top_k": sampling.top_k, "top_p": sampling.top_p,
            "min_p": sampling.min_p, "typical_p": 1.0, "repeat_last_n": sampling.penalty_last_n,
            "repeat_penalty": sampling.penalty_repeat, "presence_penalty": sampling.penalty_present,
            "frequency_penalty": sampling.penalty_freq, "mirostat": 0, "max_tokens": n_predict, "n_predict": n_predict,
            "ignore_eos": ignore_eos, "stream": stream, "n_probs": n_probs,
            "samplers": ["penalties", "top_k", "top_p", "min_p", "temperature"],
            "logit_bias": [{"bias": b if math.isfinite(b) else None, "token": t} for t, b in sampling.logit_bias],
            **{f"speculative.{k}": v for k, v in speculative.items()}}


def completion_chunk(text: str, tokens: list[int], slot: int, n_predicted: int, n_prompt: int) -> dict:
    """One streamed piece (server_task_result_cmpl_partial::to_json_non_oaicompat)."""
    return {"index": 0, "content": text, "tokens": tokens, "stop": False, "id_slot": slot,
            "tokens_predicted": n_predicted, "tokens_evaluated": n_prompt}


def probs_json(token_bytes, probs) -> list[dict]:
    """TokenProbs as llama-server's completion_probabilities (probs_vector_to_json): each token's
    id, text, bytes and log-probability, and its row's likeliest tokens alike."""
    def entry(token: int, logprob: float) -> dict:
        data = token_bytes(token)
        return {"id": token, "token": _whole_utf8(data), "bytes": list(data), "logprob": logprob}

    return [{**entry(p.token, p.logprob), "top_logprobs": [entry(t, lp) for t, lp in p.top]} for p in probs]


def _whole_utf8(data: bytes) -> str:
    """The text of a token's bytes without an unfinished trailing character (llama-server's validate_utf8)."""
    for cut in range(len(data), max(len(data) - 4, -1), -1):
        try:
            return data[:cut].decode("utf-8")
        except UnicodeDecodeError:
            continue
    return data.decode("utf-8", "replace")
