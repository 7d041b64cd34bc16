"""`ggspec build`: a progress display while llama.cpp builds, and one line saying what was built.

A BuildError is not caught here: the CLI's entry point prints it as one error line.
"""

from __future__ import annotations

from ggspec.cli.console import err


def build(options, force: bool, ui: bool = False) -> None:
    """Build (or find cached) the llama.cpp of these BuildOptions; say where it is. `ui`: the web
    UI too (a BuildError of its own is one error line); --tools builds it as well, best effort."""
    from ggspec.native import build as nb
    from ggspec.native.progress import RichReporter

    with RichReporter(err) as reporter:
        info = nb.build(options, force=force, reporter=reporter)
    if info.cached:
        err.print(f"[green]cached[/] build {info.key} ({len(info.patches)} patches): {info.lib_dir}",
                  soft_wrap=True)
    else:
        err.print(f"[green]built[/] {info.key} ({len(info.patches)} patches) in {info.seconds:.0f} s: "
                  f"{info.lib_dir}", soft_wrap=True)
    if options.tools:  # what the tests compare with: llama.cpp's tools, and the suffix type's oracle
        from ggspec.native import suffix_oracle
        from ggspec.native.errors import BuildError

        try:
            suffix_oracle.ensure(log=lambda line: err.print(line, soft_wrap=True, highlight=False))
        except BuildError as exc:  # (llama.cpp's build is what --tools is for: the oracle's tests skip)
            err.print(f"[yellow]warning:[/] {exc}", soft_wrap=True, highlight=False)
    if ui or options.tools:
        from ggspec.native import web_ui
        from ggspec.native.errors import BuildError

        try:
            site = web_ui.ensure(log=lambda line: err.print(line, soft_wrap=True, highlight=False))
            err.print(f"[green]web UI[/]: {site}", soft_wrap=True, highlight=False)
        except BuildError as exc:
            if ui:
                raise
            err.print(f"[yellow]warning:[/] {exc} (the web UI's tests skip)", soft_wrap=True, highlight=False)


def compile_check(options, force: bool) -> None:
    """`--compile-check`: compile only the CUDA units the patches touch, one line per unit and a summary."""
    from ggspec.native import cuda_check

    result = cuda_check.compile_check(options, force=force,
                                      on_unit=lambda unit: err.print(f"compiling {unit}", soft_wrap=True))
    if not result.units:
        err.print("[green]CUDA compile check[/]: no patch touches a CUDA unit", soft_wrap=True)
        return
    times = ", ".join(f"{unit.rsplit('/', 1)[-1]} {s:.0f} s" for unit, s in result.unit_s.items())
    configure = f"configure {result.configure_s:.0f} s" if result.configure_s else "configured before"
    err.print(f"[green]CUDA compile check passed[/] ({len(result.units)} units; {configure}, {times}): "
              f"{result.build_dir}", soft_wrap=True)
