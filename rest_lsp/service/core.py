"""What the daemon does per request and per edit, without LSP plumbing.

    service = CompletionService(config, backend_factory)
    service.start()                                   # loads the model on the inference thread
    service.document_changed(uri, text, line, col)    # didOpen/didChange/rest/cursor: warm the KV cache there
    response = await service.complete(CompletionRequest(...))

Latency first (docs/daemon.md):
- a completion is answered from a prediction when its context continues one (the person typed what the model
  said, or deleted back): no model call (`PredictionStore`);
- otherwise a new prediction starts at once, pre-empting warm-ups; an Automatic request is answered with the
  first line (or words) as soon as the prompt budget and predict budget allow, never empty for want of time
  once a visible token is decided; the prediction keeps decoding in the background (up to the block's end) and
  a finished prediction that was shown is followed by one as if its text were accepted;
- while the person types, each edit extends the document's KV cache at the cursor at low priority and goes
  on decoding from there (`predict_while_typing`), so the next request has little prompt left to compute and
  usually finds its suggestion decided;
- budgets start when the model can work (a request made while it loads is answered after the load).

`backend_factory(config, repository) -> Backend` runs on the inference thread (rest_lsp/service/backend.py).
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol

from .config import MODEL_KEYS, ModelLimits, ServerConfig, check_against_model, cross_file_budget, merge
from .crossfile import ContextKeeper, Cursor, RepoView, Selection, select as select_context
from .datastores import DatastoreSet
from .layout import Anchor, next_anchor
from .prediction import Prediction, PredictionStore, View, answer
from .prompt import CompletionContext, PositionError, Selected, build_context, shape_completion
from .stats import Stats
from .worker import AHEAD, INTERACTIVE, WARM, InferenceWorker, Job, JobAborted, ModelUnavailable
from .workspace import uri_to_path

log = logging.getLogger(__name__)

SAMPLING_TEMPERATURE = 0.8  # the alternatives of an Invoked request
ALTERNATIVES_MARGIN_S = 0.1  # about one decoding step on a CPU: the alternatives end this far before the budget
# the budget is what the editor sees: waking the event loop (the inference thread holds the GIL between torch
# calls), shaping and writing the reply took 3 ms past a 1,500 ms budget in bench_typing's Invoked check
REPLY_MARGIN_S = 0.02
MIDDLE_CHARS = 1500  # the most text an anchored prompt middle holds (then it starts again at the cursor line)
POLL_S = 0.1  # how often a request waiting for the model to load looks again


class ServiceError(Exception):
    """A request the service cannot answer; code is "invalid_params", "model_unavailable" or "internal"."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


@dataclass
class CompletionRequest:
    uri: str
    text: str
    line: int  # 0-based, code points
    column: int
    automatic: bool = True
    selected: Selected | None = None
    language: str | None = None
    version: int | None = None  # the document's version the client gave (handed back in `on_ready`)


@dataclass
class Item:
    text: str
    start: tuple[int, int]
    end: tuple[int, int]


@dataclass
class CompletionResponse:
    items: list[Item]
    record: dict = field(default_factory=dict)


class RunLike(Protocol):
    """What the service reads of an engine run (rest_lsp.engine.Run)."""

    done: bool
    prefilled: bool
    text: str


class Backend(Protocol):
    """The model behind the service (rest_lsp/service/backend.py); every call runs on the inference thread."""

    name: str

    def start(self, key: str, ctx: CompletionContext, config: ServerConfig, *, purpose: str = "predict",
              temperature: float = 0.0, seed: int | None = None, anchor: int | None = None,
              repo: Any = None) -> RunLike: ...
    # purpose: "predict" (greedy, drafts unless draft_budget is 0), "warm" (prompt only), "sample";
    # repo: the cross-file block the prompt starts with (rest_lsp/model/prompts.py RepoContext)

    def advance(self, run: RunLike) -> None: ...

    def stop(self, run: RunLike, reason: str) -> None: ...

    def figures(self, run: RunLike) -> dict: ...

    def limits(self) -> ModelLimits: ...  # what the model allows the settings

    def describe(self) -> dict: ...


