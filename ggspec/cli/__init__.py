"""The `ggspec` command line: every flag, what each command prints, and how a command ends.

Only this package speaks in flags; the library below it raises typed errors naming a field
(`InputError.field`), which `entry` prints with its flag. Read it in this order:

- `options`: the option table. The flags `run`, `serve` and `bench` share, declared once as the
  fields of `Shared` (spellings, help, default, which commands take them, bench's comma-list form);
- `parameters`: the table (and each draft type's own options, from the registry) generated into a
  command's typer parameters; the command is called with one `Shared`;
- `parsers`: the values parsed once, where they come in (`-ngl`, `-fa`, `--spec-type`,
  `--spec-draft-n-max`);
- `command_options`: the flags only one command takes;
- `commands`: the typer app, one function per command: its own flags and one call into the library;
- `config`: `Shared` -> the models and the PairConfig, the memory fit's notes;
- `run`, `printer`, `verdict`: `ggspec run`'s decode, its ordered output and its last line;
- `serve`, `build`, `models`, `distill`: those commands' checks, progress bars and result lines;
- `console`: the one stderr console (notes, warnings, error lines); `entry`: how a command ends.

The app is imported on first use (`app`, `main`), so that `python -m ggspec.cli` installs its
quiet Ctrl-C before the slow imports (ggspec.startup).
"""

from __future__ import annotations


def main() -> None:
    """Run the command line on sys.argv: every expected failure is one line and a non-zero exit."""
    from ggspec.cli.commands import app
    from ggspec.cli.entry import run_app

    run_app(app)


def __getattr__(name: str):
    # `ggspec.cli.app`, the typer app, is imported when first asked for (see the module docstring)
    if name == "app":
        from ggspec.cli.commands import app

        return app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
