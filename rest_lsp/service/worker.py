"""The single inference thread that owns the model.

Everything that touches the model (loading it, prefill, decoding) runs on this one thread, so the event loop
never blocks and the KV cache is never shared between threads. Requests are keyed by document:
- a newer request for the same document supersedes the older one, pending or running, even without a
  `$/cancelRequest` (Neovim does not cancel superseded requests);
- a running job sees its cancellation through `should_stop()`, polled by the decoder between steps;
- the queue is bounded: past `queue_size` pending jobs the oldest is dropped.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import deque
from concurrent.futures import Future
from typing import Any, Callable, Generic, TypeVar

log = logging.getLogger(__name__)
B = TypeVar("B")


class JobAborted(Exception):
    """The job will not run (or stopped early): reason is "superseded", "dropped" or "cancelled"."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class ModelUnavailable(RuntimeError):
    """The model failed to load; the message says why."""


class Job:
    def __init__(self, key: str, fn: Callable[[Any, Callable[[], bool]], Any]):
        self.key = key
        self.fn = fn
        self.future: Future = Future()
        self.reason: str | None = None     # why it was stopped, if it was
        self.submitted = time.perf_counter()
        self._stop = threading.Event()

    def stop(self, reason: str) -> None:
        if self.reason is None:
            self.reason = reason
        self._stop.set()

    def should_stop(self) -> bool:
        return self._stop.is_set()


class InferenceWorker(Generic[B]):
    def __init__(self, queue_size: int = 8, name: str = "rest-lsp-inference"):
        self.queue_size = max(1, queue_size)
        self._pending: deque[Job] = deque()
        self._running: Job | None = None
        self._cv = threading.Condition(threading.RLock())
        self._loader: Callable[[], B] | None = None
        self._backend: B | None = None
        self.state = "idle"          # idle | loading | ready | failed
        self.error: str | None = None
        self.load_s: float | None = None
        self.counts = {"superseded": 0, "dropped": 0, "cancelled": 0, "completed": 0, "failed": 0}
        self._closed = False
        self._loaded = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    # -- called from any thread ---------------------------------------------------------------------
    def load(self, loader: Callable[[], B]) -> None:
        """(Re)load the backend on the worker thread before the next job; jobs wait for it."""
        with self._cv:
            self._loader = loader
            self.state = "loading"
            self._loaded.clear()
            if self._running is not None:
                self._running.stop("superseded")
            self._cv.notify_all()

    def wait_loaded(self, timeout: float | None = None) -> bool:
        return self._loaded.wait(timeout)

    @property
    def backend(self) -> B | None:
        return self._backend

    def supersede(self, key: str) -> None:
        """A newer request for key was answered without the model: stop the older ones."""
        with self._cv:
            for old in [j for j in self._pending if j.key == key]:
                self._pending.remove(old)
                self._abort(old, "superseded")
            if self._running is not None and self._running.key == key:
                self._running.stop("superseded")

    def submit(self, key: str, fn: Callable[[B, Callable[[], bool]], Any]) -> Job:
        job = Job(key, fn)
        with self._cv:
            if self._closed:
                job.future.set_exception(RuntimeError("the inference worker is shut down"))
                return job
            self.supersede(key)
            while len(self._pending) >= self.queue_size:
                self._abort(self._pending.popleft(), "dropped")
            self._pending.append(job)
            self._cv.notify_all()
        return job

    def cancel(self, job: Job) -> None:
        """Client cancellation: a pending job never runs, a running one stops at its next step."""
        with self._cv:
            if job in self._pending:
                self._pending.remove(job)
                self._abort(job, "cancelled")
            else:
                job.stop("cancelled")

    def run_sync(self, fn: Callable[[B, Callable[[], bool]], Any], timeout: float | None = None) -> Any:
        """Run fn on the worker (for the one-shot CLI and debug requests) and wait for its result."""
        return self.submit(f"__sync__{id(fn)}", fn).future.result(timeout)

    def close(self) -> bool:
        """Stop the thread; True when it has ended (the backend is no longer in use)."""
        with self._cv:
            self._closed = True
            while self._pending:
                self._abort(self._pending.popleft(), "dropped")
            if self._running is not None:
                self._running.stop("cancelled")
            self._cv.notify_all()
        self._thread.join(timeout=5)
        return not self._thread.is_alive()

    def snapshot(self) -> dict:
        with self._cv:
            return {"state": self.state, "error": self.error, "load_s": self.load_s,
                    "pending": len(self._pending), "running": self._running is not None, **self.counts}

    # -- worker thread ------------------------------------------------------------------------------
    def _abort(self, job: Job, reason: str) -> None:
        job.stop(reason)
        self.counts[reason] += 1
        if not job.future.done():
            job.future.set_exception(JobAborted(reason))

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._closed and self._loader is None and not (self._pending and self.state != "idle"):
                    self._cv.wait()
                if self._closed:
                    return
                loader, self._loader = self._loader, None
                job = None
                if loader is None:
                    job = self._pending.popleft()
                    self._running = job
            if loader is not None:
                self._do_load(loader)
                continue
            try:
                self._do_job(job)
            finally:
                with self._cv:
                    self._running = None

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
            self.load_s = time.perf_counter() - t0
        self._loaded.set()

    def _do_job(self, job: Job) -> None:
        if job.should_stop():
            with self._cv:
                self._abort(job, job.reason or "cancelled")
            return
        if not job.future.set_running_or_notify_cancel():   # cancelled through its asyncio wrapper
            return
        if self.state == "failed" or self._backend is None:
            self.counts["failed"] += 1
            job.future.set_exception(ModelUnavailable(f"the model is not available: {self.error}"))
            return
        try:
            result = job.fn(self._backend, job.should_stop)
        except BaseException as exc:  # noqa: BLE001
            log.exception("inference job failed")
            self.counts["failed"] += 1
            job.future.set_exception(exc)
            return
        self.counts["completed"] += 1
        job.future.set_result(result)
