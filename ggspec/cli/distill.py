"""`ggspec distill`: two progress bars (capture, train) while the pipeline runs, and the result line."""

from __future__ import annotations

from pathlib import Path

from ggspec.cli.console import err
from ggspec.errors import InputError

INTERRUPTED = 130  # the exit status after Ctrl-C (the captured data stays for --resume)


def options(model: Path | None, pair: str | None, output: Path | None, *, data: Path | None, work: Path | None,
            resume: bool, sequences: int, prompt_len: int, gen_len: int, parallel: int, layers: str | None,
            draft_vocab: int | None, block: int, draft_layers: int, steps: int, batch: int, anchors: int, lr: float,
            minutes: float, seed: int, threads: int, outtype: str, check: bool):
    """The DistillOptions of distill's flags, checked before anything runs (each failure an
    InputError naming its flag; PyTorch must be installed)."""
    if (model is None) == (pair is None):
        raise InputError("give the target as -m FILE or --pair NAME")
    if output is None:
        raise InputError("-o: where to write the draft GGUF is required")
    try:
        import torch  # noqa: F401
    except ImportError:
        raise InputError("ggspec distill trains with PyTorch: pip install 'ggspec[train]'") from None
    from ggspec.distill.capture import CapturePlan
    from ggspec.distill.export import OUTTYPES
    from ggspec.distill.pipeline import DistillOptions
    from ggspec.distill.train import TrainPlan

    if outtype not in OUTTYPES:
        raise InputError(f"--outtype {outtype}: expected one of {', '.join(OUTTYPES)}")
    for flag, value, low in (("--sequences", sequences, 1), ("--prompt-len", prompt_len, 8), ("--gen-len", gen_len, 2),
                             ("-np", parallel, 1), ("--steps", steps, 1), ("-t", threads, 1), ("--batch", batch, 1),
                             ("--anchors", anchors, 1)):
        if value < low:
            raise InputError(f"{flag} must be at least {low}")
    if parallel > 256:
        raise InputError("-np must be at most 256")
    if not 0 <= seed < 2**32:
        raise InputError(f"-s {seed}: the seed must be in 0..{2**32 - 1}")
    if not minutes >= 0 or minutes == float("inf"):
        raise InputError("--minutes must be a finite number >= 0")
    if not 0 < lr < 1:
        raise InputError("--lr must be a number between 0 and 1")
    layer_ids = parse_int_list(layers, "--layers") if layers else ()
    target = model if model is not None else _pair_target(pair)
    if not target.is_file():
        raise InputError(f"-m {target}: no such file")
    plan = CapturePlan(n_seq=sequences, prompt_len=prompt_len, gen_len=gen_len, parallel=min(parallel, sequences),
                       threads=threads, seed=seed)
    return DistillOptions(target=target, output=output, work=work or Path(str(output) + ".work"), capture=plan,
                          train=TrainPlan(steps=steps, minutes=minutes, seed=seed, threads=threads, batch=batch,
                                          anchors=anchors, lr=lr),
                          data=data, resume=resume, layers=layer_ids, draft_vocab=draft_vocab, block=block,
                          draft_layers=draft_layers, outtype=outtype, check=check)


def _pair_target(name: str) -> Path:
    from ggspec.catalogue.pairs import get_entry, resolve

    return resolve(get_entry(name)).target


def distill(options) -> int:
    """Run the distill pipeline of these DistillOptions; the exit status (0, or INTERRUPTED)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    from ggspec.distill.pipeline import distill as run_distill

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TimeRemainingColumn(), TextColumn("{task.fields[info]}"))
    with Progress(*columns, console=err, transient=True) as progress:
        tasks: dict[str, int] = {}

        def bar(name: str, done: int, total: int, info: str) -> None:
            if name not in tasks:
                tasks[name] = progress.add_task(name, total=total, info="")
            progress.update(tasks[name], completed=done, total=total, info=info)

        try:
            report = run_distill(
                options, log=lambda line: progress.console.print(line, soft_wrap=True, highlight=False),
                on_group=lambda done, total, n: bar("capture", done, total, f"+{n} tokens"),
                on_step=lambda step, total, loss: bar("train", step, total, f"loss {loss:.3f}"))
        except KeyboardInterrupt:
            progress.stop()
            err.print(f"interrupted: run again with --resume to continue from the data in {options.work}", soft_wrap=True)
            return INTERRUPTED
    t = sum(s.seconds for s in report.stages.values())
    err.print(f"[green]wrote[/] {options.output} ({options.output.stat().st_size / 2**20:.1f} MiB) in {t / 60:.1f} min; "
              f"report: {options.output}.json", soft_wrap=True)
    return 0


def parse_int_list(text: str, flag: str) -> tuple[int, ...]:
    """"2,5,9" -> (2, 5, 9); anything else is one line naming the flag."""
    try:
        values = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise InputError(f"{flag} {text}: expected comma-separated integers, e.g. 2,5,9") from None
    return values
