"""Predictions: what the model says after a document's text at a cursor, reused while the person types.

A prediction belongs to one context (the text before and after the cursor). Its output grows while its run
decodes on the inference thread, and it keeps decoding past what a request showed (up to the block's end),
so that the next pause is answered from it. A later request is answered from a prediction when its context
continues the prediction's: the same text after the cursor, and the text typed since equal to the start of the
output (typed-through), or a few characters deleted back. Nothing else is asked of the model then.

    view(ctx)  -> ready (the output after what was typed is known) | pending (typed past the output so far:
                  wait for more) | diverged (typed something else) | unrelated (another context)
    answer(rest, ctx, done, ...) -> what to show now, or None to wait for more output
"""
from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable

from .prompt import CompletionContext, block_end_cut, shape_completion

MAX_BACKSPACE = 64  # characters deleted back into a prediction's context that it still answers


@dataclass(frozen=True)
class View:
    status: str  # "ready" | "pending" | "diverged" | "unrelated"
    rest: str = ""  # ready: the output after what the request's context already holds
    done: bool = False
    aborted: str | None = None  # why its run was stopped before its end (superseded, stale ...)
    prefilled_at: float | None = None  # perf_counter() when its prompt was computed (the first token known)
    typed: int = 0  # characters typed since the prediction's context
    output: int = 0  # characters of output so far

    @property
    def serves(self) -> bool:
        """Whether this prediction should answer (or keep decoding for) the context it was viewed from: it
        has something left to show, or it is decoding right where the cursor is (nothing typed past its
        start, or typed-through output it already produced). A prediction with no output yet and text typed
        since is outdated: a new one at the cursor does better."""
        if self.aborted:
            return False
        if self.status == "ready":
            return bool(self.rest.strip()) or (not self.done and (self.output > 0 or self.typed == 0))
        return self.status == "pending" and self.output > 0


class Prediction:
    """Shared between the inference thread (which publishes the output) and requests (which read it)."""

    def __init__(self, uri: str, ctx: CompletionContext, origin: str = "request"):
        self.uri = uri
        self.ctx = ctx
        self.prefix, self.suffix = ctx.prefix, ctx.suffix
        # "request" | "typing" (started by an edit or the cursor resting) | "ahead" (as if the shown
        # suggestion were accepted)
        self.origin = origin
        self.created = time.perf_counter()
        self.job = None  # rest_lsp.service.worker.Job running it
        self.text = ""
        self.done = False
        self.aborted: str | None = None
        self.stop_reason: str | None = None
        self.prefilled_at: float | None = None
        self.figures: dict = {}  # the run's tokens, steps, timings (for rest/stats)
        self.waiting = 0  # requests waiting on it now
        self.shown = 0  # answers given from it
        self.shown_end: str | None = None  # the text before the cursor once the last answer shown is taken
        self._ahead = False  # a prediction as if its text were accepted was started
        self._lock = threading.Lock()
        self._listeners: list[Callable[[], None]] = []

    # -- the inference thread ---------------------------------------------------------------------
    def publish(self, text: str, prefilled: bool, figures: dict | None = None) -> None:
        with self._lock:
            self.text = text
            if prefilled and self.prefilled_at is None:
                self.prefilled_at = time.perf_counter()
            if figures:
                self.figures = figures
            listeners = list(self._listeners)
        for wake in listeners:
            wake()

    def finish(self, stop_reason: str, aborted: str | None = None) -> None:
        with self._lock:
            self.done = True
            self.stop_reason = stop_reason
            self.aborted = aborted
            listeners = list(self._listeners)
        for wake in listeners:
            wake()

    def claim_ahead(self) -> bool:
        """True once: for the one caller that starts the prediction that follows this one."""
        with self._lock:
            first, self._ahead = not self._ahead, True
            return first

    # -- requests ---------------------------------------------------------------------------------
    def subscribe(self, wake: Callable[[], None]) -> None:
        with self._lock:
            self._listeners.append(wake)

    def unsubscribe(self, wake: Callable[[], None]) -> None:
        with self._lock:
            if wake in self._listeners:
                self._listeners.remove(wake)

    def view(self, ctx: CompletionContext) -> View:
        with self._lock:
            text, done, aborted, at = self.text, self.done, self.aborted, self.prefilled_at
        if ctx.suffix != self.suffix:
            return View("unrelated")
        if ctx.prefix.startswith(self.prefix):
            typed = ctx.prefix[len(self.prefix):]
            n = (len(typed), len(text))
            if text.startswith(typed):
                return View("ready", text[len(typed):], done, aborted, at, *n)
            if typed.startswith(text) and not done:
                return View("pending", "", done, aborted, at, *n)
            return View("diverged", "", done, aborted, at, *n)
        deleted = self.prefix[len(ctx.prefix):] if self.prefix.startswith(ctx.prefix) else None
        if deleted is not None and len(deleted) <= MAX_BACKSPACE and "\n" not in deleted:
            return View("ready", deleted + text, done, aborted, at, 0, len(text))
        return View("unrelated")

    @property
    def live(self) -> bool:
        return not self.done


