"""`rest-lsp complete PATH:LINE:COL`: the completion the daemon would serve there, with its figures."""
from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable

from .config import ServerConfig, merge
from .core import CompletionRequest, CompletionService
from .prompt import build_context


# LSP languageIds of common extensions (the `languages` setting filters on these)
LANGUAGE_IDS = {"py": "python", "pyi": "python", "js": "javascript", "mjs": "javascript", "jsx": "javascriptreact",
                "ts": "typescript", "tsx": "typescriptreact", "rs": "rust", "go": "go", "c": "c", "h": "c",
                "cc": "cpp", "cpp": "cpp", "hpp": "cpp", "java": "java", "kt": "kotlin", "rb": "ruby",
                "sh": "shellscript", "lua": "lua", "md": "markdown", "cs": "csharp", "php": "php",
                "swift": "swift", "scala": "scala", "sql": "sql", "html": "html", "css": "css"}


class OneShotError(Exception):
    """Bad input to the one-shot command; the message is for the user."""


def run_complete(path: Path, line: int, column: int, *, settings: dict, workspace: str | None = None,
                 compare: bool = False, invoked: bool = False,
                 progress: Callable[[str], None] | None = None) -> dict:
    """line and column count from 0 here."""
    say = progress or (lambda m: None)
    path = Path(path).expanduser()
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise OneShotError(f"cannot read {path}: {exc.strerror or exc}") from exc
    text = data.decode("utf-8", errors="replace")
    lines = text.split("\n")
    if line >= len(lines):
        raise OneShotError(f"{path} has {len(lines)} lines; line {line + 1} is past the end")
    # a one-shot run neither reads nor writes the daemon's history: its figures show a cold start, and
    # running it again must not draft its own earlier answer
    config, _, problems = merge(ServerConfig(persist_history=False), settings)
    if problems:
        raise OneShotError("; ".join(problems))
    service = CompletionService(config, notify=lambda level, msg: say(f"[{level}] {msg}"))
    service.start()
    say("loading the model ...")
    service.worker.wait_loaded()
    if service.worker.state != "ready":
        service.close()
        raise OneShotError(f"the model failed to load: {service.worker.error}")
    uri = path.resolve().as_uri()
    ws_info = None
    index = None
    if workspace:
        from .workspace import WorkspaceIndex

        root = Path(workspace).expanduser()
        if not root.is_dir():
            raise OneShotError(f"--workspace {workspace}: not a directory")
        index = WorkspaceIndex(service, lambda level, msg: say(f"[{level}] {msg}"))
        say(f"indexing {root} ...")
        index.start([str(root)])
        index.buffer_changed(uri, text)
        index.wait_idle(timeout=3600)
        f = next(iter(index.folders.values()), None)
        if f is not None:
            ws_info = {"folder": str(f.root), "state": f.state, "error": f.error, "datastore": str(f.store_dir),
                       "indexed_s": f.indexed_s, "detail": f.detail}
    # one request, nothing to keep warm: the cross-file block is selected before it, not in the background
    context = service.use_context_now(uri, text, build_context(text, line, column))
    req = CompletionRequest(uri, text, line, column, automatic=not invoked,
                            language=LANGUAGE_IDS.get(path.suffix.lstrip(".").lower(), path.suffix.lstrip(".") or None))
    try:
        resp = asyncio.run(service.complete(req))
    except Exception as exc:  # noqa: BLE001
        service.close()
        raise OneShotError(str(exc)) from exc
    rec = resp.record
    # the prediction decodes on past what the answer showed, to its block's end: its figures are the run's
    pred = next((p for p in service.predictions.of(uri) if p.origin == "request"), None)
    f, raw = {}, rec.get("raw")
    if pred is not None:
        try:
            pred.job.future.result(timeout=3600)
        except Exception:  # noqa: BLE001 - stopped: its figures so far
            pass
        f, raw = pred.figures, pred.text
    out = {
        "path": str(path), "line": line + 1, "column": column + 1, "mode": rec.get("mode"),
        "model": service.worker.backend.name,
        "verifier": service.worker.backend.describe()["verifier"],   # which forward verified the drafts
        "completion": resp.items[0].text if resp.items else "",
        "alternatives": [i.text for i in resp.items[1:]],
        "figures": {"tokens": f.get("tokens", 0), "steps": f.get("steps", 0),
                    "accepted_per_step": f.get("accepted_per_step"), "time_ms": rec["latency_ms"],
                    "decode_ms": round(f.get("prefill_ms", 0.0) + f.get("decode_ms", 0.0), 1),
                    "prefill_ms": f.get("prefill_ms", 0.0), "retrieval_ms": f.get("retrieval_ms", 0.0),
                    "forward_ms": f.get("forward_ms", 0.0), "stop_reason": f.get("stop_reason")},
        "workspace": ws_info,
        "context": context.describe() if context is not None else [],
    }
    if compare:
        ctx = build_context(text, line, column)
        cfg = replace(service.config, draft_budget=0)
        repo = service.repo_for(uri)  # the same prompt as the request's

        def plain_run(backend):
            backend.reset_kv_cache()  # the REST run above started cold too
            t0 = time.perf_counter()
            run = backend.start(uri, ctx, cfg, repo=repo)
            while not run.done:
                backend.advance(run)
            return backend.figures(run), run.text, (time.perf_counter() - t0) * 1000

        plain, plain_text, ms = service.worker.run_sync(plain_run)
        rest_ms = out["figures"]["decode_ms"]
        out["plain"] = {"time_ms": round(ms, 1), "steps": plain["steps"], "tokens": plain["tokens"],
                        "speedup": round(ms / rest_ms, 3) if rest_ms else None,
                        "same_text": plain_text == raw}
    if index is not None:
        index.close()
    service.close()
    return out

