"""What the model works on for a document, and in which order: predictions, warm-ups and their priorities.

    sched = Scheduler(worker, stats, settings, block_of)
    sched.edited(uri, ctx)                  # an edit or a resting cursor: stop what it contradicts, and
                                            # predict (or warm the KV cache) at the cursor, at WARM priority
    pred, source = sched.prediction_for(uri, ctx)   # a request: "cache" | "in_flight" | "new" (INTERACTIVE)
    sched.predict_ahead(pred)               # a shown suggestion: predict as if it were accepted (AHEAD)

A prediction's origin says who started it: "request" (a completion somebody waits for), "typing" (an edit,
which computes its prompt in a warm-up's small chunks so that a request pre-empts it), "ahead" (past a shown
suggestion). The worker (rest_lsp/service/worker.py) steps the lowest priority first; a request waiting on a
prediction raises it to INTERACTIVE and lowers it to AHEAD when nobody waits any more
(rest_lsp/service/answering.py).

Every prompt of a document starts its middle at the document's anchor (rest_lsp/service/layout.py
`next_anchor`) and with the document's cross-file block (`block_of(uri)`, rest_lsp/service/blocks.py): a
warm-up and the requests after it then share their prompt's start, which is what the KV cache reuses.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Callable, Optional

from .config import ServerConfig
from .crossfile import Selection
from .layout import Anchor, next_anchor
from .prediction import Prediction, PredictionStore
from .prompt import CompletionContext, PositionError, build_context
from .stats import Stats
from .worker import AHEAD, INTERACTIVE, WARM, InferenceWorker, Job

MIDDLE_CHARS = 1500  # the most text an anchored prompt middle holds (then it starts again at the cursor line)
ANCHORS_KEPT = 64  # documents whose anchor is remembered


class Scheduler:
    def __init__(self, worker: InferenceWorker, stats: Stats, settings: Callable[[], ServerConfig],
                 block_of: Callable[[str], Optional[Selection]]):
        self.worker = worker
        self.stats = stats
        self._settings = settings   # the service's configuration now (it changes with `configure`)
        self._block_of = block_of
        self.predictions = PredictionStore()
        self._anchors: OrderedDict[str, Anchor] = OrderedDict()  # where each document's prompt middle starts
        self._anchors_lock = threading.Lock()

    # -- what an edit starts ------------------------------------------------------------------------
    def edited(self, uri: str, ctx: CompletionContext) -> None:
        """Predictions the edit contradicts stop; unless a prediction still covers the cursor, the document's
        KV cache is extended there at low priority (and, predicting while typing, decoding goes on from it)."""
        cfg = self._settings()
        covered = False
        for pred in self.predictions.of(uri):
            if pred.view(ctx).serves:
                covered = True
            elif pred.live:
                self.stop(pred, "stale")  # what it predicts is no longer what comes next
        if cfg.warm_up and not covered:
            if cfg.predict_while_typing:
                self.predict(uri, ctx, origin="typing", priority=WARM)
            else:
                self.warm(uri, ctx)

    def forget(self, uri: str) -> None:
        """The document closed: its predictions and warm-ups stop."""
        self.drop(self.predictions.forget(uri), "stale")
        for job in self.worker.jobs(key=uri, kind="warm"):
            self.worker.stop(job, "stale")

    def warm(self, uri: str, ctx: CompletionContext) -> None:
        """Compute the prompt at the cursor (nothing decoded), at WARM priority; a newer warm-up replaces it."""
        for job in self.worker.jobs(key=uri, kind="warm"):
            self.worker.stop(job, "superseded")  # a running one stops after its chunk; what it computed stays
        sel = self._block_of(uri)
        stats = self.stats

        def counted(f: dict) -> None:
            stats.count("warm_tokens", f.get("computed_tokens", 0))
            stats.count("warm_forwards", f.get("forwards", 0))

        warm = self._prompt_only(uri, ctx, self.anchor(uri, ctx), sel.repo if sel is not None else None, counted)
        stats.count("warmups")
        self.worker.submit(Job(uri, warm, kind="warm", priority=WARM))

    def warm_block(self, uri: str, ctx: CompletionContext, sel: Selection, promote: Callable[[], None],
                   withdraw: Callable[[], None]) -> None:
        """Compute the prompt that starts with a new cross-file block, behind everything else (AHEAD);
        `promote` runs once it is computed, `withdraw` when the job ends without that (stopped, dropped)."""
        for job in self.worker.jobs(key=uri, kind="context"):
            self.worker.stop(job, "superseded")
        stats = self.stats
        warm = self._prompt_only(uri, ctx, self.kept_anchor(uri), sel.repo,
                                 lambda f: stats.count("context_warm_tokens", f.get("computed_tokens", 0)),
                                 then=promote)
        job = Job(uri, warm, kind="context", priority=AHEAD)
        job.future.add_done_callback(lambda f: withdraw())
        self.worker.submit(job)

    def _prompt_only(self, uri: str, ctx: CompletionContext, anchor: int | None, repo,
                     counted: Callable[[dict], None], then: Callable[[], None] | None = None):
        """A job computing a prompt without decoding, one chunk per step; `counted(figures)` when it ends,
        `then()` only once the whole prompt is computed."""
        cfg = self._settings()

        def warm(backend):
            run = backend.start(uri, ctx, cfg, purpose="warm", anchor=anchor, repo=repo)
            try:
                while not run.done:
                    backend.advance(run)
                    yield
                if then is not None:
                    then()
            finally:
                backend.stop(run, "stopped")
                counted(backend.figures(run))

        return warm

    # -- predictions ----------------------------------------------------------------------------------
    def prediction_for(self, uri: str, ctx: CompletionContext) -> tuple[Prediction, str]:
        """The prediction that answers this context and where it came from: "cache" (done), "in_flight", or
        "new" (the document's other live predictions are stopped for it)."""
        found = self.predictions.find(uri, ctx)
        if found is not None:
            return found[0], ("cache" if found[1].done else "in_flight")
        for pred in self.predictions.of(uri):
            if pred.live:
                self.stop(pred, "superseded")
        return self.predict(uri, ctx, origin="request", priority=INTERACTIVE), "new"

    def predict(self, uri: str, ctx: CompletionContext, *, origin: str, priority: int) -> Prediction:
        pred = Prediction(uri, ctx, origin)
        cfg, stats = self._settings(), self.stats
        anchor = self.anchor(uri, ctx)
        sel = self._block_of(uri)
        pred.context = sel
        repo = sel.repo if sel is not None else None
        # a prediction started by a key computes its prompt in a warm-up's small chunks: a request pre-empts it;
        # one ahead stops mid-prompt at a key that contradicts the suggestion its prompt holds
        purpose = {"typing": "typing", "ahead": "ahead"}.get(origin, "predict")

        def predict(backend):
            run = backend.start(uri, ctx, cfg, purpose=purpose, anchor=anchor, repo=repo)
            aborted = "stopped"
            try:
                while not run.done:
                    # a key that makes this prediction moot stops its job: a decoding step in flight ends at its
                    # next layer, so the key's own prediction waits a layer, not a step
                    backend.advance(run, interrupt=lambda: pred.job.stopped)
                    pred.publish(run.text, run.prefilled, backend.figures(run))
                    yield
                aborted = None
            finally:
                backend.stop(run, aborted or "stopped")
                f = backend.figures(run)
                pred.publish(run.text, run.prefilled, f)
                pred.finish(f.get("stop_reason") or "stopped", aborted=(pred.job.reason or aborted) if aborted else None)
                stats.record_run(f, wasted=aborted is not None and pred.shown == 0)
            if pred.shown:
                self.predict_ahead(pred)

        pred.job = job = Job(uri, predict, kind="predict", priority=priority)
        # a job stopped before its first step (or failing in it) never runs its `finally`: its waiters must
        # still hear of it
        job.future.add_done_callback(lambda f: pred.done or pred.finish(
            "stopped", aborted=job.reason or ("error" if f.exception() is not None else "dropped")))
        self.drop(self.predictions.add(pred), "dropped")
        stats.count({"request": "predictions", "typing": "typing_predictions"}.get(origin, "ahead_predictions"))
        self.worker.submit(job)
        return pred

    def predict_ahead(self, pred: Prediction) -> None:
        """The continuation as if the shown suggestion were accepted (its text inserted at the cursor): once a
        prediction has ended and been shown through its end (called from both sides; the first call wins). A
        suggestion shown short of the prediction's end (its first line of several) gets none: taking it leaves
        the cursor short of where that prediction would start, and the first key would stop it as stale
        (`edited`), after its prompt's forwards (on the AVX2 EPYC none of 128 was shown, docs/daemon.md)."""
        text = pred.prefix + pred.text
        if not (self._settings().predict_ahead and pred.done and not pred.aborted and pred.text.strip()) \
                or not reaches(pred.shown_end, text) or not pred.claim_ahead():
            return
        line = text.count("\n")
        column = len(text) - text.rfind("\n") - 1
        try:
            ctx = build_context(text + pred.suffix, line, column)
        except PositionError:
            return
        if self.predictions.find(pred.uri, ctx) is None:
            self.predict(pred.uri, ctx, origin="ahead", priority=AHEAD)

    def stop(self, pred: Prediction, reason: str) -> None:
        if pred.job is not None and pred.live:
            self.worker.stop(pred.job, reason)

    def drop(self, preds: list[Prediction], reason: str) -> None:
        for pred in preds:
            self.stop(pred, reason)

    # -- where a document's prompt middle starts ------------------------------------------------------
    def anchor(self, uri: str, ctx: CompletionContext) -> int | None:
        """Where the document's prompt middle starts for this cursor (the same for a warm-up and the requests
        after it: rest_lsp/service/layout.py `next_anchor`)."""
        cfg = self._settings()
        if cfg.middle_lines <= 0:
            return None
        with self._anchors_lock:
            anchor = next_anchor(ctx, self._anchors.pop(uri, None), cfg.middle_lines, MIDDLE_CHARS)
            self._anchors[uri] = anchor
            while len(self._anchors) > ANCHORS_KEPT:
                self._anchors.popitem(last=False)
        return anchor.offset

    def kept_anchor(self, uri: str) -> int | None:
        """The document's anchor as typing left it, read and not moved: a background job whose cursor typing
        may have passed must not change the next prompts' middle."""
        if self._settings().middle_lines <= 0:
            return None
        with self._anchors_lock:
            kept = self._anchors.get(uri)
        return kept.offset if kept is not None else None


def reaches(taken: str | None, end: str) -> bool:
    """Whether taking a suggestion (`taken`: the text before the cursor then) leaves the cursor at `end` but for
    blanks still to type (the Enter after a line)."""
    return taken is not None and end.startswith(taken) and not end[len(taken):].strip()
