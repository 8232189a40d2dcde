"""What the daemon does per request, without LSP plumbing.

    service = CompletionService(config, backend_factory)
    service.start()                          # loads the model on the inference thread
    response = await service.complete(CompletionRequest(...))

`backend_factory(config, repository) -> Backend` runs on the inference thread; a Backend turns (context, generation
settings, should_stop) into a GenerationResult (rest_lsp/service/backend.py holds the real one).
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol

from .cache import CompletionCache
from .config import MODEL_KEYS, ModelLimits, ServerConfig, check_against_model, limits_of, merge
from .datastores import DatastoreSet
from .prompt import CompletionContext, PositionError, Selected, build_context, shape_completion
from .stats import Stats
from .worker import InferenceWorker, Job, JobAborted, ModelUnavailable

log = logging.getLogger(__name__)

TIME_STOPS = frozenset({"time", "time_budget", "timeout", "budget"})


class ServiceError(Exception):
    """A request the service cannot answer; code is "invalid_params", "model_unavailable" or "internal"."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


@dataclass
class CompletionRequest:
    uri: str
    text: str
    line: int                       # 0-based, code points
    column: int
    automatic: bool = True
    selected: Selected | None = None
    language: str | None = None


@dataclass
class Item:
    text: str
    start: tuple[int, int]
    end: tuple[int, int]


@dataclass
class CompletionResponse:
    items: list[Item]
    record: dict = field(default_factory=dict)


@dataclass
class Attempt:
    """One generation as the service sees it (GenerationResult's figures plus the settings used)."""
    text: str
    stop_reason: str
    tokens: int
    steps: int
    accepted: list[int]
    retrieval_ms: float
    forward_ms: float
    prefill_ms: float
    decode_ms: float