def is_complete(rest: str, ctx: CompletionContext, max_lines: int) -> bool:
    """Whether more output cannot change what `rest` shows at ctx: the line ended (single-line), or
    max_lines lines, the block's end or the code after the cursor were reached (multi-line)."""
    lines = rest.split("\n")  # as shape_completion counts them: the cursor's line first
    if not ctx.multiline:
        return len(lines) > 1
    if len(lines) - 1 >= max_lines or block_end_cut(rest, ctx.block_indent()) is not None:
        return True
    stop = ctx.stop_text()
    return bool(stop) and any(ln.strip() == stop for ln in lines[1:-1])


def answer(rest: str, ctx: CompletionContext, *, done: bool, max_lines: int, partial: bool,
           whole_words: bool = True) -> str | None:
    """What to show now from `rest` (the output after the cursor), or None to wait for more: the shaped
    text once it is complete (or the output ended); with `partial`, what is decided so far (complete lines,
    and the words of the line being decoded: whole ones, or every token with whole_words=False)."""
    if done or is_complete(rest, ctx, max_lines):
        return shape_completion(rest, ctx, max_lines=max_lines, truncated=False)
    if partial:
        return shape_completion(rest, ctx, max_lines=max_lines, truncated=True, whole_words=whole_words) or None
    return None


@dataclass
class _Doc:
    predictions: list[Prediction] = field(default_factory=list)  # newest first


class PredictionStore:
    """The predictions of each document: a few per document, for the documents used last."""

    def __init__(self, per_document: int = 4, documents: int = 64):
        self.per_document = per_document
        self.documents = documents
        self._docs: OrderedDict[str, _Doc] = OrderedDict()
        self._lock = threading.Lock()

    def add(self, pred: Prediction) -> list[Prediction]:
        """Keep `pred` (newest first); returns the predictions that fell out (their jobs should stop)."""
        with self._lock:
            doc = self._docs.pop(pred.uri, None) or _Doc()
            doc.predictions.insert(0, pred)
            dropped = doc.predictions[self.per_document:]
            doc.predictions = doc.predictions[: self.per_document]
            self._docs[pred.uri] = doc
            while len(self._docs) > self.documents:
                _, old = self._docs.popitem(last=False)
                dropped += old.predictions
        return dropped

    def of(self, uri: str) -> list[Prediction]:
        with self._lock:
            doc = self._docs.get(uri)
            return list(doc.predictions) if doc else []

    def find(self, uri: str, ctx: CompletionContext) -> tuple[Prediction, View] | None:
        """The newest prediction that serves ctx (View.serves)."""
        for pred in self.of(uri):
            v = pred.view(ctx)
            if v.serves:
                return pred, v
        return None

    def forget(self, uri: str) -> list[Prediction]:
        with self._lock:
            doc = self._docs.pop(uri, None)
        return doc.predictions if doc else []

    def clear(self) -> list[Prediction]:
        with self._lock:
            out = [p for d in self._docs.values() for p in d.predictions]
            self._docs.clear()
        return out

    def all(self) -> list[Prediction]:
        with self._lock:
            return [p for d in self._docs.values() for p in d.predictions]
