"""The engine on its own thread, fed by HTTP requests: continuous batching with a bounded queue.

A llama.cpp context is not thread-safe, so one thread owns the Engine and makes every llama.cpp
call (ctypes releases the GIL during them: the HTTP side keeps serving). Between two engine
steps that thread cancels the jobs whose clients left or whose text hit a stop string, moves
queued jobs into free slots, and after the step hands each job its new tokens. The HTTP side
(asyncio) only submits jobs and reads their events.

A job's events: `Tokens` (each step's committed tokens), then one `Done` (finish reason and the
sequence's statistics) or one `Failed`. A sequence that cannot go on (its grammar allows no
token) fails alone; only a decode llama.cpp refuses fails every job of that step.

This is the one engine loop that does not run through speculative.driver's `drive` generator: its
requests arrive on another thread while it runs, a client may leave at any step, and each prompt's
first tokens go out after its prefill, before the step's transaction. It admits a job as the
driver does (`Engine.add` of the job's `Request`).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field, replace

import numpy as np

from ggspec.errors import ContextOverflow, GGSpecError
from ggspec.speculative.engine import Engine
from ggspec.speculative.request import Request
from ggspec.speculative.stats import RunStats

log = logging.getLogger("ggspec.server")


class Overloaded(GGSpecError):
    """The queue is full (HTTP 503)."""


class Draining(GGSpecError):
    """The server is shutting down and takes no new requests (HTTP 503)."""


@dataclass(frozen=True)
class Tokens:
    tokens: list[int]
    probs: list = field(default_factory=list)  # TokenProbs per token, when the request asked (n_probs)


@dataclass(frozen=True)
class Done:
    reason: str  # "stop" (an end-of-generation token), "length" (budget or context), "abort"
    stats: RunStats


@dataclass(frozen=True)
class Failed:
    message: str


class Job:
    """One request inside the scheduler. `events` is read on the event loop it was made on."""

    def __init__(self, request: Request, loop: asyncio.AbstractEventLoop) -> None:
        self.request = replace(request, tag=self)  # (its sequence hands the job back)
        self.events: asyncio.Queue = asyncio.Queue()
        self.loop = loop
        self.cancelled = False
        self.end_reasoning = False  # a reasoning_end control waits for the engine thread
        self.seq = None
        self.t_arrival = time.perf_counter()
        self.t_last: float | None = None  # when its latest tokens arrived

    def emit(self, event) -> None:
        """Called on the engine thread; the loop may be gone when the server stops."""
        _publish(self.loop, [(self, event)])


def _deliver(events: list[tuple[Job, object]]) -> None:
    for job, event in events:
        job.events.put_nowait(event)


def _publish(loop: asyncio.AbstractEventLoop, events: list[tuple[Job, object]]) -> None:
    """Hand events to their jobs on the event loop: one wake-up for all of them (every wake-up
    makes the loop's thread take the GIL the engine's thread needs after each llama.cpp call)."""
    try:
        loop.call_soon_threadsafe(_deliver, events)
    except RuntimeError:  # the loop is closed: the server stopped
        pass


class Scheduler:
    def __init__(self, engine: Engine, max_queue: int, metrics=None) -> None:
        self.engine = engine
        self.max_queue = max_queue
        self.metrics = metrics
        self._cv = threading.Condition()
        self._queue: deque[Job] = deque()
        self._running: dict[object, Job] = {}  # Sequence -> Job
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="ggspec-engine", daemon=True)

    # --- the HTTP side ---------------------------------------------------------------------------

    @property
    def waiting(self) -> int:
        return len(self._queue)

    @property
    def running(self) -> int:
        return len(self._running)

    def jobs(self) -> list[Job]:
        """The running jobs, as of now (a copy: the engine thread changes the set)."""
        return list(self._running.values())

    def budget(self, prompt: np.ndarray, max_tokens: int | None) -> int:
        """Admission: the request's token budget if its prompt, budget and one verify block fit
        a slot's cells; InputError (HTTP 400) otherwise, before anything is decoded."""
        eng = self.engine
        eng.check_prompt(prompt)
        room = eng.capacity - len(prompt) - eng.block_cells
        if max_tokens is None:
            return room  # until an end-of-generation token or the slot is full, as llama-server
        if max_tokens > room:
            raise ContextOverflow(f"this request needs {len(prompt)} prompt + {max_tokens} generated + "
                                  f"{eng.block_cells} draft-block positions, but a slot holds {eng.capacity}: lower "
                                  f"max_tokens to at most {room} or shorten the prompt", "max_tokens", len(prompt),
                                  eng.capacity)
        return max_tokens

    def submit(self, request: Request) -> Job:
        """Queue a request checked by the engine (Engine.check), as a job (call on the event loop
        that reads its events)."""
        job = Job(request, asyncio.get_running_loop())
        with self._cv:
            if self._stopping:
                raise Draining("the server is shutting down")
            if len(self._queue) + len(self._running) >= self.engine.parallel + self.max_queue:
                raise Overloaded(f"the server is busy: all {self.engine.parallel} slots are in use and "
                                 f"{self.max_queue} requests are waiting (the queue's limit); retry later")
            self._queue.append(job)
            self._cv.notify()
        return job

    def cancel(self, job: Job) -> None:
        """The client left (or its text hit a stop string): its slot is freed before the next step."""
        with self._cv:
            job.cancelled = True
            self._cv.notify()

    def end_reasoning(self, job: Job) -> None:
        """End the job's thinking block before the next step (the engine thread owns its state)."""
        with self._cv:
            job.end_reasoning = True
            self._cv.notify()

    # --- lifetime --------------------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        """Refuse new jobs, end the ones left (their clients get `Failed`), stop the thread."""
        with self._cv:
            self._stopping = True
            self._cv.notify()
        self._thread.join(timeout)

    # --- the engine thread -----------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cv:
                while not (self._queue or self._running or self._stopping):
                    self._cv.wait()
                if self._stopping:
                    break
                cancelled = [job for job in self._running.values() if job.cancelled]
                ending = [job for job in self._running.values() if job.end_reasoning]
                admitted = self._admit()
            for job in cancelled:
                self._end(job, "abort")
            for job in ending:
                job.end_reasoning = False
                if job.seq is not None and job.seq.grammar is not None:
                    job.seq.grammar.end_reasoning()
            for job in admitted:
                try:
                    job.seq = self.engine.add(job.request)
                except GGSpecError as exc:  # admission checked it: a bug if it happens
                    job.emit(Failed(str(exc)))
                    continue
                self._running[job.seq] = job
            if self.engine.active:
                self._step()
        for job in [*self._running.values(), *self._queue]:
            job.emit(Failed("the server shut down before this request finished"))
        self._queue.clear()
        for job in list(self._running.values()):
            self._end(job, None)

    def _admit(self) -> list[Job]:
        """Queued jobs for the free slots (under the lock); cancelled ones are dropped."""
        free = self.engine.parallel - len(self._running)
        out = []
        while self._queue and len(out) < free:
            job = self._queue.popleft()
            if not job.cancelled:
                out.append(job)
        return out

    def _step(self) -> None:
        """The prompts of the jobs that joined (their first tokens go out at once: they do not
        wait for the transaction), then one engine step."""
        for phase in (self.engine.prefill, self.engine.step):
            try:
                results = phase()
            except GGSpecError as exc:  # llama.cpp refused a decode: every sequence in it is lost
                log.error("engine step failed: %s", exc)
                for job in list(self._running.values()):
                    job.emit(Failed(f"decoding failed: {exc}"))
                    self._end(job, None)
                return
            if results:
                self._publish_results(results)

    def _publish_results(self, results) -> None:
        """Each job's new tokens, and the Done of the finished ones, in one hand-over."""
        now = time.perf_counter()
        events: list[tuple[Job, object]] = []
        for seq, step in results:
            job = self._running.get(seq)
            if job is None or not step.tokens:
                continue
            events.append((job, Tokens(list(step.tokens), step.probs)))
            if self.metrics is not None:
                if job.t_last is None:
                    self.metrics.first_token(now - job.t_arrival)
                else:
                    self.metrics.tokens_after(now - job.t_last, len(step.tokens))
            job.t_last = now
        for seq in [s for s in self._running if s.done]:
            job = self._running[seq]
            if seq.failure is not None:  # it could not go on (its grammar's dead end): it alone fails
                self._end(job, None)
                events.append((job, Failed(f"decoding failed: {seq.failure}")))
            else:
                events.append((job, self._end(job, self._reason(seq), emit=False)))
        if events:
            _publish(events[0][0].loop, events)
        if self.metrics is not None:  # after the clients have their tokens
            self.metrics.engine_step(results)

    def _reason(self, seq) -> str:
        last = seq.tokens[-1] if seq.tokens else None
        return "stop" if last is not None and self.engine.target_model.is_eog(last) else "length"

    def _end(self, job: Job, reason: str | None, emit: bool = True) -> Done | None:
        """Free the job's slot (a no-op for a finished sequence); with a reason, its Done event
        (sent now unless `emit` is False)."""
        seq = job.seq
        self._running.pop(seq, None)
        if seq is not None:
            self.engine.cancel(seq)
        if reason is None:
            return None
        if self.metrics is not None:
            self.metrics.finished(reason, time.perf_counter() - job.t_arrival)
        done = Done(reason, seq.stats)
        if emit:
            job.emit(done)
        return done
