"""A benchmark from start (or --resume) to its saved document: the plan, the runs, the saves.

The CLI is a thin shell over this: it builds a `Plan`, shows progress from the `Run` records
`BenchSession.runs()` yields, and saves with `save()` (after every configuration, and on Ctrl-C).
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

from ggspec.bench import report
from ggspec.bench.configs import Axes, BenchConfig, Skipped, expand, n_max_value
from ggspec.bench.forced import PROFILES
from ggspec.bench.meta import collect
from ggspec.speculative.types import registry
from ggspec.bench.report import check_profile_weights
from ggspec.bench.runner import Run, Runner, Settings
from ggspec.errors import GGSpecError, InputError
from ggspec.files import local_path, read_text


def parse_profile(spec: str | None) -> tuple[str | None, tuple[float, ...] | None]:
    """--acceptance-profile NAME|FILE -> (name for the rows, weights of accepted counts 0..n_max).
    A FILE holds the weights as numbers (JSON list or whitespace/comma separated)."""
    if spec is None:
        return None, None
    if spec in PROFILES:
        return spec, tuple(PROFILES[spec])
    path = Path(spec)
    if not path.exists():
        raise InputError(f"--acceptance-profile {spec}: neither a built-in profile ({', '.join(PROFILES)}) nor a file")
    text = read_text(path, f"--acceptance-profile {spec}").strip()
    try:
        values = json.loads(text) if text.startswith("[") else [float(x) for x in text.replace(",", " ").split()]
        weights = tuple(float(v) for v in values)
    except (ValueError, TypeError, OverflowError):
        raise InputError(f"--acceptance-profile {spec}: expected numbers (weights of accepted counts 0..n_max)") from None
    return path.name, check_profile_weights(weights, f"--acceptance-profile {spec}")


@dataclass
class Plan:
    settings: Settings
    axes: Axes | None  # None when resuming (the configurations come from the file)
    native: bool = False
    save_path: Path | None = None
    resume: dict | None = None  # a loaded document
    # where the --spec-draft-n-max axis came from: "flag" (the user's values, kept as given: one
    # beyond the draft's block is skipped with the reason), "pair" (a named pair's recommendation:
    # fitted to the block with a warning, as `ggspec run` does) or "default" (fitted silently)
    n_max_source: str = "flag"


class SaveError(GGSpecError):
    """The document could not be written (what was measured is still printed)."""


def native_text_types(types: tuple) -> tuple[tuple[str, int | None], ...]:
    """llama.cpp's n-gram types (and the one length each one's loop drafts, if it has one) as
    llama.cpp's rows of a benchmark whose type llama.cpp does not have (suffix); () otherwise."""
    if not types or all(t.llama_cpp for t in types):
        return ()
    return tuple((t.name, t.fixed_length) for t in registry.TYPES.values() if t.traits.cheap and t.llama_cpp)


