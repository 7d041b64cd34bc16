"""The exactness harness: every registered draft type (ggspec.speculative.types.registry.TYPES) against
llama.cpp's own loop (those llama.cpp has; ggspec's `suffix` is compared with its own oracle in
test_suffix.py) (`llama-speculative-simple --spec-type TYPE`, patch 0009's dump of every
draft call) and against plain greedy decoding.

`CASES` gives each type one case: the pair it drafts for (shipped tiny models, or the fixtures the
type needs: the MTP targets, the Gemma 4 drafter, the DSpark variant), a prompt, the tokens to
generate, the draft length and the type's options; `more` sweeps further runs of the draft
comparison (the lengths and options the type's own module swept before). For every type:
  (a) it has a case (a type registered without one fails here first);
  (b) its drafts equal llama.cpp's at every position both loops drafted from, model drafters with
      forced acceptance cycling 0..n_max on both sides (patch 0005: every accepted count occurs,
      so every way of keeping or dropping the drafter's state is compared), and the output is
      plain greedy output;
  (c) three sequences at once, leaving at different times, each give their plain greedy output;
  (d) a request in a reused slot (B after A) drafts exactly as B alone.
What only one type has (p-min cuts, chained MTP, DFlash injection modes, ties of ngram-cache, the
server's shared ngram-mod table, ...) stays in that type's module. Needs a `ggspec build --tools`
build.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest
from conftest import PROMPTS
from helpers.drafts import assert_drafts_equal, compare, drafts_of, forced_file, ggspec_drafts, greedy
from helpers.pairs import CPP_CTX, DFLASH, DRAFT, EAGLE3, MTP_CTX, MTP_N, MTP_PROMPT, STACK, TARGET

from ggspec.bench.native import run_cpp
from ggspec.runtime import ContextParams
from ggspec.speculative.engine import Engine
from ggspec.speculative.models import PairConfig
from ggspec.speculative.request import Request
from ggspec.speculative.types.draft_type import Options
from ggspec.speculative.types.ngram import NgramSimpleOptions
from ggspec.speculative.types.ngram_map import NgramMapOptions
from ggspec.speculative.types.ngram_mod import NgramModOptions
from ggspec.speculative.types.registry import TYPES
from ggspec.speculative.types.suffix import SuffixOptions

PROMPT = PROMPTS[0]  # "def fibonacci(n):": the model drafters' prompt
REPEAT = "for i in range(10):\n    print(i)\nfor i in range(10):\n    print(i)\n"
REPEAT_J = "for i in range(10):\n    print(i)\nfor j in range(10):\n    print(j)\n"
ADD_SUB = "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\n"
STACK_PUSH = "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n"


def _mtp(d: Path) -> tuple[Path, None]:
    from ggspec.catalogue.tiny import ensure_tiny_pair

    return ensure_tiny_pair(d, "hybrid-mtp").target, None


def _moe_mtp(d: Path) -> tuple[Path, None]:
    from helpers.fixtures.mtp_head import ensure_fitted

    from ggspec.catalogue.tiny import ensure_tiny_pair

    return ensure_fitted(d, ensure_tiny_pair(d, "hybrid-moe-mtp").target), None


def _gemma4(d: Path) -> tuple[Path, Path]:
    from helpers.fixtures.gemma4 import ensure_gemma4_pair

    pair = ensure_gemma4_pair(d)
    return pair.target, pair.drafter


def _dspark(d: Path) -> tuple[Path, Path]:
    from helpers.fixtures.variants import ensure_variant

    pair = ensure_variant(d, "dspark", "tiny-coder")
    return pair.target, pair.draft


# name -> (target, draft) made in the session's fixture directory
PAIRS: dict[str, Callable[[Path], tuple[Path, Path | None]]] = {
    "tiny-coder": lambda d: (TARGET, None),
    "tiny-coder+draft": lambda d: (TARGET, DRAFT),
    "tiny-coder+eagle3": lambda d: (TARGET, EAGLE3),
    "tiny-coder+dflash": lambda d: (TARGET, DFLASH),
    "hybrid-mtp": _mtp,  # qwen35 with one MTP block, its head as written (random)
    "hybrid-moe-mtp": _moe_mtp,  # qwen35moe (experts in every block, the MTP block's too), head fitted
    "gemma4": _gemma4,  # a gemma4 target and a gemma4-assistant drafter that reads its cache
    "dspark": _dspark,  # a DSpark draft built on tiny-coder's DFlash draft (Markov bias, confidence head)
}


@dataclass(frozen=True)
class Case:
    """One type's case (see the module docstring)."""

    pair: str  # a key of PAIRS
    prompt: str
    n: int  # tokens generated
    n_max: int  # the draft length (an n-gram type's own: its m-gram size)
    options: Options | None = None  # the type's own options (None: its defaults)
    forced: bool = False  # forced acceptance cycling 0..n_max on both sides
    full: bool = False  # every draft is n_max long (a model drafter at p-min 0)
    lengths: bool = False  # each draft as long as llama.cpp's, up to where its budget cuts them
    ctx: ContextParams = field(default_factory=lambda: CPP_CTX)
    other: str = PROMPTS[1]  # (d): the request before
    more: tuple[dict, ...] = ()  # (b): more runs, each the fields that differ from this one

    def runs(self) -> list[Case]:
        return [self] + [replace(self, more=(), **change) for change in self.more]


