"""Costs known before the first step: the adaptive rule's cost tables, measured once per machine,
build, model files and settings, and kept under `$GGSPEC_HOME/calibration/`.

The adaptive draft length (draft_length.py) weighs expected committed tokens against what a step
costs on this machine: a plain step, the verify of r rows, the draft call by its length, the
rest (injection, replays, Python). Without measured costs its first steps have to find them out,
and a short prompt is over before they have (the real Qwen2.5-Coder 1.5B + 0.5B pair spent its
16-token prompt drafting 15 tokens a step, at 0.53x plain decoding). So an engine with the rule
starts from tables measured before: when none is cached for this key, `Calibration` runs a short
synthetic request through the engine itself, with every sequence it decodes at once, verifying a
fixed schedule of lengths (the full length, none, one, half), and every llama.cpp call of a real
step (draft, injection, verify, rollback, replay) is measured as in any step. Those steps' drafts
are forgotten (the model's continuation of a synthetic prompt is not the user's text); their costs
are saved. The rule keeps measuring as it runs, in memory
only: what a run measures depends on what the rule chose (steps after a stretch of plain ones pay
for cold caches), and saved, such measurements made a pair look hopeless for good.

The key hashes what changes the costs: the CPU (and the build, which says which GPU backend),
the model files (path, size, modification time), and every setting of the pair but sampling's.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ggspec.runtime.devices import cpu_name
from ggspec.speculative.proposer import Draft
from ggspec.speculative.request import Request
from ggspec.speculative.stats import EngineStats

if TYPE_CHECKING:
    from ggspec.runtime import ContextParams

VERSION = 5  # of the file's layout and how it is measured: another version is measured again
SKIP = 2  # the first steps, not measured: they build and allocate the graphs of the largest shapes
MEASURED = 3  # steps each phase measures at least
PHASE_S = 0.05  # ... and seconds it lasts at least (cheap steps: many of them, past the cold ones)
PHASE_STEPS = 64  # steps a phase lasts at most
MAX_AGE_S = 7 * 86400  # cached tables older than this are measured again (the machine's load changes)
PROMPT = 32  # the calibration prompt's tokens at most
KEEP = 256  # cached tables kept at most (a few KiB each)
TEXT = (  # the calibration's prompt: code that repeats, so the n-gram types find drafts in it too
    "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n\n\n"
    "def add(a, b):\n    return a + b\n\n\ndef mul(a, b):\n    return a * b\n\n\n"
    "The function add returns the sum of a and b; the function sub returns their difference.\n"
)


def schedule(n_max: int) -> list[int]:
    """The k of each calibration phase: the full length (whose first steps build graphs and are
    not measured), none, one, and half the full length (rows between the ends)."""
    half = (n_max + 1) // 2
    return [n_max, 0] + ([1] if n_max > 1 else []) + ([half] if 1 < half < n_max else [])


def machine() -> str:
    """The CPU, in words (its model name, its cores) and the architecture."""
    return f"{cpu_name()} x{os.cpu_count()} {platform.machine()}"


def _file(path) -> list | None:
    if path is None:
        return None
    st = os.stat(path)
    return [os.path.realpath(path), st.st_size, st.st_mtime_ns]


def key_of(engine) -> dict:
    """What the costs depend on, as plain data."""
    from ggspec.native.bindings import library_path  # noqa: PLC0415

    cfg = engine.cfg
    settings = {k: v for k, v in asdict(cfg).items() if k not in ("target", "draft", "sampling", "spec_options")}
    settings["spec_options"] = {name: asdict(o) for name, o in sorted(cfg.spec_options.items())}
    return {"version": VERSION, "machine": machine(), "library": str(library_path()),
            "target": _file(cfg.target), "draft": _file(cfg.draft), "type": engine.plan.spec_type,
            "n_max": engine.n_max, "settings": json.loads(json.dumps(settings, default=str))}


def cache_dir() -> Path:
    from ggspec.native.paths import ggspec_home  # noqa: PLC0415

    return ggspec_home() / "calibration"


def cache_path(key: dict) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]
    return cache_dir() / f"{digest}.json"


def load(path: Path, key: dict) -> dict | None:
    """The cached tables for this key (None: none, or unreadable)."""
    try:
        if time.time() - path.stat().st_mtime > MAX_AGE_S:
            return None
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return doc.get("tables") if isinstance(doc, dict) and doc.get("key") == key else None


def save(path: Path, key: dict, tables: dict, seconds: float | None) -> None:
    """Write the tables (atomically: engines in other processes may read the file)."""
    from ggspec.native.atomic import atomic_write  # noqa: PLC0415

    doc = {"key": key, "tables": tables, "calibration_s": seconds, "saved": time.strftime("%Y-%m-%dT%H:%M:%S")}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, lambda tmp: tmp.write_text(json.dumps(doc, indent=1)))
        _prune(path.parent)
    except OSError:
        pass  # a cache that cannot be written costs a calibration next time, nothing else


def _prune(folder: Path) -> None:
    """Keep the KEEP most recently written tables (files made and deleted, as tests do, leave keys behind)."""
    files = sorted(folder.glob("*.json"), key=lambda p: p.stat().st_mtime, reverse=True)
    for old in files[KEEP:]:
        old.unlink(missing_ok=True)


class Calibration:
    """An engine's cost tables: loaded from the cache, or measured now and saved."""

    def __init__(self, engine) -> None:
        self.key = key_of(engine)
        self.path = cache_path(self.key)
        self.seconds: float | None = None  # what measuring took (None: the tables were cached)
        self.measured = False
        rule = engine.draft_length
        tables = load(self.path, self.key)
        if tables is not None:
            try:
                rule.seed(tables)
            except (KeyError, TypeError, ValueError, AttributeError):  # a file damaged by hand: measure again
                tables = None
        if tables is None:
            t0 = time.perf_counter()
            self.measured = run(engine)
            self.seconds = time.perf_counter() - t0
            if self.measured:
                save(self.path, self.key, rule.tables(), self.seconds)


