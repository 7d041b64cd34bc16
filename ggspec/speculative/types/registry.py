"""The draft-type registry: llama.cpp's ten `--spec-type`s and ggspec's `suffix` (SuffixDecoding),
one entry each (draft_type.py).

Every entry lives at the end of its proposer's module; this module only collects them, in
llama.cpp's order of preference (common_speculative_init, the pinned common/speculative.cpp:
2616-2626: the n-gram types first, then the model drafters). Everything that depends on a type
(the plan, the proposer, the CLI's flags, the bench settings, llama.cpp's command lines, the
adaptive rule's cost shape) reads it from here: adding a type is its module, its import and
entry in `_MODULES`, and its tests.
"""

from __future__ import annotations

from typing import Any

from ggspec.errors import InputError
from ggspec.speculative.types import dflash, draft_model, eagle3, mtp, ngram, ngram_cache, ngram_map, ngram_mod, suffix
from ggspec.speculative.types.draft_type import DraftType, OptionField, Options

# the modules whose `TYPES` tuple holds their entries
_MODULES = (ngram, ngram_map, ngram_mod, ngram_cache, suffix, draft_model, eagle3, mtp, dflash)


def _collect() -> dict[str, DraftType]:
    entries = [t for m in _MODULES for t in m.TYPES]
    return {t.name: t for t in sorted(entries, key=lambda t: t.priority)}


TYPES: dict[str, DraftType] = _collect()
SPEC_TYPES: tuple[str, ...] = tuple(TYPES)  # in llama.cpp's order of preference
# what a lone model drafts with when nothing is given (no draft file, no type, no drafting block
# in the target): the text itself, under the adaptive length, which verifies drafts only where
# they pay (run, serve and bench apply it; a library PairConfig without a type decodes plainly)
LONE_MODEL = "suffix"


def get(name: str) -> DraftType:
    """The entry of one type name; an unknown name is one line listing the known ones."""
    try:
        return TYPES[name]
    except KeyError:
        raise InputError(f"{name or '(empty)'}: unknown speculative type (one of {', '.join(TYPES)})",
                         field="spec_type") from None


def parse(value: str) -> tuple[DraftType, ...]:
    """The types of a --spec-type value (one, or llama.cpp's comma list) in llama.cpp's order of
    preference; unknown and repeated types, and two that each draft with a model, are refused."""
    names = [v.strip() for v in value.split(",")]
    types = [get(n) for n in names]
    if len(set(names)) < len(names):
        raise InputError(f"{value}: a speculative type is given twice", field="spec_type")
    models = [t.name for t in types if not t.traits.cheap]
    if len(models) > 1:
        raise InputError(f"{value}: {' and '.join(models)} each draft with a model; one run has one draft model, "
                         "so a list holds n-gram types and at most one of the others", field="spec_type")
    return tuple(sorted(types, key=lambda t: t.priority))


def spec_types(value: str) -> tuple[str, ...]:
    """The names of `parse(value)`."""
    return tuple(t.name for t in parse(value))


def text_only(value: str | None) -> bool:
    """Whether every type of a --spec-type value drafts from the text alone (no draft file read)."""
    return value is not None and all(t.traits.draft_model == "none" for t in parse(value))


def detected(target, draft, fixed_block: bool = False) -> DraftType | None:
    """The type the files call for when none is given (llama.cpp's auto-detection, extended:
    ggspec also detects EAGLE3 heads, ordinary draft LLMs and a target's MTP block).
    `fixed_block` (--dflash) asks for a DFlash-family draft: when the draft is none, the last
    candidate's plan says why."""
    candidates = sorted((t for t in TYPES.values() if t.detect is not None and (not fixed_block or t.traits.fixed_block)),
                        key=lambda t: t.detect_rank)
    for t in candidates:
        if t.detect(target, draft):
            return t
    return candidates[-1] if fixed_block else None


def draft_file_optional(value: str | None) -> bool:
    """Whether every type of a --spec-type value can draft without a draft file (the n-gram
    types; draft-mtp, whose drafter file is optional)."""
    return value is not None and all(t.traits.draft_model != "required" for t in parse(value))


# --- options ---------------------------------------------------------------------------------------

def option_classes() -> list[type[Options]]:
    """Each options class once (ngram-map-k and ngram-map-k4v share theirs), in priority order."""
    seen: list[type[Options]] = []
    for t in TYPES.values():
        if t.options is not Options and t.options not in seen:
            seen.append(t.options)
    return seen


def option_fields() -> list[OptionField]:
    """Every type's options, flat: what the CLI's flags and the bench settings are made of. A key
    that several classes declare (the reduced draft vocabulary) is one option, given to each."""
    seen: dict[str, OptionField] = {}
    for cls in option_classes():
        for f in cls.flat_fields():
            seen.setdefault(f.key, f)
    return list(seen.values())


def options_from_flat(values: dict[str, Any]) -> dict[str, Options]:
    """Each type's options from flat keys (`option_fields`); keys of no type are ignored."""
    made = {cls: cls.from_flat(values) for cls in option_classes()}
    return {t.name: made[t.options] for t in TYPES.values() if t.options in made}


def flat_options(options: dict[str, Options]) -> dict[str, Any]:
    """The flat keys and values of each type's options (defaults for the types not given)."""
    out: dict[str, Any] = {}
    for cls in option_classes():
        given = next((o for o in options.values() if type(o) is cls), None)
        out.update((given or cls()).flat())
    return out


def flags() -> dict[str, str]:
    """Flat key -> llama.cpp's flag (errors name the flag the user typed)."""
    return {f.key: f.flags[0] for f in option_fields()}
