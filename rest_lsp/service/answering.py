"""Answering one completion request: its prediction, the wait under the budgets, what the editor is shown.

    answering = Answering(settings, worker, stats, scheduler, blocks, notify, serves, on_ready)
    response = await answering.complete(CompletionRequest(...))

A request is answered from a prediction (rest_lsp/service/prediction.py): one that its context continues
("cache" when it has ended, "in_flight" while it decodes) or a new one started for it at INTERACTIVE priority
(rest_lsp/service/scheduler.py). While it waits, the request is a waiter of its document: a newer request of the
document supersedes it (Neovim does not cancel old ones). The wait ends with the first line (or words) of the
answer, or at one of three budgets (config: `promptBudgetMs` for an Automatic request whose prompt is still
computing, `predictBudgetMs` for a partial answer once the prompt is in, `timeBudgetMs` for the whole request);
never empty for want of time once a visible token is decided. An Automatic request answered empty for want of
time is watched: the client is told (`on_ready`) when its suggestion is there. An Invoked request also gets
sampled alternatives within its time budget.
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from .blocks import Blocks
from .config import ServerConfig
from .prediction import Prediction, answer
from .prompt import CompletionContext, PositionError, Selected, build_context, shape_completion
from .scheduler import Scheduler
from .stats import Stats
from .worker import AHEAD, INTERACTIVE, InferenceWorker, Job, JobAborted, ModelUnavailable

log = logging.getLogger(__name__)

SAMPLING_TEMPERATURE = 0.8  # the alternatives of an Invoked request
ALTERNATIVES_MARGIN_S = 0.1  # about one decoding step on a CPU: the alternatives end this far before the budget
# the budget is what the editor sees: waking the event loop (the inference thread holds the GIL between torch
# calls), shaping and writing the reply took 3 ms past a 1,500 ms budget in bench_typing's Invoked check
REPLY_MARGIN_S = 0.02
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


class Answering:
    def __init__(self, settings: Callable[[], ServerConfig], worker: InferenceWorker, stats: Stats,
                 scheduler: Scheduler, blocks: Blocks, notify: Callable[[str, str], None],
                 serves: Callable[[Optional[str], str], bool],
                 on_ready: Callable[[], Optional[Callable[[CompletionRequest], None]]]):
        self._settings = settings
        self.worker = worker
        self.stats = stats
        self.scheduler = scheduler
        self.blocks = blocks
        self._notify = notify
        self._serves = serves
        # the protocol layer's callback when the client asks again on it (LSP: rest/suggestionReady), read
        # when needed: it is set after the service is built
        self._on_ready = on_ready
        self._waiters: dict[str, list[_Waiter]] = {}  # requests waiting for an answer, per document
        self._watches: set[asyncio.Task] = set()

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
        self.blocks.placed(req.uri, req.text, ctx)
        self._supersede_waiters(req.uri)  # a newer request wins over older ones still waiting (Neovim
        # does not cancel them)
        pred, source = self.scheduler.prediction_for(req.uri, ctx)
        rec["source"], rec["model_call"] = source, source == "new"
        sel = getattr(pred, "context", None)
        rec["context"] = {"tokens": sel.tokens, "snippets": sel.describe()} if sel is not None else None
        text, why = await self._wait_as_waiter(req, ctx, pred, t0, finish, self._new_waiter(req.uri))
        if not text and why in ("prompt_budget", "time") and self._on_ready() is not None:
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
        if self._settings().languages is not None and req.language not in self._settings().languages:
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
            if text and not waiter.superseded and self._on_ready() is not None:
                self.stats.count("ready_notices")
                self._on_ready()(req)

        task = asyncio.ensure_future(watch())
        self._watches.add(task)
        task.add_done_callback(self._watches.discard)

    async def _shown_texts(self, req: CompletionRequest, ctx: CompletionContext, pred: Prediction, text: str,
                           t0: float) -> list[str]:
        """What the editor shows: the answer, sampled alternatives for an Invoked request; a shown answer
        starts the prediction of what follows it."""
        texts = [text] if text else []
        if not req.automatic and self._settings().alternatives > 1 and texts:
            texts += await self._alternatives(req.uri, ctx, texts, t0)
        if texts:
            pred.shown += 1
            pred.shown_end = ctx.prefix + texts[0]
            self.scheduler.predict_ahead(pred)
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
        cfg = self._settings()
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
                        part = answer(v.rest, ctx, done=False, max_lines=cfg.max_lines, partial=True,
                                      whole_words=cfg.partial_words)
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
        cfg = self._settings()
        out: list[str] = []
        anchor = self.scheduler.anchor(uri, ctx)
        # the whole answer within the request's time budget (from when the model could work on it), so the
        # sampling stops a step's margin before it
        start = max(arrived, self.worker.ready_at or arrived)
        end = start + cfg.time_budget_ms / 1000 - ALTERNATIVES_MARGIN_S if cfg.time_budget_ms else None
        for seed in range(1, cfg.alternatives):
            if end is not None and end - time.perf_counter() <= 0.05:
                break
            deadline = end
            sel = self.blocks.current(uri)
            repo = sel.repo if sel is not None else None

            def sample(backend, seed=seed, deadline=deadline):
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

class _Waiter:
    """A request waiting for its answer (the event loop's side)."""

    def __init__(self) -> None:
        self.changed = asyncio.Event()
        self.superseded = False


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


__all__ = ["Answering", "CompletionRequest", "CompletionResponse", "Item", "ServiceError", "wait_for_event"]
