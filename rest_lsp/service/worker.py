"""The single inference thread that owns the model, running jobs one model forward at a time.

Everything that touches the model (loading it, prefill, decoding) runs on this one thread, so the event loop
never blocks and the KV cache is never shared between threads. A job is a generator: each `next()` does at
most one model forward (a prefill chunk, a decoding step) and yields. Between two forwards the worker picks
the job to advance: the lowest priority first (INTERACTIVE: a completion somebody waits for; WARM: extending
a document's KV cache while the user types; AHEAD: predicting past what was shown), oldest first within one
priority. So a completion pre-empts a warm-up at its next chunk, and a job set aside loses nothing: it goes on
where it stopped (the engine keeps its KV state in a pool) once nothing more urgent is waiting.

Which jobs to stop is the service's decision (`stop`); the worker only bounds the queue: past `queue_size`
waiting jobs the oldest of the least urgent priority is dropped.

Below every priority is the backend's idle work (`backend.idle_work()`: a generator, one forward per step, or
None), asked for once the worker has had no job for `idle_after_s`: the precision measured again in the
background (rest_lsp/model/precision.py LiveCheck). A job that arrives meanwhile waits at most one of its steps.
"""
from __future__ import annotations

import itertools
import logging
import threading
import time
import weakref
from collections.abc import Generator
from concurrent.futures import Future
from typing import Any, Callable, Generic, TypeVar

log = logging.getLogger(__name__)
B = TypeVar("B")

INTERACTIVE, WARM, AHEAD = 0, 1, 2
# seconds without a job before the backend's idle work runs: a pause in typing is not yet idle, and a measurement
# taken while the user types would time the editor's load too
IDLE_AFTER_S = 10.0
_seq = itertools.count()


