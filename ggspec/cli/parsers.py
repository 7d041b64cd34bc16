"""Option values parsed once, where they come in: the rest of the command line reads typed values.

Each parser takes the text the user typed and returns the value the code uses, or raises an
InputError naming the field (its flag is put in front by `entry`). The spellings follow
llama.cpp's own parsers in common/arg.cpp at the pin (tests/test_cli_options.py compares them).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from ggspec.errors import InputError
from ggspec.speculative.models import parse_n_max
from ggspec.speculative.types import registry
from ggspec.speculative.types.draft_type import DraftType

# --- -ngl / -ngld -----------------------------------------------------------------------------------

ALL_LAYERS = -1  # ggspec's (and llama.h's) "every layer"
AUTO = "auto"  # offload where there is a device: every layer on a GPU build or over --rpc, else none
GpuLayers = int | Literal["auto"]


def gpu_layers(field: str) -> Callable[[str], GpuLayers]:
    """The parser of a layer count (-ngl, -ngld): a number (-1: all), `all`, or `auto`."""

    def parse(text: str) -> GpuLayers:
        word = text.strip()
        if word == "all":
            return ALL_LAYERS
        if word == AUTO:
            return AUTO
        try:
            return int(word)
        except ValueError:
            raise InputError(f"{text}: expected a number of layers, all or auto", field=field) from None

    return parse


def resolved_layers(value: GpuLayers | None, *, devices: bool) -> int | None:
    """A layer count with `auto` resolved: every layer when there are devices to offload to (a GPU
    build, or --rpc workers: `devices`), else none. (llama.cpp's `auto` also fits the count to the
    free memory; ggspec's memory fit shrinks the context instead, or refuses in one line.)"""
    if value != AUTO:
        return value
    from ggspec.runtime.devices import has_gpu_backend

    return ALL_LAYERS if devices or has_gpu_backend() else 0


# --- -fa ----------------------------------------------------------------------------------------------

# llama.cpp's words for on, off and auto (common_arg_utils::is_truthy / is_falsey / is_autoy)
_FLASH_ATTN = {**dict.fromkeys(("on", "enabled", "true", "1"), "on"),
               **dict.fromkeys(("off", "disabled", "false", "0"), "off"),
               **dict.fromkeys(("auto", "-1"), "auto")}


def flash_attn(text: str) -> str:
    """-fa: on, off or auto, in any of llama.cpp's spellings (enabled, true, 1, ...)."""
    try:
        return _FLASH_ATTN[text.strip()]
    except KeyError:
        raise InputError(f"{text}: expected on, off or auto", field="flash_attn") from None


# --- --spec-type -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SpecTypes:
    """A --spec-type value: the types, parsed once, and the text as written (PairConfig.spec_type
    and bench documents keep the text)."""

    text: str
    types: tuple[DraftType, ...]  # in llama.cpp's order of preference

    @property
    def none(self) -> bool:
        """`--spec-type none`: plain decoding."""
        return not self.types

    @property
    def text_only(self) -> bool:
        """Every type drafts from the text alone (no draft file is read)."""
        return all(t.traits.draft_model == "none" for t in self.types)

    @property
    def draft_file_optional(self) -> bool:
        """Every type can draft without a draft file (the n-gram types; draft-mtp)."""
        return all(t.traits.draft_model != "required" for t in self.types)

    @classmethod
    def of(cls, t: DraftType) -> SpecTypes:
        """One type found rather than given (detected from the files)."""
        return cls(t.name, (t,))


def spec_types(text: str) -> SpecTypes:
    """--spec-type: one type or llama.cpp's comma list (registry.parse's checks); `none`: no
    drafting at all (plain decoding, as llama.cpp's `--spec-type none`)."""
    names = [t.strip() for t in text.split(",")]
    if "none" in names:
        if len(names) > 1:
            raise InputError(f"{text}: none means no drafting at all: it takes no other type", field="spec_type")
        return SpecTypes("none", ())
    return SpecTypes(text, registry.parse(text))


# --- --spec-draft-n-max --------------------------------------------------------------------------------


@dataclass(frozen=True)
class NMax:
    """A --spec-draft-n-max value: `7` is a fixed length, `auto` the adaptive one capped at the
    pair's (or the default), `auto:7` the adaptive one capped at 7."""

    cap: int | None  # None: the pair's recommendation, else the default
    adaptive: bool


def n_max(text: str) -> NMax:
    return NMax(*parse_n_max(text))


ADAPTIVE = NMax(None, True)  # no length given: the adaptive one, as `auto`
