"""The daemon's service without LSP plumbing: one object the protocol layer calls, made of four parts.

    service = CompletionService(config, backend_factory)
    service.start()                                   # loads the model on the inference thread
    service.document_changed(uri, text, line, col)    # didOpen/didChange/rest/cursor: warm the KV cache there
    response = await service.complete(CompletionRequest(...))

    worker      the inference thread and its prioritised jobs (rest_lsp/service/worker.py)
    scheduler   what the model works on for a document: predictions while typing and ahead of a shown
                suggestion, warm-ups, each document's prompt anchor (rest_lsp/service/scheduler.py)
    blocks      each document's cross-file block: selected on its own thread, switched to once its prompt is
                computed (rest_lsp/service/blocks.py)
    answering   one request: its prediction, the wait under the budgets, what is shown
                (rest_lsp/service/answering.py)

Latency first (docs/daemon.md): a completion is answered from a prediction when its context continues one (no
model call); otherwise a new prediction starts at once, pre-empting warm-ups; while the person types, each edit
extends the document's KV cache at the cursor at low priority and goes on decoding from there, so the next
request has little prompt left to compute and usually finds its suggestion decided. Budgets start when the model
can work (a request made while it loads is answered after the load). The life of one keystroke and of one
request is drawn in docs/ARCHITECTURE.md.

`backend_factory(config, repository) -> Backend` runs on the inference thread (rest_lsp/service/backend.py).
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable, Optional, Protocol

from .answering import Answering, CompletionRequest, CompletionResponse, Item, ServiceError
from .blocks import Blocks
from .config import MODEL_KEYS, ModelLimits, ServerConfig, check_against_model, merge
from .crossfile import Selection
from .datastores import DatastoreSet
from .prediction import View
from .prompt import CompletionContext, PositionError, build_context
from .scheduler import Scheduler
from .stats import Stats
from .worker import InferenceWorker


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

    def advance(self, run: RunLike, interrupt: Callable[[], bool] | None = None) -> None: ...
    # interrupt: polled during the step where the backend can stop midway (its job was stopped: a key made the
    # step moot); the run is then as before the step

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
        self.repository = DatastoreSet()  # workspace datastores; rest_lsp/service/workspace.py fills it
        self.stats = Stats()
        self.on_model_ready: list[Callable[[Backend], None]] = []  # run on the inference thread
        self.model_limits: ModelLimits | None = None  # the loaded model's, once it is loaded
        # set by the protocol layer when the client asks again on it (LSP: rest/suggestionReady): an Automatic
        # request that got nothing for want of time is followed by this call once its suggestion is decided
        self.on_ready: Callable[[CompletionRequest], None] | None = None
        settings = lambda: self.config  # noqa: E731 - the parts read the configuration as it is now
        self.scheduler = Scheduler(self.worker, self.stats, settings, self._block_of)
        self.blocks = Blocks(settings, self.repository, self.stats, self.worker, self.scheduler)
        self.answering = Answering(settings, self.worker, self.stats, self.scheduler, self.blocks,
                                   self._notify, self._serves, lambda: self.on_ready)
        self.predictions = self.scheduler.predictions
        self.crossfile = self.blocks.keeper
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

        self.scheduler.drop(self.predictions.clear(), "superseded")
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
            self.scheduler.drop(self.predictions.clear(), "stale")
        if "request_log" in changed:
            self._apply_log_path()
        if changed:
            self._notify("info", "configuration changed: " + ", ".join(sorted(changed)))
        return changed, problems

    def _apply_log_path(self) -> None:
        path = self.config.request_log
        self.stats.request_log = Path(path).expanduser() if path else None

    def close(self) -> None:
        self.blocks.close()
        stopped = self.worker.close()
        backend = self.worker.backend
        if stopped and backend is not None and hasattr(backend, "close"):
            backend.close()

    # -- edits and the cursor: keep the KV cache warm where the person types ------------------------
    def document_changed(self, uri: str, text: str, line: int | None, column: int | None,
                         language: str | None = None) -> None:
        """An edit (didOpen/didChange) with the cursor where it left it, or the cursor resting (rest/cursor).
        No position (nothing changed): nothing to warm."""
        if line is None or column is None or not self._serves(language, text):
            return
        try:
            ctx = build_context(text, line, column)
        except PositionError:
            return
        self.blocks.placed(uri, text, ctx)
        self.scheduler.edited(uri, ctx)

    def cursor_rested(self, uri: str, text: str, line: int, column: int, language: str | None = None) -> None:
        self.stats.count("cursor_notifications")
        self.document_changed(uri, text, line, column, language)

    def document_saved(self, uri: str) -> None:
        self.blocks.saved(uri)

    def document_closed(self, uri: str) -> None:
        self.blocks.closed(uri)
        self.scheduler.forget(uri)

    def _serves(self, language: str | None, text: str) -> bool:
        langs = self.config.languages
        return (langs is None or language in langs) and not looks_binary(text)

    # -- cross-file context ---------------------------------------------------------------------------
    def _block_of(self, uri: str) -> Optional[Selection]:
        return self.blocks.current(uri)

    def repo_for(self, uri: str):
        """The block the document's prompts start with now (None: none yet, or cross-file context is off)."""
        sel = self.blocks.current(uri)
        return sel.repo if sel is not None else None

    def selection_for(self, backend, uri: str, text: str, ctx: CompletionContext) -> Optional[Selection]:
        return self.blocks.selection_for(backend, uri, text, ctx)

    def use_context_now(self, uri: str, text: str, ctx: CompletionContext) -> Optional[Selection]:
        return self.blocks.use_now(uri, text, ctx)

    # -- requests ---------------------------------------------------------------------------------
    async def complete(self, req: CompletionRequest) -> CompletionResponse:
        return await self.answering.complete(req)

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
        if self.config.server and self.config.server.get("key"):   # a team server's key is not shown
            s["config"]["server"] = {**self.config.server, "key": "(set)"}
        s["cross_file"] = self.blocks.snapshot()
        return s


__all__ = ["CompletionService", "CompletionRequest", "CompletionResponse", "Item", "ServiceError", "Backend",
           "View"]