class JobAborted(Exception):
    """The job did not run to its end: reason is "superseded", "dropped", "cancelled" or "stale"."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class ModelUnavailable(RuntimeError):
    """The model failed to load; the message says why."""


class Job:
    """fn(backend) runs on the worker thread: a generator (one forward per step) or a plain function."""

    def __init__(self, key: str, fn: Callable[[Any], Any], *, kind: str = "job", priority: int = INTERACTIVE):
        self.key = key
        self.kind = kind
        self.fn = fn
        self.priority = priority
        self.future: Future = Future()
        self.reason: str | None = None  # why it was stopped, if it was
        self.seq = next(_seq)
        self.submitted = time.perf_counter()
        self.steps = 0
        self._gen: Generator | None = None
        self._stop = threading.Event()

    def stop(self, reason: str) -> None:
        if self.reason is None:
            self.reason = reason
        self._stop.set()

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    def __repr__(self) -> str:
        return f"Job({self.kind} {self.key!r} p{self.priority} #{self.seq})"


_WORKERS: "weakref.WeakSet[InferenceWorker]" = weakref.WeakSet()


def outlived_close() -> bool:
    """Whether a closed worker's thread still runs: a model load cannot be interrupted, and close() waits 5 s
    for it. Such a thread meets the interpreter's finalization if the process then exits normally (the CLI's
    end: rest_lsp/cli.py)."""
    return any(w._closed and w._thread.is_alive() for w in list(_WORKERS))


class InferenceWorker(Generic[B]):
    def __init__(self, queue_size: int = 8, name: str = "rest-lsp-inference", idle_after_s: float = IDLE_AFTER_S):
        self.queue_size = max(1, queue_size)
        self.idle_after_s = idle_after_s
        self._idle: Generator | None = None  # the backend's idle work under way
        self._last_busy = time.monotonic()  # when a job or a load last ran
        self._idle_asked: float | None = None  # the _last_busy at which idle_work() last answered None
        self._jobs: list[Job] = []
        self._running: Job | None = None
        self._cv = threading.Condition(threading.RLock())
        self._loader: Callable[[], B] | None = None
        self._backend: B | None = None
        self.state = "idle"  # idle | loading | ready | failed
        self.error: str | None = None
        self.load_s: float | None = None
        self.ready_at: float | None = None  # perf_counter() when the current model became usable
        self.counts = {"superseded": 0, "dropped": 0, "cancelled": 0, "stale": 0, "completed": 0, "failed": 0}
        self._closed = False
        self._closing: list[Generator] = []  # generators of aborted jobs, closed on the worker thread
        self._loaded = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()
        _WORKERS.add(self)

    # -- called from any thread ---------------------------------------------------------------------
    def load(self, loader: Callable[[], B]) -> None:
        """(Re)load the backend on the worker thread before the next step; jobs wait for it."""
        with self._cv:
            self._loader = loader
            self.state = "loading"
            self.ready_at = None
            self._loaded.clear()
            for job in list(self._jobs):  # their runs belong to the old model
                if job is self._running:
                    job.stop("superseded")
                else:
                    self._abort(job, "superseded")
            self._cv.notify_all()

    def wait_loaded(self, timeout: float | None = None) -> bool:
        return self._loaded.wait(timeout)

    @property
    def backend(self) -> B | None:
        return self._backend

    def submit(self, job: Job) -> Job:
        with self._cv:
            if self._closed:
                job.future.set_exception(RuntimeError("the inference worker is shut down"))
                return job
            self._jobs.append(job)
            waiting = [j for j in self._jobs if j is not self._running and j.steps == 0]
            while len(waiting) > self.queue_size:
                oldest = max(waiting, key=lambda j: (j.priority, -j.seq))
                waiting.remove(oldest)
                self._abort(oldest, "dropped")
            self._cv.notify_all()
        return job

    def run_sync(self, fn: Callable[[B], Any], timeout: float | None = None) -> Any:
        """Run fn(backend) on the worker (the one-shot CLI, debug requests) and wait for its result."""
        return self.submit(Job(f"__sync__{id(fn)}", fn, kind="sync")).future.result(timeout)

    def jobs(self, key: str | None = None, kind: str | None = None) -> list[Job]:
        with self._cv:
            return [j for j in self._jobs if (key is None or j.key == key) and (kind is None or j.kind == kind)]

    def stop(self, job: Job, reason: str) -> None:
        """The job ends at its next step (a waiting one never runs); its future fails with JobAborted."""
        with self._cv:
            if job in self._jobs and job is not self._running:
                self._abort(job, reason)
            else:
                job.stop(reason)
            self._cv.notify_all()

    def set_priority(self, job: Job, priority: int) -> None:
        with self._cv:
            job.priority = priority
            self._cv.notify_all()

    def close(self) -> bool:
        """Stop the thread; True when it has ended (the backend is no longer in use)."""
        with self._cv:
            self._closed = True
            for job in list(self._jobs):
                if job is self._running:
                    job.stop("cancelled")
                else:
                    self._abort(job, "dropped")
            self._cv.notify_all()
        self._thread.join(timeout=5)
        return not self._thread.is_alive()

    def snapshot(self) -> dict:
        with self._cv:
            return {"state": self.state, "error": self.error, "load_s": self.load_s,
                    "pending": sum(1 for j in self._jobs if j is not self._running),
                    "running": self._running is not None, **self.counts}

    # -- worker thread ------------------------------------------------------------------------------
    def _abort(self, job: Job, reason: str) -> None:
        """With the lock held: remove a job that is not stepping now and fail its future."""
        job.stop(reason)
        if job in self._jobs:
            self._jobs.remove(job)
        if job._gen is not None:
            self._closing.append(job._gen)  # its `finally` blocks (stopping the engine run) run on the worker
            job._gen = None
        self.counts[reason] = self.counts.get(reason, 0) + 1
        if not job.future.done():
            job.future.set_exception(JobAborted(job.reason or reason))

    def _run(self) -> None:
        while True:
            with self._cv:
                closing, self._closing = self._closing, []
            for gen in closing:
                try:
                    gen.close()
                except Exception:  # noqa: BLE001
                    log.exception("closing an aborted job")
            idle = None
            with self._cv:
                while not self._closed and self._loader is None and not self._closing and \
                        not (self._jobs and self.state in ("ready", "failed")):
                    due = self._idle_due()
                    if due == 0:
                        idle = self._idle_work()
                        if idle is not None:
                            break
                        continue
                    self._cv.wait(due)
                if self._closing and not self._closed:
                    continue
                if self._closed:
                    for job in list(self._jobs):
                        self._abort(job, "dropped")
                    closing, self._closing = self._closing, []
                    for gen in closing:
                        gen.close()
                    self._close_idle()
                    return
                loader, self._loader = self._loader, None
                job = None
                if loader is None and idle is None:  # (idle work is taken only with no job waiting)
                    job = min(self._jobs, key=lambda j: (j.priority, j.seq))
                    if job.stopped:
                        self._abort(job, job.reason or "cancelled")
                        continue
                    self._running = job
            if loader is not None:
                self._close_idle()  # it belongs to the backend being replaced
                self._do_load(loader)
                with self._cv:
                    self._last_busy = time.monotonic()
                continue
            if idle is not None:
                self._idle_step(idle)
                continue
            try:
                self._step(job)
            finally:
                with self._cv:
                    self._running = None
                    self._last_busy = time.monotonic()
                    if job.stopped and job in self._jobs:
                        self._abort(job, job.reason or "cancelled")

    def _idle_due(self) -> float | None:
        """With the lock held and no job waiting: seconds until the idle work may step (0: now), None: none."""
        if self.state != "ready" or self._backend is None:
            return None
        if self._idle is None and (self._idle_asked == self._last_busy or not hasattr(self._backend, "idle_work")):
            return None  # asked since the last job, and there was none: a job may make some (it is asked again)
        return max(0.0, self._last_busy + self.idle_after_s - time.monotonic())

    def _idle_work(self) -> Generator | None:
        """With the lock held: the idle work under way, or what the backend has now (asked once per quiet spell)."""
        if self._idle is None:
            self._idle_asked = self._last_busy
            try:
                self._idle = self._backend.idle_work()
            except Exception:  # noqa: BLE001 - idle work never takes the worker down
                log.exception("the backend's idle work failed to start")
        return self._idle

    def _idle_step(self, gen: Generator) -> None:
        try:
            next(gen)
        except StopIteration:
            self._idle = None
        except Exception:  # noqa: BLE001
            log.exception("the backend's idle work failed")
            self._idle = None

    def _close_idle(self) -> None:
        gen, self._idle = self._idle, None
        if gen is not None:
            try:
                gen.close()
            except Exception:  # noqa: BLE001
                log.exception("closing the backend's idle work")

    def _do_load(self, loader: Callable[[], B]) -> None:
        t0 = time.perf_counter()
        old, self._backend = self._backend, None
        if old is not None and hasattr(old, "close"):
            old.close()  # what it keeps across restarts (the history) outlives it
        del old  # free the previous model before loading the next one
        try:
            backend = loader()
        except BaseException as exc:  # noqa: BLE001 - any failure leaves the server up with a clear error
            log.exception("model failed to load")
            with self._cv:
                if self._loader is None:
                    self.state, self.error = "failed", f"{type(exc).__name__}: {exc}"
            self._loaded.set()
            return
        with self._cv:
            self._backend = backend
            if self._loader is None:
                self.state, self.error = "ready", None
                self.ready_at = time.perf_counter()
            self.load_s = time.perf_counter() - t0
        self._loaded.set()

    def _finish(self, job: Job, result: Any = None, exc: BaseException | None = None) -> None:
        with self._cv:
            if job in self._jobs:
                self._jobs.remove(job)
            job._gen = None
            self.counts["failed" if exc is not None else "completed"] += 1
        if not job.future.done():
            if exc is not None:
                job.future.set_exception(exc)
            else:
                job.future.set_result(result)

    def _step(self, job: Job) -> None:
        if self.state == "failed" or self._backend is None:
            self._finish(job, exc=ModelUnavailable(f"the model is not available: {self.error}"))
            return
        job.steps += 1
        try:
            if job._gen is None:
                out = job.fn(self._backend)
                if not isinstance(out, Generator):
                    self._finish(job, out)
                    return
                job._gen = out
            next(job._gen)
        except StopIteration as done:
            self._finish(job, done.value)
        except BaseException as exc:  # noqa: BLE001 - one failing job never takes the worker down
            log.exception("inference job %r failed", job)
            self._finish(job, exc=exc)