class Backend(Protocol):
    name: str

    def generate(self, ctx: CompletionContext, config: ServerConfig, *, time_budget_s: float | None,
                 should_stop: Callable[[], bool], temperature: float = 0.0, seed: int | None = None,
                 use_retrieval: bool = True) -> Attempt: ...

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
        self.cache = CompletionCache()
        self.repository = DatastoreSet()    # workspace datastores; rest_lsp/service/workspace.py fills it
        self.stats = Stats()
        self.on_model_ready: list[Callable[[Backend], None]] = []   # run on the inference thread
        self.model_limits: ModelLimits | None = None   # the loaded model's, once it is loaded
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
            self._check_settings(limits_of(backend))
            corpus_error = backend.describe().get("corpus") if cfg.corpus else None
            if corpus_error not in (None, "loaded"):
                self._notify("problem", f"the corpus {cfg.corpus} is not used: {corpus_error}")
            for callback in list(self.on_model_ready):
                callback(backend)
            return backend

        self.cache.clear()
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
        if changed & (MODEL_KEYS | {"corpus"}) and self.worker.state != "idle":   # idle: start() loads it
            self._load_model()
        elif changed & {"max_tokens", "max_lines", "draft_budget", "max_prefix_chars", "max_suffix_chars"}:
            self.cache.clear()
        if "request_log" in changed:
            self._apply_log_path()
        if changed:
            self._notify("info", "configuration changed: " + ", ".join(sorted(changed)))
        return changed, problems

    def _apply_log_path(self) -> None:
        path = self.config.request_log
        self.stats.request_log = Path(path).expanduser() if path else None

    def close(self) -> None:
        stopped = self.worker.close()
        backend = self.worker.backend
        if stopped and backend is not None and hasattr(backend, "close"):
            backend.close()

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

        cfg = self.config
        if cfg.languages is not None and req.language not in cfg.languages:
            return finish("skipped", [], reason=f"language {req.language!r} not in languages")
        if looks_binary(req.text):
            self._notify("info", f"{req.uri}: binary content, no completion")
            return finish("skipped", [], reason="binary content")
        try:
            ctx = build_context(req.text, req.line, req.column, req.selected)
        except PositionError as exc:
            finish("error", [], reason=str(exc))
            raise ServiceError("invalid_params", str(exc)) from exc
        rec["mode"] = "multi" if ctx.multiline else "single"
        end = (ctx.line, ctx.column)

        cached = self.cache.get(req.uri, ctx.prefix, ctx.suffix)
        if cached is not None:
            self.worker.supersede(req.uri)      # a newer request wins over a running one
            text = shape_completion(cached, ctx, max_lines=cfg.max_lines, truncated=False)
            if text:
                return finish("cache", [Item(ctx.lead + text, ctx.range_start, end)])

        n_alt = 1 if req.automatic else max(1, cfg.alternatives)
        budget_s = cfg.time_budget_ms / 1000.0 if cfg.time_budget_ms else None   # 0: no budget

        def run(backend: Backend, should_stop: Callable[[], bool]) -> list[Attempt]:
            attempts: list[Attempt] = []
            for i in range(n_alt):
                left = None if budget_s is None else budget_s - (time.perf_counter() - t0)
                if i > 0 and ((left is not None and left <= 0.05) or should_stop()):
                    break
                # a request that waited in the queue still gets a fifth of the budget
                attempts.append(backend.generate(
                    ctx, cfg, time_budget_s=None if left is None else max(left, 0.2 * budget_s),
                    should_stop=should_stop,
                    temperature=0.0 if i == 0 else 0.8, seed=i, use_retrieval=cfg.draft_budget != 0))
            return attempts

        job = self.worker.submit(req.uri, run)
        job.future.add_done_callback(lambda f: self._count_waste(job, f))
        try:
            attempts = await asyncio.wrap_future(job.future)
        except asyncio.CancelledError:
            self.worker.cancel(job)
            finish("cancelled", [])
            raise
        except JobAborted as exc:
            return finish(exc.reason, [])
        except ModelUnavailable as exc:
            finish("error", [], reason=str(exc))
            raise ServiceError("model_unavailable", str(exc)) from exc
        except Exception as exc:  # noqa: BLE001 - counted with its reason; the log has the traceback
            log.error("completion failed", exc_info=exc)
            why = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"
            finish("error", [], reason=why)
            raise ServiceError("internal", f"the completion failed: {why}") from exc
        if job.reason is not None:     # stopped while running: a newer request or a reload won
            return finish(job.reason if job.reason != "cancelled" else "cancelled", [])
        first = attempts[0]
        rec.update(model_call=True, queue_ms=None, stop_reason=first.stop_reason,
                   tokens=sum(a.tokens for a in attempts), steps=sum(a.steps for a in attempts),
                   accepted_per_step=round(first.tokens / first.steps, 3) if first.steps else None,
                   retrieval_ms=round(sum(a.retrieval_ms for a in attempts), 2),
                   forward_ms=round(sum(a.forward_ms for a in attempts), 2),
                   prefill_ms=round(first.prefill_ms, 2), decode_ms=round(first.decode_ms, 2), raw=first.text)
        texts: list[str] = []
        for a in attempts:
            t = shape_completion(a.text, ctx, max_lines=cfg.max_lines, truncated=a.stop_reason in TIME_STOPS)
            if t and t not in texts:
                texts.append(t)
        if texts:
            self.cache.put(req.uri, ctx.prefix, ctx.suffix, texts[0])
        items = [Item(ctx.lead + t, ctx.range_start, end) for t in texts]
        return finish("completed" if items else "empty", items, chars=len(texts[0]) if texts else 0)

    def _count_waste(self, job: Job, fut) -> None:
        if job.reason is None or fut.cancelled() or fut.exception() is not None:
            return
        attempts = fut.result() or []
        self.stats.record_waste(sum(a.tokens for a in attempts), sum(a.steps for a in attempts))

    def document_closed(self, uri: str) -> None:
        self.cache.forget(uri)

    def snapshot(self, last: int = 20) -> dict:
        s = self.stats.snapshot(last)
        s["model"] = self.worker.snapshot()
        backend = self.worker.backend
        if backend is not None:
            s["model"].update(backend.describe())
        s["config"] = {k: v for k, v in vars(self.config).items()}
        return s