class BenchSession:
    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.settings = plan.settings
        self.runner = Runner(self.settings)
        self.warnings: list[str] = []
        try:
            if plan.resume is not None:
                doc = plan.resume
                self.meta = doc["meta"]
                self.configs = [BenchConfig(**c) for c in doc["configs"]]
                self.skipped = [Skipped(**s) for s in doc["skipped"]]
                self.done_runs = report.runs_from(doc)
                self._check_same_models()
            else:
                draft = local_path(self.settings.draft) if self.settings.draft else None
                self.meta = collect(local_path(self.settings.target), draft, self.settings.threads)
                # a built-in profile is fitted to every n_max (0); a file of weights is one n_max's
                profile_len = None if not self.settings.profile_weights else (
                    0 if self.settings.profile in PROFILES else len(self.settings.profile_weights))
                drafting = self.runner.models.plan
                limit = drafting.max_draft
                self.configs, self.skipped = expand(self._fit_n_max(plan, limit), self.runner.recurrent,
                                                    self.runner.longest_prompt + self.settings.n_predict,
                                                    native=plan.native, profile_len=profile_len,
                                                    n_max_limit=limit, speculative=drafting.spec_type is not None,
                                                    dflash=any(t.traits.injection for t in drafting.types),
                                                    native_loop=True,
                                                    native_n_max=drafting.type.fixed_length if drafting.type else None,
                                                    native_types=native_text_types(drafting.types))
                self.done_runs = []
            if not self.configs:
                raise InputError("no configuration left to run: " + "; ".join(
                    f"{s.label}: {s.reason}" for s in self.skipped[:3]))
            self.runner.check_tools(self.configs)
        except BaseException:
            self.runner.close()
            raise
        self.runs: list[Run] = list(self.done_runs)
        self._done = self._completed_pairs(self.done_runs)
        # the save file holds self.runs[:_on_disk] (a resumed file holds what it was loaded with);
        # nothing new measured, nothing written: a failed --resume never rewrites its file
        self._on_disk = len(self.runs) if plan.resume is not None else None

    def _fit_n_max(self, plan: Plan, limit: int | None) -> Axes:
        """A draft length nobody typed follows `ggspec run`: clamped to the draft's block."""
        axes = plan.axes
        longest = max(n_max_value(item)[0] for item in axes.n_max)
        if plan.n_max_source == "flag" or limit is None or longest <= limit:
            return axes
        if plan.n_max_source == "pair":
            self.warnings.append(f"the pair's --spec-draft-n-max {longest} exceeds the draft's block size "
                                 f"{limit + 1} - 1; using {limit}")

        def fit(item):
            n, adaptive = n_max_value(item)
            return f"auto:{min(n, limit)}" if adaptive else min(n, limit)
        return replace(axes, n_max=tuple(dict.fromkeys(fit(item) for item in axes.n_max)))

    def _check_same_models(self) -> None:
        from ggspec.bench.meta import file_sha256

        for which in ("target", "draft"):
            if not self.meta[which]:  # a target-only benchmark
                continue
            path = local_path(self.meta[which])
            try:
                digest = file_sha256(path)
            except OSError as exc:
                raise InputError(f"--resume: cannot read the {which} file {path} ({exc.strerror or exc})") from None
            if digest != self.meta[f"{which}_sha256"]:
                raise InputError(f"--resume: the {which} file {self.meta[which]} changed since the benchmark started")

    @staticmethod
    def _completed_pairs(runs: list[Run]) -> dict[str, set[tuple[int, int]]]:
        """(rep, prompt) measured with its paired baseline, per configuration; a half-measured
        pair (Ctrl-C between the two runs) is dropped and measured again."""
        config_runs = {(r.config, r.rep, r.prompt) for r in runs if not r.paired_with}
        done: dict[str, set[tuple[int, int]]] = defaultdict(set)
        for r in runs:
            if r.paired_with and (r.paired_with, r.rep, r.prompt) in config_runs:
                done[r.paired_with].add((r.rep, r.prompt))
        return done

    def paired_runs(self) -> list[Run]:
        """The runs whose pair is complete (what the saved document keeps)."""
        pairs = self._completed_pairs(self.runs)
        return [r for r in self.runs if (r.rep, r.prompt) in pairs.get(r.paired_with or r.config, set())]

    @property
    def runs_per_config(self) -> int:
        return self.settings.reps * len(self.settings.prompts)

    def todo(self) -> list[BenchConfig]:
        return [c for c in self.configs if self.missing(c) > 0]

    def missing(self, cfg: BenchConfig) -> int:
        """(rep, prompt) pairs of this configuration still to measure."""
        return self.runs_per_config - len(self._done.get(cfg.key, ()))

    def remaining_pairs(self) -> int:
        return sum(self.missing(c) for c in self.configs)

    def config_runs(self, cfg: BenchConfig) -> Iterator[Run]:
        """Measure what is missing of one configuration; every record is kept as it arrives."""
        for run in self.runner.run_config(cfg, done=self._done.get(cfg.key, set())):
            self.runs.append(run)
            if run.paired_with:
                self._done[cfg.key].add((run.rep, run.prompt))
            yield run

    @property
    def complete(self) -> bool:
        return not self.todo()

    def document(self) -> dict:
        return report.document(self.settings, self.meta, self.configs, self.skipped, self.paired_runs(),
                               self.complete)

    def save(self) -> dict:
        """The document; written to the save path when something new was measured since the last
        write. SaveError (one line) when it cannot be written."""
        doc = self.document()
        path = self.plan.save_path
        if path is not None and self.runs and self._on_disk != len(self.runs):
            try:
                report.save(path, doc)
            except OSError as exc:
                raise SaveError(f"cannot save {path} ({exc.strerror or exc})") from None
            self._on_disk = len(self.runs)
        return doc

    @property
    def saved(self) -> bool:
        """Whether the save file holds everything measured so far."""
        return self.plan.save_path is not None and self._on_disk == len(self.runs)

    def close(self) -> None:
        self.runner.close()