def _lengths(*ks: int) -> tuple[dict, ...]:
    return tuple({"n_max": k} for k in ks)


def _map_case() -> Case:
    """ngram-map-k and -k4v: llama.cpp's defaults (12, 48), short keys, and min_hits 2 for k4v."""
    return Case("tiny-coder", STACK, 160, 8, NgramMapOptions(3, 8, 1), lengths=True, other=STACK + "    def peek(self):\n",
                more=({"n_max": 48, "options": NgramMapOptions(12, 48, 1)},
                      {"prompt": REPEAT, "n": 200, "n_max": 5, "options": NgramMapOptions(2, 5, 1)},
                      {"prompt": ADD_SUB, "n": 200, "n_max": 6, "options": NgramMapOptions(3, 6, 2)}))


CASES: dict[str, Case] = {
    "ngram-simple": Case("tiny-coder", STACK, 160, 8, NgramSimpleOptions(3, 8), lengths=True,
                         other=STACK.replace("items", "things") * 2,
                         more=({"n_max": 48, "options": NgramSimpleOptions()},
                               {"prompt": ADD_SUB, "n": 200, "n_max": 6, "options": NgramSimpleOptions(3, 6)})),
    "ngram-map-k": _map_case(),
    "ngram-map-k4v": _map_case(),
    # the last run: low acceptance, so the five-in-a-row reset of the shared table runs on both sides
    "ngram-mod": Case("tiny-coder", STACK, 160, 8, NgramModOptions(4, 8, 2), lengths=True,
                      other=STACK.replace("items", "things") * 2,  # other n-grams, some the same
                      more=({"n": 200, "n_max": 16, "options": NgramModOptions(3, 16, 1)},
                            {"prompt": REPEAT, "n": 200, "n_max": 5, "options": NgramModOptions(2, 5, 1)},
                            {"prompt": ADD_SUB * 3, "n": 240, "n_max": 12, "options": NgramModOptions(8, 12, 4)})),
    # llama.cpp's fixed n_draft of 8; ties decide some drafts on STACK (test_ngram_cache.py)
    "ngram-cache": Case("tiny-coder", STACK, 160, 8, other=REPEAT_J,
                        more=({"prompt": REPEAT_J, "n": 200}, {"prompt": PROMPTS[1], "n": 120},
                              {"prompt": PROMPTS[19], "n": 120})),
    # forced: the cells kept from ggspec's own draft calls hold other tokens than the committed
    # ones half of the time
    "draft-simple": Case("tiny-coder+draft", PROMPT, 100, 4, forced=True, full=True, more=_lengths(1, 2, 3, 5, 6, 7)),
    # forced: the pairs of the committed rows and the deferred seed, for every accepted count
    "draft-eagle3": Case("tiny-coder+eagle3", PROMPT, 100, 4, forced=True, full=True, more=_lengths(1, 2, 3, 5, 6, 7)),
    # the head's catch-up over every committed row, on qwen35moe (its fitted head: (c) sees drafts
    # accepted), qwen35, and a Gemma 4 drafter's carried state after each count with every draft
    # step at id_last's position
    "draft-mtp": Case("hybrid-moe-mtp", MTP_PROMPT, MTP_N, 4, forced=True, full=True, ctx=MTP_CTX, other=PROMPTS[7],
                      more=_lengths(1, 2, 3, 5, 6, 7)
                      + tuple({"pair": pair, "n_max": k} for pair in ("hybrid-mtp", "gemma4") for k in range(1, 8))),
    # a block of 8 whatever is verified: the whole block, and 3 of it
    "draft-dflash": Case("tiny-coder+dflash", PROMPT, 100, 7, forced=True, full=True, more=_lengths(3)),
    "draft-dspark": Case("dspark", STACK_PUSH, 128, 7, forced=True, full=True),
    # ggspec's own (SuffixDecoding): its drafts' oracle is arctic-inference (test_suffix.py), so only
    # (c) and (d) here; (d) with the trie shared across requests off (that one is meant to carry over)
    "suffix": Case("tiny-coder", STACK, 160, 16, SuffixOptions(cache_tokens=0)),
}