def looks_binary(text: str) -> bool:
    head = text[:8192]
    return "\x00" in head or (bool(head) and sum(ch < " " and ch not in "\t\n\r\f\v\x1b" for ch in head)
                              > len(head) // 10)


class CompletionService:
    def __init__(self, config: ServerConfig | None = None,
                 backend_factory: Callable[[ServerConfig, DatastoreSet], Backend] | None = None,
                 notify: Callable[[str, str], None] | None = None):
        self.config = config or ServerConfig()
        if backend_factory is None:
            from .backend import load_backend as backend_factory
        self._factory = backend_factory
        self._notify = notify or (lambda level, msg: None)
        self.worker: InferenceWorker[Backend] = InferenceWorker(self.config.queue_size)
        self.predictions = PredictionStore()
        self.repository = DatastoreSet()  # workspace datastores; rest_lsp/service/workspace.py fills it
        self.stats = Stats()
        self.on_model_ready: list[Callable[[Backend], None]] = []  # run on the inference thread
        self.model_limits: ModelLimits | None = None  # the loaded model's, once it is loaded
        self._waiters: dict[str, list[_Waiter]] = {}  # requests waiting for an answer, per document
        # set by the protocol layer when the client asks again on it (LSP: rest/suggestionReady): an Automatic
        # request that got nothing for want of time is followed by this call once its suggestion is decided
        self.on_ready: Callable[[CompletionRequest], None] | None = None
        self._watches: set[asyncio.Task] = set()
        self._anchors: OrderedDict[str, Anchor] = OrderedDict()  # where each document's prompt middle starts
        self._anchors_lock = threading.Lock()
        # cross-file context (rest_lsp/service/crossfile.py): one block per document, selected on a thread of
        # its own (the latest request per document), its prompt computed in the background before it is used
        self.crossfile = ContextKeeper()
        self._views: dict[str, RepoView] = {}
        self._places: OrderedDict[str, tuple[str, int, int]] = OrderedDict()  # uri -> (text, line, column)
        self._active: str | None = None
        self._selecting: dict[str, tuple] = {}   # uri -> the latest (text, ctx) to select for
        self._selecting_lock = threading.Lock()
        self._selector = ThreadPoolExecutor(1, thread_name_prefix="rest-lsp-context")
        self._apply_log_path()

    # -- lifecycle and configuration --------------------------------------------------------------
    def start(self) -> None:
        self._load_model()

    def _load_model(self) -> None:
        cfg = self.config

        def load() -> Backend:
            t0 = time.perf_counter()
            self._notify("info", f"loading model {cfg.model or '(embedded default)'} "
                                 f"on {cfg.device}, precision {cfg.precision}")
            try:
                backend = self._factory(cfg, self.repository)
            except BaseException as exc:
                self._notify("error", f"model failed to load: {type(exc).__name__}: {exc}")
                raise
            self._notify("info", f"model {backend.name} ready in {time.perf_counter() - t0:.1f} s")
            self._check_settings(backend.limits())
            corpus_error = backend.describe().get("corpus") if cfg.corpus else None
            if corpus_error not in (None, "loaded"):
                self._notify("problem", f"the corpus {cfg.corpus} is not used: {corpus_error}")
            for callback in list(self.on_model_ready):
                callback(backend)
            return backend

        self._drop_predictions(self.predictions.clear(), "superseded")
        self.worker.load(load)

    def _check_settings(self, limits: ModelLimits) -> None:
        """Fit the settings to the model just loaded (ModelLimits); what had to change is shown."""
        self.model_limits = limits
        self.config, problems = check_against_model(self.config, limits)
        for p in problems:
            self._notify("problem", f"configuration: {p}")
        self.stats.config_problems = problems

    def configure(self, settings: Any) -> tuple[set[str], list[str]]:
        """Apply settings; returns (changed setting names, problems). Model settings reload the model."""
        new, changed, problems = merge(self.config, settings)
        if self.model_limits is not None and not changed & MODEL_KEYS:   # a new model is checked once loaded
            new, more = check_against_model(new, self.model_limits)
            changed = {k for k in vars(new) if getattr(new, k) != getattr(self.config, k)}
            problems += more
            self.stats.config_problems = more
        for p in problems:
            self._notify("problem", f"configuration: {p}")
        self.config = new
        self.worker.queue_size = max(1, new.queue_size)
        if changed & (MODEL_KEYS | {"corpus"}) and self.worker.state != "idle":  # idle: start() loads it
            self._load_model()
        elif changed & {"max_tokens", "max_lines", "draft_budget", "max_prefix_chars", "max_suffix_chars", "layout"}:
            self._drop_predictions(self.predictions.clear(), "stale")
        if "request_log" in changed:
            self._apply_log_path()
        if changed:
            self._notify("info", "configuration changed: " + ", ".join(sorted(changed)))
        return changed, problems

    def _apply_log_path(self) -> None:
        path = self.config.request_log
        self.stats.request_log = Path(path).expanduser() if path else None

    def close(self) -> None:
        self._selector.shutdown(wait=False, cancel_futures=True)
        stopped = self.worker.close()
        backend = self.worker.backend
        if stopped and backend is not None and hasattr(backend, "close"):
            backend.close()

    # -- edits and the cursor: keep the KV cache warm where the person types ------------------------
    def document_changed(self, uri: str, text: str, line: int | None, column: int | None,
                         language: str | None = None) -> None:
        """An edit (didOpen/didChange) with the cursor where it left it, or the cursor resting (rest/cursor).
        Predictions the edit contradicts stop; unless a prediction still covers the cursor, the document's KV
        cache is extended there at low priority. No position (nothing changed): nothing to warm."""
        if line is None or column is None or not self._serves(language, text):
            return
        try:
            ctx = build_context(text, line, column)
        except PositionError:
            return
        self._note_place(uri, text, ctx)
        covered = False
        for pred in self.predictions.of(uri):
            v = pred.view(ctx)
            if v.serves:
                covered = True
            elif pred.live:
                self._stop_prediction(pred, "stale")  # what it predicts is no longer what comes next
        if self.config.warm_up and not covered:
            if self.config.predict_while_typing:
                self._predict(uri, ctx, origin="typing", priority=WARM)
            else:
                self._warm(uri, ctx)

    def cursor_rested(self, uri: str, text: str, line: int, column: int, language: str | None = None) -> None:
        self.stats.count("cursor_notifications")
        self.document_changed(uri, text, line, column, language)

    def document_saved(self, uri: str) -> None:
        """A save: the place joins the recent-files ring and the document's block is selected again."""
        place = self._places.get(uri)
        if place is None or not self.config.cross_file:
            return
        text, line, column = place
        self._remember(uri, text, line)
        try:
            self._request_selection(uri, text, build_context(text, line, column))
        except PositionError:
            pass

    def document_closed(self, uri: str) -> None:
        self.crossfile.forget(uri)
        self._places.pop(uri, None)
        self._drop_predictions(self.predictions.forget(uri), "stale")
        for job in self.worker.jobs(key=uri, kind="warm"):
            self.worker.stop(job, "stale")

    def _serves(self, language: str | None, text: str) -> bool:
        langs = self.config.languages
        return (langs is None or language in langs) and not looks_binary(text)

    def _warm(self, uri: str, ctx: CompletionContext) -> None:
        for job in self.worker.jobs(key=uri, kind="warm"):
            self.worker.stop(job, "superseded")  # a running one stops after its chunk; what it computed stays
        cfg = self.config
        stats = self.stats

        repo = self.repo_for(uri)

        def warm(backend: Backend):
            run = backend.start(uri, ctx, cfg, purpose="warm", anchor=anchor, repo=repo)
            try:
                while not run.done:
                    backend.advance(run)
                    yield
            finally:
                backend.stop(run, "stopped")
                f = backend.figures(run)
                stats.count("warm_tokens", f.get("computed_tokens", 0))
                stats.count("warm_forwards", f.get("forwards", 0))

        anchor = self._anchor(uri, ctx)
        self.stats.count("warmups")
        self.worker.submit(Job(uri, warm, kind="warm", priority=WARM))

    # -- cross-file context (rest_lsp/service/crossfile.py) ------------------------------------------
    def repo_for(self, uri: str):
        """The block the document's prompts start with now (None: none yet, or cross-file context is off)."""
        if not self.config.cross_file:
            return None
        sel = self.crossfile.current(uri)
        return sel.repo if sel is not None else None

    def _remember(self, uri: str, text: str, line: int) -> None:
        path = uri_to_path(uri)
        if path is not None:
            self.crossfile.ring.add(str(path), text, line)

    def _note_place(self, uri: str, text: str, ctx: CompletionContext) -> None:
        """Where the person is. Leaving a file puts its place into the recent-files ring; a file switch or a new
        name at the cursor asks for a new selection (a keystroke otherwise keeps the block)."""
        if not self.config.cross_file:
            return
        prev = self._active
        if prev is not None and prev != uri and prev in self._places:
            ptext, pline, _ = self._places[prev]
            self._remember(prev, ptext, pline)
        self._active = uri
        self._places[uri] = (text, ctx.line, ctx.column)
        self._places.move_to_end(uri)
        while len(self._places) > 64:
            self._places.popitem(last=False)
        line_after = ctx.suffix.split("\n", 1)[0]
        if prev != uri or self.crossfile.new_names(uri, ctx.prefix, line_after):
            self._request_selection(uri, text, ctx)

    def _request_selection(self, uri: str, text: str, ctx: CompletionContext) -> None:
        """Select the document's block on the selection thread; only the latest request of a document runs."""
        with self._selecting_lock:
            first = uri not in self._selecting
            self._selecting[uri] = (text, ctx)
        if first:
            try:
                self._selector.submit(self._select, uri)
            except RuntimeError:  # shut down
                self._selecting.pop(uri, None)

    def _select(self, uri: str) -> None:
        with self._selecting_lock:
            text, ctx = self._selecting.pop(uri, (None, None))
        backend = self.worker.backend
        if text is None or backend is None:
            return
        try:
            t0 = time.perf_counter()
            sel = self.selection_for(backend, uri, text, ctx)
            self.stats.count("context_selections")
            self.stats.count("context_select_ms", round((time.perf_counter() - t0) * 1000))
        except Exception:  # noqa: BLE001 - completions go on with the block they have
            log.exception("cross-file selection failed for %s", uri)
            return
        if sel is not None and self.crossfile.offer(uri, sel):
            self._warm_context(uri, ctx, sel)

    def selection_for(self, backend, uri: str, text: str, ctx: CompletionContext) -> Selection | None:
        """The cross-file block for a cursor, from the workspace datastores the service holds now."""
        encode, decode = text_codec(backend)
        loaded = getattr(backend, "loaded", None)
        device = getattr(getattr(loaded, "device", None), "type", "cpu")
        views = []
        for key in self.repository.keys():
            store = self.repository.get(key)
            if store is None or not hasattr(store, "documents"):
                continue
            view = self._views.get(key)
            if view is None or view.store is not store:
                view = self._views[key] = RepoView(Path(key), store, encode, decode)
            views.append(view)
        path = uri_to_path(uri)
        cur = Cursor(str(path) if path is not None else None, ctx.prefix, ctx.suffix.split("\n", 1)[0], text)
        return select_context(views, cur, budget=cross_file_budget(self.config, device),
                              selectors=self.config.cross_file_selectors, ring=self.crossfile.ring, encode=encode)

    def use_context_now(self, uri: str, text: str, ctx: CompletionContext) -> Selection | None:
        """Select the document's block here and use it from the next prompt on (a one-shot completion, the
        benchmarks: nothing to keep warm). The model must be loaded."""
        backend = self.worker.backend
        if not self.config.cross_file or backend is None:
            return None
        self._active = uri
        self._places[uri] = (text, ctx.line, ctx.column)
        sel = self.selection_for(backend, uri, text, ctx)
        if sel is not None:
            self.crossfile.set_current(uri, sel)
        return sel

    def _warm_context(self, uri: str, ctx: CompletionContext, sel: Selection) -> None:
        """Compute the prompt with the new block behind everything else; it becomes the document's block only
        when that is done, so no keystroke waits for it."""
        for job in self.worker.jobs(key=uri, kind="context"):
            self.worker.stop(job, "superseded")
        cfg = self.config
        stats = self.stats
        # the document's anchor as typing left it, read and not moved: this runs on the selection thread with a
        # cursor that typing may have passed since, and moving the anchor would change the next prompts' middle
        with self._anchors_lock:
            kept = self._anchors.get(uri)
        anchor = kept.offset if kept is not None and cfg.middle_lines > 0 else None

        def warm(backend: Backend):
            run = backend.start(uri, ctx, cfg, purpose="warm", anchor=anchor, repo=sel.repo)
            try:
                while not run.done:
                    backend.advance(run)
                    yield
                self.crossfile.promote(uri, sel)
            finally:
                backend.stop(run, "stopped")
                stats.count("context_warm_tokens", backend.figures(run).get("computed_tokens", 0))

        job = Job(uri, warm, kind="context", priority=AHEAD)
        # stopped or dropped before the block was computed: it is not pending any more, so that the next
        # selection offers it again instead of finding it "unchanged"
        job.future.add_done_callback(lambda f: self.crossfile.withdraw(uri, sel))
        self.worker.submit(job)

    # -- predictions ------------------------------------------------------------------------------
    def _predict(self, uri: str, ctx: CompletionContext, *, origin: str, priority: int) -> Prediction:
        pred = Prediction(uri, ctx, origin)
        cfg = self.config
        stats = self.stats
        anchor = self._anchor(uri, ctx)
        sel = self.crossfile.current(uri) if cfg.cross_file else None
        pred.context = sel
        repo = sel.repo if sel is not None else None

        # a prediction started by a key computes its prompt in a warm-up's small chunks: a request pre-empts it
        purpose = "typing" if origin == "typing" else "predict"

        def predict(backend: Backend):
            run = backend.start(uri, ctx, cfg, purpose=purpose, anchor=anchor, repo=repo)
            aborted = "stopped"
            try:
                while not run.done:
                    backend.advance(run)
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
                self._predict_ahead(pred)

        pred.job = job = Job(uri, predict, kind="predict", priority=priority)
        # a job stopped before its first step (or failing in it) never runs its `finally`: its waiters must
        # still hear of it
        job.future.add_done_callback(lambda f: pred.done or pred.finish(
            "stopped", aborted=job.reason or ("error" if f.exception() is not None else "dropped")))
        self._drop_predictions(self.predictions.add(pred), "dropped")
        counter = {"request": "predictions", "typing": "typing_predictions"}.get(origin, "ahead_predictions")
        self.stats.count(counter)
        self.worker.submit(pred.job)
        return pred

    def _predict_ahead(self, pred: Prediction) -> None:
        """The continuation as if the shown suggestion were accepted (its text inserted at the cursor): once a
        prediction has ended and been shown (called from both sides; the first call wins)."""
        if not (self.config.predict_ahead and pred.done and not pred.aborted and pred.text.strip()) \
                or not pred.claim_ahead():
            return
        text = pred.prefix + pred.text
        line = text.count("\n")
        column = len(text) - text.rfind("\n") - 1
        try:
            ctx = build_context(text + pred.suffix, line, column)
        except PositionError:
            return
        if self.predictions.find(pred.uri, ctx) is None:
            self._predict(pred.uri, ctx, origin="ahead", priority=AHEAD)

    def _anchor(self, uri: str, ctx: CompletionContext) -> int | None:
        """Where the document's prompt middle starts for this cursor (the same for a warm-up and the requests
        after it: rest_lsp/service/layout.py `next_anchor`)."""
        cfg = self.config
        if cfg.middle_lines <= 0:
            return None
        with self._anchors_lock:
            anchor = next_anchor(ctx, self._anchors.pop(uri, None), cfg.middle_lines, MIDDLE_CHARS)
            self._anchors[uri] = anchor
            while len(self._anchors) > 64:
                self._anchors.popitem(last=False)
        return anchor.offset

    def _stop_prediction(self, pred: Prediction, reason: str) -> None:
        if pred.job is not None and pred.live:
            self.worker.stop(pred.job, reason)

    def _drop_predictions(self, preds: list[Prediction], reason: str) -> None:
        for pred in preds:
            self._stop_prediction(pred, reason)

    # -- requests ---------------------------------------------------------------------------------
    async def complete(self, req: CompletionRequest) -> CompletionResponse:
        t0 = time.perf_counter()
        rec: dict[str, Any] = {"id": self.stats.new_id(), "uri": req.uri, "line": req.line,
                               "column": req.column, "trigger": "automatic" if req.automatic else "invoked",
                               "time": round(time.time(), 3)}

        def finish(outcome: str, items: list[Item], **extra) -> CompletionResponse:
            rec.update(extra, outcome=outcome, items=len(items),
                       latency_ms=round((time.perf_counter() - t0) * 1000, 2))
            self.stats.record(rec)
            return CompletionResponse(items, rec)

        skipped = self._skip_reason(req)
        if skipped is not None:
            return finish("skipped", [], reason=skipped)
        ctx = self._request_context(req, finish)
        rec["mode"] = "multi" if ctx.multiline else "single"
        self._note_place(req.uri, req.text, ctx)
        self._supersede_waiters(req.uri)  # a newer request wins over older ones still waiting (Neovim
        # does not cancel them)
        pred, source = self._prediction_for(req.uri, ctx)
        rec["source"], rec["model_call"] = source, source == "new"
        sel = getattr(pred, "context", None)
        rec["context"] = {"tokens": sel.tokens, "snippets": sel.describe()} if sel is not None else None
        text, why = await self._wait_as_waiter(req, ctx, pred, t0, finish, self._new_waiter(req.uri))
        if not text and why in ("prompt_budget", "time") and self.on_ready is not None:
            self._watch(req, ctx, pred)
            rec["watched"] = True
        if why in ("superseded", "stale", "dropped"):
            return finish("superseded" if why == "stale" else why, [])
        if why == "unavailable":
            finish("error", [], reason=self.worker.error)
            raise ServiceError("model_unavailable", f"the model is not available: {self.worker.error}")
        texts = await self._shown_texts(req, ctx, pred, text, t0)
        items = [Item(ctx.lead + t, ctx.range_start, (ctx.line, ctx.column)) for t in texts]
        figures = dict(pred.figures) if source == "new" else {}
        outcome = {"new": "completed", "in_flight": "reused", "cache": "cache"}[source] if items else "empty"
        return finish(outcome, items, answer=why, chars=len(texts[0]) if texts else 0,
                      raw=pred.text, prediction_age_ms=round((t0 - pred.created) * 1000, 1), **figures)

    def _skip_reason(self, req: CompletionRequest) -> str | None:
        """Why this document gets no completion (a language not served, binary content), or None."""
        if self._serves(req.language, req.text):
            return None
        if self.config.languages is not None and req.language not in self.config.languages:
            return f"language {req.language!r} not in languages"
        self._notify("info", f"{req.uri}: binary content, no completion")
        return "binary content"

    def _request_context(self, req: CompletionRequest, finish: Callable[..., CompletionResponse]) -> CompletionContext:
        """The request's context; a bad position or a failed model is recorded and raised as ServiceError."""
        try:
            ctx = build_context(req.text, req.line, req.column, req.selected)
        except PositionError as exc:
            finish("error", [], reason=str(exc))
            raise ServiceError("invalid_params", str(exc)) from exc
        if self.worker.state == "failed":
            finish("error", [], reason=self.worker.error)
            raise ServiceError("model_unavailable", f"the model is not available: {self.worker.error}")
        return ctx

    def _prediction_for(self, uri: str, ctx: CompletionContext) -> tuple[Prediction, str]:
        """The prediction that answers this context and where it came from: "cache" (done), "in_flight", or
        "new" (the document's other live predictions are stopped for it)."""
        found = self.predictions.find(uri, ctx)
        if found is not None:
            return found[0], ("cache" if found[1].done else "in_flight")
        for pred in self.predictions.of(uri):
            if pred.live:
                self._stop_prediction(pred, "superseded")
        return self._predict(uri, ctx, origin="request", priority=INTERACTIVE), "new"

    def _new_waiter(self, uri: str) -> _Waiter:
        """A waiter of the document, which a newer request supersedes (registered before any await)."""
        waiter = _Waiter()
        self._waiters.setdefault(uri, []).append(waiter)
        return waiter

    async def _wait_as_waiter(self, req: CompletionRequest, ctx: CompletionContext, pred: Prediction,
                              t0: float, finish: Callable[..., Any], waiter: _Waiter,
                              budgets: bool = True) -> tuple[str, str]:
        """`_await_answer` with the request counted as waiting on `pred` (its job at interactive priority
        meanwhile) and as `waiter` (from `_new_waiter`, removed here); failures recorded and raised as
        ServiceError."""
        pred.waiting += 1
        if pred.live:
            self.worker.set_priority(pred.job, INTERACTIVE)
        try:
            text, why = await self._await_answer(pred, ctx, req.automatic, t0, waiter, budgets)
            if why == "error":  # the model run failed: the request gets the reason, the log the traceback
                raise pred.job.future.exception() or RuntimeError("the prediction failed")
            return text, why
        except asyncio.CancelledError:
            finish("cancelled", [])
            raise
        except Exception as exc:  # noqa: BLE001 - counted with its reason; never a traceback in the reply
            log.error("completion failed", exc_info=exc)
            why = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"
            finish("error", [], reason=why)
            raise ServiceError("internal", f"the completion failed: {why}") from exc
        finally:
            self._waiters[req.uri].remove(waiter)
            if not self._waiters[req.uri]:
                del self._waiters[req.uri]
            pred.waiting -= 1
            if pred.live and pred.waiting == 0:
                self.worker.set_priority(pred.job, AHEAD)  # go on predicting, behind everything else

    def _watch(self, req: CompletionRequest, ctx: CompletionContext, pred: Prediction) -> None:
        """An Automatic request got nothing for want of time (the prompt still computing on a busy CPU): its
        prediction goes on at interactive priority and, once it can answer at this place, `on_ready` tells the
        client, which asks again and is answered from the prediction instead of showing nothing until the next
        key. A newer request of the document ends the watch; so does a stopped prediction (an edit)."""
        waiter = self._new_waiter(req.uri)

        async def watch() -> None:
            try:
                text, _ = await self._wait_as_waiter(req, ctx, pred, time.perf_counter(), _ignore, waiter,
                                                     budgets=False)
            except ServiceError:
                return
            if text and not waiter.superseded and self.on_ready is not None:
                self.stats.count("ready_notices")
                self.on_ready(req)

        task = asyncio.ensure_future(watch())
        self._watches.add(task)
        task.add_done_callback(self._watches.discard)

    async def _shown_texts(self, req: CompletionRequest, ctx: CompletionContext, pred: Prediction, text: str,
                           t0: float) -> list[str]:
        """What the editor shows: the answer, sampled alternatives for an Invoked request; a shown answer
        starts the prediction of what follows it."""
        texts = [text] if text else []
        if not req.automatic and self.config.alternatives > 1 and texts:
            texts += await self._alternatives(req.uri, ctx, texts, t0)
        if texts:
            pred.shown += 1
            self._predict_ahead(pred)
        return texts

    def _supersede_waiters(self, uri: str) -> None:
        for waiter in self._waiters.get(uri, ()):
            waiter.superseded = True
            waiter.changed.set()

    async def _await_answer(self, pred: Prediction, ctx: CompletionContext, automatic: bool,
                            arrived: float, waiter: _Waiter, budgets: bool = True) -> tuple[str, str]:
        """(text to show, why now): "complete", "partial" (the predict budget ran out), "time", "prompt_budget",
        "superseded" (a newer request for the document came), or why the prediction was stopped. Without
        `budgets`, no prompt or time budget: it waits for the first line or words as long as the prediction
        runs."""
        cfg = self.config
        prompt_ms = cfg.prompt_budget_ms if budgets else 0
        time_ms = cfg.time_budget_ms if budgets else 0
        loop = asyncio.get_running_loop()
        changed = waiter.changed

        def wake() -> None:
            loop.call_soon_threadsafe(changed.set)

        pred.subscribe(wake)
        try:
            while True:
                changed.clear()
                if waiter.superseded:
                    return "", "superseded"
                now = time.perf_counter()
                v = pred.view(ctx)
                if v.aborted:  # a newer request or an edit made it moot
                    return "", v.aborted
                if v.status in ("diverged", "unrelated"):
                    return "", "superseded"
                if self.worker.state == "failed":
                    return "", "unavailable"
                ans = answer(v.rest, ctx, done=v.done, max_lines=cfg.max_lines, partial=False) \
                    if v.status == "ready" else None
                if ans is not None:
                    return ans, "complete"
                ready_at = self.worker.ready_at
                if ready_at is None:  # the model is loading: budgets start once it can work
                    await wait_for_event(changed, POLL_S)
                    continue
                start = max(arrived, ready_at)
                budget_end = start + time_ms / 1000 - REPLY_MARGIN_S
                deadlines = [budget_end] if time_ms else []
                if automatic and v.prefilled_at is None and prompt_ms:
                    if now >= start + prompt_ms / 1000:
                        return "", "prompt_budget"  # the prompt goes on computing: the next request gains
                    deadlines.append(start + prompt_ms / 1000)
                if v.prefilled_at is not None and automatic and cfg.predict_budget_ms:
                    at = max(start, v.prefilled_at) + cfg.predict_budget_ms / 1000
                    if now >= at and v.status == "ready":
                        part = answer(v.rest, ctx, done=False, max_lines=cfg.max_lines, partial=True)
                        if part:
                            return part, "partial"
                    deadlines.append(at)
                if time_ms and now >= budget_end:
                    # never empty for want of time once a visible token is decided
                    shown = shape_completion(v.rest, ctx, max_lines=cfg.max_lines, truncated=False) \
                        if v.status == "ready" else ""
                    if shown or automatic:
                        return shown, "time"
                future = [d for d in deadlines if d > now]
                await wait_for_event(changed, (min(future) - now) if future else POLL_S)
        finally:
            pred.unsubscribe(wake)

    async def _alternatives(self, uri: str, ctx: CompletionContext, have: list[str], arrived: float) -> list[str]:
        """Sampled completions for an Invoked request, within what is left of its time budget."""
        cfg = self.config
        out: list[str] = []
        anchor = self._anchor(uri, ctx)
        # the whole answer within the request's time budget (from when the model could work on it), so the
        # sampling stops a step's margin before it
        start = max(arrived, self.worker.ready_at or arrived)
        end = start + cfg.time_budget_ms / 1000 - ALTERNATIVES_MARGIN_S if cfg.time_budget_ms else None
        for seed in range(1, cfg.alternatives):
            if end is not None and end - time.perf_counter() <= 0.05:
                break
            deadline = end
            repo = self.repo_for(uri)

            def sample(backend: Backend, seed=seed, deadline=deadline):
                run = backend.start(uri, ctx, cfg, purpose="sample", temperature=SAMPLING_TEMPERATURE, seed=seed,
                                    anchor=anchor, repo=repo)
                try:
                    while not run.done and (deadline is None or time.perf_counter() < deadline):
                        backend.advance(run)
                        yield
                finally:
                    backend.stop(run, "time")
                return run.text, run.done

            job = self.worker.submit(Job(uri, sample, kind="sample"))
            try:
                raw, complete = await asyncio.shield(asyncio.wrap_future(job.future))
            except asyncio.CancelledError:
                self.worker.stop(job, "cancelled")
                raise
            except (JobAborted, ModelUnavailable):
                break
            t = shape_completion(raw, ctx, max_lines=cfg.max_lines, truncated=not complete)
            if t and t not in have and t not in out:
                out.append(t)
        return out

    def snapshot(self, last: int = 20) -> dict:
        s = self.stats.snapshot(last)
        s["model"] = self.worker.snapshot()
        backend = self.worker.backend
        if backend is not None:
            s["model"].update(backend.describe())
        preds = self.predictions.all()
        s["predictions"] = {"kept": len(preds), "live": sum(p.live for p in preds),
                            "documents": len({p.uri for p in preds})}
        s["config"] = {k: v for k, v in vars(self.config).items()}
        s["cross_file"] = self.crossfile.snapshot()
        return s


class _Waiter:
    """A request waiting for its answer (the event loop's side)."""

    def __init__(self) -> None:
        self.changed = asyncio.Event()
        self.superseded = False


def text_codec(backend) -> tuple[Callable[[str], list[int]], Callable[[list[int]], str]]:
    """encode/decode with the model's tokenizer for threads other than the inference thread (the datastores'
    `tokenizers` copy where the backend has one)."""
    from tokenizers import Tokenizer

    tok = backend.tokenizer_spec() if hasattr(backend, "tokenizer_spec") else None
    if isinstance(tok, Tokenizer):
        return (lambda t: tok.encode(t, add_special_tokens=False).ids), \
            (lambda ids: tok.decode(ids, skip_special_tokens=False))
    return backend.encode, backend.decode


def _ignore(*args: Any, **kwargs: Any) -> None:
    """A watch records nothing: its request was recorded when it was answered."""


async def wait_for_event(event: asyncio.Event, timeout: float) -> None:
    """Until `event` is set or `timeout` seconds passed; a cancellation always propagates. (Not
    asyncio.wait_for: before Python 3.12 it returns instead of raising when the cancellation comes in the
    same turn as the event, which the decoding steps set many times a second: a cancelled request then
    waited for the whole prediction and was answered.)"""
    setting = asyncio.ensure_future(event.wait())
    try:
        await asyncio.wait({setting}, timeout=max(0.001, timeout))
    finally:
        setting.cancel()


__all__ = ["CompletionService", "CompletionRequest", "CompletionResponse", "Item", "ServiceError", "Backend",
           "View"]