def prompt_tokens(engine, room: int) -> np.ndarray:
    """The calibration prompt: TEXT's first PROMPT tokens (a prefill is not what is measured), at most `room`."""
    return engine.target_model.tokenize(TEXT)[:max(2, min(PROMPT, room))]


def run(engine) -> bool:
    """Measure the costs: every slot decodes the calibration prompt while the rule verifies each
    phase's length (schedule) for MEASURED steps and PHASE_S seconds at least, PHASE_STEPS at most
    (an engine's first steps are slow: caches, page faults, new graphs; on a small model many steps
    fit in a few milliseconds); then the engine is emptied and its statistics start afresh. False:
    the context cannot hold the phases (the rule then measures as it runs)."""
    rule = engine.draft_length
    phases = schedule(engine.n_max)
    prompt = prompt_tokens(engine, engine.capacity // 4)
    room = engine.capacity - len(prompt) - engine.block_cells
    caps = [min(PHASE_STEPS, room // len(phases) // (k + 1)) for k in phases]
    if min(caps) < SKIP + MEASURED + 1:
        return False
    rule.skip(SKIP)
    own = engine.proposer
    engine.proposer = FullLength(own)
    try:
        for _ in range(engine.parallel):
            engine.add(Request(prompt, room, ignore_eos=True, tag="calibration"))
        for first, (k, cap) in enumerate(zip(phases, caps)):
            least = MEASURED + (SKIP if first == 0 else 1)  # (a phase's first step pays for the change)
            t0 = time.perf_counter()
            for done in range(1, cap + 1):
                rule.force(k)
                engine.step()
                if not engine.active or (done >= least and time.perf_counter() - t0 >= PHASE_S):
                    break
        engine.reset()
        rule.true_plain = (engine.parallel, _plain_steps(engine, prompt, room))
        step = None if rule.cheap else plain_engine_step(engine, prompt)
        rule.plain_engine = None if step is None else (engine.parallel, step)
    finally:
        engine.proposer = own
        engine.reset()
        rule.settle()
        engine.stats = EngineStats()
    return True


class FullLength:
    """The engine's proposer while it calibrates: every draft as long as asked. Drafts come up
    short where an n-gram type finds no long match in the calibration text, or a confidence
    cut-off stops a model drafter, and then a phase's k + 1 verify rows would never be measured
    (n-gram pairs were left with their 16-row verify extrapolated from 2 and 9 rows, 5x too dear,
    and never verified a draft). A short draft is padded with the sequence's last tokens: the
    verify costs the same whatever its tokens; a sampled draft (its distribution travels with it)
    stays as it is."""

    def __init__(self, inner) -> None:
        self.inner, self.name, self.max_draft = inner, inner.name, inner.max_draft

    def __getattr__(self, name):  # begin, observe, commit, flush, release, reset, close
        return getattr(self.inner, name)

    def propose(self, seqs, n: int) -> list[Draft]:
        drafts = self.inner.propose(seqs, n)
        return [_padded(d, seq, n) if len(d) < n and d.probs is None else d for seq, d in zip(seqs, drafts)]


def _padded(draft: Draft, seq, n: int) -> Draft:
    filler = np.resize(np.asarray(seq.history[-n:], dtype=np.int32), n - len(draft))
    return Draft(np.concatenate([draft.tokens, filler]).astype(np.int32))


def _plain_steps(engine, prompt: np.ndarray, room: int) -> float:
    """Seconds of a step of every slot decoding without speculating (no draft kept current: the
    step a sequence that stops speculating costs), the lower quartile of a phase's steps."""
    for _ in range(engine.parallel):
        engine.add(Request(prompt, room, ignore_eos=True, tag="calibration", speculate=False))
    engine.step()  # the prefill
    times = []
    t0 = time.perf_counter()
    while engine.active and len(times) < PHASE_STEPS:
        t = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - t)
        if len(times) >= MEASURED + 1 and time.perf_counter() - t0 >= PHASE_S:
            break
    return _lower_quartile(times)


def _lower_quartile(times: list[float]) -> float:
    return sorted(times)[len(times) // 4]


def plain_step_params(target: ContextParams, n_seqs: int, n_prompt: int = PROMPT) -> ContextParams:
    """The bare target context plain_engine_step measures on: as a plain engine's, with cells for
    the prompt and the steps of every slot, and batches no larger than a prompt or a step (its
    compute buffers, transient memory beside the engine's, stay small: the memory fit counts them)."""
    rows = max(n_prompt, n_seqs)
    return replace(target, n_rs_seq=0, n_seq_max=n_seqs, kv_unified=True,
                   n_ctx=n_seqs * (n_prompt + PHASE_STEPS + 1), n_batch=rows, n_ubatch=rows)


def calibrates_plain_step(cfg, plan) -> bool:
    """Whether an engine of cfg measures a plain engine's step on a context of its own while
    calibrating (the adaptive rule of a model drafter; plain_engine_step)."""
    return cfg.auto and cfg.calibrate and bool(plan.types) and not all(t.traits.cheap for t in plan.types)


def plain_engine_step(engine, prompt: np.ndarray) -> float | None:
    """Seconds of a plain engine's step with every slot decoding: one decode of a token per
    sequence on a bare target context made as a plain engine makes it (Engine._reopen_plain), the
    lower quartile. What an engine decided plain by cost will cost, so what speculation must beat;
    it can be well below this engine's steps that verify nothing: with `-fa auto` on the CPU a
    context that verifies drafts keeps flash attention off and a plain engine's has it on (a
    one-token decode 0.85x the time on the tiny pairs), and the engine's own bookkeeping goes (at
    `-np 4` on tiny-coder a k = 0 step cost 1.2 ms, a plain engine's 0.74). The decode alone is a
    lower bound of the step, so a marginal case leans plain. None: a batch cannot hold a token of
    every slot."""
    from ggspec.runtime import Batch, Context  # noqa: PLC0415

    target, n_seqs = engine.target, engine.parallel
    if n_seqs > target.n_batch:
        return None
    prompt = prompt[:target.n_batch]  # a prefill in one batch
    ctx = Context(target.model, plain_step_params(target.params, n_seqs, len(prompt)), what="calibration")
    try:
        batch = Batch(ctx)
        for s in range(n_seqs):
            ctx.decode(batch.clear().add_tokens(prompt, 0, s, outputs="last"))
        times = []
        t0 = time.perf_counter()
        for i in range(PHASE_STEPS):
            batch.clear()
            for s in range(n_seqs):
                batch.add_tokens(prompt[i % len(prompt):][:1], len(prompt) + i, s, outputs="all")
            t = time.perf_counter()
            ctx.decode(batch)
            times.append(time.perf_counter() - t)
            if i >= SKIP + 2 * MEASURED and time.perf_counter() - t0 >= PHASE_S:
                break
    finally:
        ctx.close()  # (and its batch)
    return _lower_quartile(times[SKIP:])