# (b) compares with llama.cpp's loop: the types it has
RUNS = [(name, i) for name in TYPES if TYPES[name].llama_cpp
        for i in range(len(CASES[name].runs()) if name in CASES else 1)]


def _run_id(run: tuple[str, int]) -> str:
    name, i = run
    if name not in CASES:
        return name
    case = CASES[name].runs()[i]
    return f"{name}-{case.pair}-n_max{case.n_max}" + (f"-{i}" if i and case.pair == CASES[name].pair else "")


@pytest.fixture(scope="module")
def pairs(fixture_dir, build_info) -> Callable[[str], tuple[Path, Path | None]]:
    made: dict[str, tuple[Path, Path | None]] = {}

    def get(name: str) -> tuple[Path, Path | None]:
        if name not in made:
            made[name] = PAIRS[name](fixture_dir)
        return made[name]
    return get


def _case(name: str) -> Case:
    assert name in CASES, f"{name} is registered but has no exactness case: add one to CASES"
    return CASES[name]


def _config(name: str, case: Case, target: Path, draft: Path | None, **kw) -> PairConfig:
    """The type alone, with the case's options; an n-gram type drafts up to its own length. A fixed
    length (not the adaptive default): llama.cpp's loop verifies every draft it makes."""
    own = TYPES[name].traits.cheap
    return PairConfig(target=target, draft=draft, spec_type=name, n_max=None if own else case.n_max, ctx=case.ctx,
                      adaptive=False, spec_options={name: case.options} if case.options is not None else {}, **kw)


def test_every_registered_type_has_a_case():
    assert set(CASES) == set(TYPES), "registered types without a case: " + ", ".join(sorted(set(TYPES) - set(CASES)))
    assert all(case.pair in PAIRS for case in CASES.values() for case in case.runs())


@pytest.mark.parametrize("run", RUNS, ids=_run_id)
def test_drafts_equal_llama_cpps_at_every_position(run, pairs, tool, tmp_path):
    name, i = run
    case = _case(name).runs()[i]
    target, draft = pairs(case.pair)
    with Engine.open(_config(name, case, target, draft)) as eng:
        assert eng.plan.spec_type == name and eng.n_max == case.n_max
        mine, ref = ggspec_drafts(eng, case.prompt, case.n_max, case.forced, n=case.n)  # (output: plain greedy)
    forced = forced_file(tmp_path / "forced.txt", ref, case.n_max) if case.forced else None
    res = run_cpp(tool, target, draft, case.prompt, case.n, case.n_max, defer=False, spec_type=name,
                  options={name: case.options} if case.options is not None else None, forced=forced,
                  dump_drafts=True)
    common = compare(mine, res.drafts, res.draft_anchors)
    assert common >= len(mine) - 2, (common, len(mine))  # all but the budget's last steps
    assert common >= 3 and any(d for _, _, d in mine)
    print(f"{name}: {common} of {len(mine)} drafts compared")
    if case.full:  # p-min 0: full drafts
        assert all(len(d) == case.n_max for _, _, d in mine), sorted({len(d) for _, _, d in mine})
    if case.lengths:
        n_prompt = len(ref) - (case.n + case.n_max + 2)
        assert_drafts_equal(mine, res, n_prompt + case.n - case.n_max - 2)


@pytest.mark.parametrize("name", list(TYPES))
def test_three_sequences_at_once_are_each_plain_greedy(name, pairs):
    """Each sequence's output is its plain greedy output; they leave at different times."""
    case = _case(name)
    target, draft = pairs(case.pair)
    texts = [case.prompt] + [p for p in PROMPTS if p != case.prompt][:2]
    n = 80
    with Engine.open(_config(name, case, target, draft, parallel=3)) as eng:
        prompts = [eng.target_model.tokenize(t) for t in texts]
        plain = [greedy(eng, p, n) for p in prompts]
        eng.reset()
        seqs = [eng.add(Request(p, n - 10 * i, ignore_eos=True)) for i, p in enumerate(prompts)]
        list(eng.run())
    assert [s.tokens for s in seqs] == [p[:n - 10 * i] for i, p in enumerate(plain)]
    assert sum(s.stats.drafted for s in seqs) > 0 and sum(s.stats.accepted for s in seqs) > 0


@pytest.mark.parametrize("name", list(TYPES))
def test_a_request_in_a_reused_slot_drafts_as_it_would_alone(name, pairs):
    """B after A in the same slot drafts exactly as B alone: nothing a drafter keeps of a request
    (an n-gram map or table, a draft model's cells, a head's carried state) reaches the next."""
    case = _case(name)
    target, draft = pairs(case.pair)
    with Engine.open(_config(name, case, target, draft)) as eng:
        alone = drafts_of(eng, case.prompt)
        drafts_of(eng, case.other)
        after = drafts_of(eng, case.prompt)
    assert after == alone and any(d for _, _, d in alone)
