"""The option table, generated into a command's typer parameters.

typer reads a command's options from its signature. `takes_options("run")` gives the command
the parameters of every table option `run` takes (options.Shared's fields) and, for a drafting
command, of every draft type's own option (the registry's option fields), after its own; typer
then passes their values by name, and the wrapper gathers them into one `Shared`. The command
reads `shared.n_ctx`: no parameter is matched to a field by its name in the command's body, so
a renamed field cannot drop out unnoticed.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Annotated

import typer

from ggspec.cli.options import DRAFTING, Entry, Shared, table
from ggspec.speculative.types import registry
from ggspec.speculative.types.draft_type import OptionField

TYPE_OPTIONS = "Draft types' options"  # their group in `--help`


def takes_options(command: str) -> Callable[[Callable], Callable]:
    """A typer command that takes the table's options `command` takes: it is defined as
    `def run(shared: Shared, <its own options>)` and called with one Shared holding them."""
    entries = [e for e in table() if command in e.flag.commands]
    swept = {e.name for e in entries if e.sweeps(command)}
    type_fields = registry.option_fields() if command in DRAFTING else []

    def decorate(function: Callable) -> Callable:
        signature = inspect.signature(function, eval_str=True)  # (the module's annotations are strings)
        own = [p for p in signature.parameters.values() if p.name != "shared"]
        generated = [table_parameter(e, command) for e in entries] + [type_parameter(f) for f in type_fields]

        @functools.wraps(function)
        def wrapper(**kwargs):
            values = {e.name: kwargs.pop(e.name) for e in entries}
            shared = Shared(**{k: v for k, v in values.items() if k not in swept},
                            swept={k: v for k, v in values.items() if k in swept},
                            type_options={f.key: kwargs.pop(f.key) for f in type_fields})
            return function(shared=shared, **kwargs)

        wrapper.__signature__ = signature.replace(parameters=own + generated)
        return wrapper

    return decorate


def table_parameter(entry: Entry, command: str) -> inspect.Parameter:
    """The typer parameter of a table option in `command`: bench's comma-list form where bench
    sweeps it, else the single value (with the command's own help and default, if it has them)."""
    f = entry.flag
    names = (*f.spellings, *f.old)
    if entry.sweeps(command):
        option = typer.Option(*names, help=f.sweep, rich_help_panel=f.panel)
        return _parameter(entry.name, None, Annotated[str | None, option])
    variant = f.variants.get(command, {})
    extra = {**f.extra, **variant.get("extra", {})}
    if f.parser is not None:  # typer is given text; the parser makes the typed value
        hint, extra["parser"] = str | None, f.parser
    else:
        hint = entry.hint
    option = typer.Option(*names, help=variant.get("help", f.help), rich_help_panel=f.panel, **extra)
    return _parameter(entry.name, variant.get("default", entry.default), Annotated[hint, option])


def type_parameter(f: OptionField) -> inspect.Parameter:
    """The typer parameter of one draft type's option (llama.cpp's flags, help and default)."""
    option = typer.Option(*f.flags, help=f.help, rich_help_panel=TYPE_OPTIONS)
    return _parameter(f.key, f.default, Annotated[f.annotation, option])


def _parameter(name: str, default, annotation) -> inspect.Parameter:
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation)
