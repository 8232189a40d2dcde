"""Workspace datastores: index the folders on `initialized`, keep them current, feed open buffers.

One thread ("rest-lsp-index") does everything here, so the event loop and the inference thread never wait
on tokenisation or suffix-array builds:
- each workspace folder gets a datastore under <cache>/workspaces/<name>-<hash>, built or brought up to
  date with the files on disk (LSP work-done progress while it runs), then swapped into the service's
  DatastoreSet; completions work before that, with the other sources;
- the folder is watched (indexer.watch) and saved/changed files go to `update_paths` (delta shards);
- open buffers go to the datastore's live shard (`set_live`), coalesced: only a buffer's latest text is
  tokenised, and only the lines an edit touched (rest_lsp/service/live.py), with secret lines masked and
  key material (by name or content) never fed. Buffers outside every indexed folder go to the context
  source's buffer list instead.
"""
from __future__ import annotations

import hashlib
import logging
import os
import queue
import threading
import time
from pathlib import Path
from typing import Any, Callable
from urllib.parse import unquote, urlparse

from rest_lsp.filenames import safe_filename
from restbase.storage import cache_root

from . import indexing
from .live import LiveBuffer

log = logging.getLogger(__name__)


def uri_to_path(uri: str) -> Path | None:
    u = urlparse(uri)
    if u.scheme != "file":
        return None
    p = unquote(u.path)
    if os.name == "nt" and p.startswith("/") and len(p) > 2 and p[2] == ":":
        p = p[1:]
    return Path(p)


def buffer_name(uri: str) -> str:
    """The file name of a buffer's URI (what the secrets rules look at)."""
    path = uri_to_path(uri)
    return path.name if path is not None else urlparse(uri).path.rsplit("/", 1)[-1]


def _batch_encoder(backend) -> Callable[[list[str]], list]:
    """Token ids of several texts in one call (the tokenizer's threads share it), as backend.encode gives."""
    tok = getattr(getattr(backend, "loaded", None), "tokenizer", None)
    if tok is not None:
        from indexer.tokenizer import encode_batch

        return lambda texts: encode_batch(tok, texts)
    return lambda texts: [backend.encode(t) for t in texts]


def workspace_store_dir(cache_dir: Path, folder: Path) -> Path:
    key = hashlib.sha256(str(folder.resolve()).encode()).hexdigest()[:12]
    name = safe_filename(folder.name)[:40] or "root"
    return cache_dir / "workspaces" / f"{name}-{key}"


class _Folder:
    def __init__(self, root: Path):
        self.root = root
        self.key = str(root)
        self.state = "pending"         # pending | indexing | ready | failed | disabled
        self.error: str | None = None
        self.store_dir: Path | None = None
        self.detail: dict = {}
        self.updates = 0               # batches of changed files the watcher applied
        self.saved = 0                 # files re-read after didSave
        self.live_updates = 0          # buffer texts fed to the live shard
        self.rebuilds = 0              # from-scratch builds done for rest-lsp.rebuildIndex
        self.watcher = None
        self.indexed_s: float | None = None
        self.backend = None            # the model whose tokenizer the datastore was opened with


class WorkspaceIndex:
    def __init__(self, service, notify: Callable[[str, str], None], progress=None):
        self.service = service
        self.notify = notify
        self.progress = progress
        self.folders: dict[str, _Folder] = {}
        self._live: dict[str, Any] = {}            # open buffers: uri -> latest text (or a callable returning it)
        self._dirty: set[str] = set()              # buffers whose latest text is not fed yet
        self._too_big: set[str] = set()            # buffers over max_live_bytes (reported once)
        self._masked: dict[str, int] = {}          # buffer -> lines masked because they carry a secret
        self._secret: dict[str, str] = {}          # buffers never fed: key material (by name or content)
        self._buffers: dict[str, LiveBuffer] = {}  # the token ids of each fed buffer, kept per edit
        self._live_lock = threading.Lock()
        self._tasks: queue.Queue = queue.Queue()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="rest-lsp-index", daemon=True)
        self._thread.start()
        service.on_model_ready.append(self._model_ready)

    def _model_ready(self, backend) -> None:
        """A (new) model: its tokenizer may differ, so re-index and re-feed what the old one tokenised."""
        for key, f in self.folders.items():
            if f.backend is not backend:
                self._tasks.put(("index", key))
        with self._live_lock:
            uris = list(self._live)
        for uri in uris:
            text = self._live.get(uri)
            if text is not None:
                self.buffer_changed(uri, text)

    # -- event-loop side: cheap, never blocks ------------------------------------------------------
    def start(self, folder_uris: list[str]) -> None:
        for uri in folder_uris:
            path = uri_to_path(uri) if "://" in uri else Path(uri)
            if path is None or not path.is_dir():
                self.notify("warning", f"workspace folder {uri} is not a local directory; not indexed")
                continue
            f = _Folder(path.resolve())
            self.folders[f.key] = f
            self._tasks.put(("index", f.key))

    def buffer_changed(self, uri: str, text) -> None:
        with self._live_lock:
            self._live[uri] = text
            queued = uri in self._dirty
            self._dirty.add(uri)
        if not queued:              # coalesce: the task reads the latest text when it runs
            self._tasks.put(("live", uri))

    def buffer_closed(self, uri: str) -> None:
        self._tasks.put(("close", uri))

    def file_saved(self, uri: str) -> None:
        path = uri_to_path(uri)
        if path is not None:
            self._tasks.put(("paths", [path]))

    def reconfigure(self, changed: set[str]) -> None:
        for key in list(self.folders):
            self._tasks.put(("reindex", key))

    def rebuild(self) -> list[str]:
        """Queue a from-scratch build of every folder's datastore (the `rest-lsp.rebuildIndex` command):
        returns at once with the folders queued; progress and the new figures arrive as for the first index."""
        for key in list(self.folders):
            self._tasks.put(("rebuild", key))
        return [str(f.root) for f in self.folders.values()]

    def close(self) -> None:
        if self._model_ready in self.service.on_model_ready:
            self.service.on_model_ready.remove(self._model_ready)
        self._closed = True
        self._tasks.put(("stop", None))
        for f in self.folders.values():
            self._stop_watch(f)

    def wait_idle(self, timeout: float = 60.0) -> bool:
        """Block until every queued task ran (the one-shot CLI and tests)."""
        done = threading.Event()
        self._tasks.put(("mark", done))
        return done.wait(timeout)

    # -- queries (any thread) ---------------------------------------------------------------------
    def snapshot(self) -> dict:
        folders = []
        for f in list(self.folders.values()):
            folders.append({"folder": str(f.root), "state": f.state, "error": f.error,
                            "datastore": str(f.store_dir) if f.store_dir else None, "indexed_s": f.indexed_s,
                            "watch_updates": f.updates, "saved_updates": f.saved, "live_updates": f.live_updates,
                            "rebuilds": f.rebuilds,
                            "watching": f.watcher is not None, **f.detail})
        store_stats = {}
        for key in self.service.repository.keys():
            st = self.service.repository.get(key)
            fn = getattr(st, "stats", None)
            if callable(fn):
                try:
                    store_stats[key] = fn()
                except Exception as exc:  # noqa: BLE001
                    store_stats[key] = {"error": str(exc)}
        return {"folders": folders, "stores": store_stats, "open_buffers": len(self._live),
                "masked_live": {u: n for u, n in self._masked.items() if n},   # counts, never the values
                "long_lines_live": {u: b.long_lines for u, b in list(self._buffers.items()) if b.long_lines},
                "secret_buffers": sorted(self._secret)}

    def drafts(self, text: str, max_len: int = 10) -> dict:
        """What the workspace datastores propose after `text` (decoded), for debugging and tests."""
        backend = self.service.worker.backend
        if backend is None:
            raise RuntimeError("the model (and its tokenizer) is not loaded")
        ids = backend.encode(text)
        r = self.service.repository.search(ids, max_len=max_len)
        return {"match_len": r.match_len, "count": r.count,
                "continuations": [{"text": backend.decode(c.tokens), "count": c.count, "weight": c.weight}
                                  for c in r.continuations[:50]]}

    # -- the indexing thread ----------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            kind, arg = self._tasks.get()
            if kind == "stop":
                return
            try:
                if kind == "mark":
                    arg.set()
                elif kind == "index":
                    self._index(self.folders[arg])
                elif kind == "reindex":
                    self._index(self.folders[arg], force=True)
                elif kind == "rebuild":
                    self._index(self.folders[arg], force=True, rebuild=True)
                elif kind == "live":
                    self._feed_live(arg)
                elif kind == "close":
                    self._drop_live(arg)
                elif kind == "paths":
                    self._update_paths(arg)
            except Exception as exc:  # noqa: BLE001 - the index thread must survive anything
                log.exception("indexing task %s failed", kind)
                self.notify("error", f"indexing ({kind}) failed: {type(exc).__name__}: {exc}")

    def _tokenizer_spec(self) -> tuple[Any, Any]:
        self.service.worker.wait_loaded()
        backend = self.service.worker.backend
        if backend is None:
            raise RuntimeError(f"no model, so no tokenizer: {self.service.worker.error}")
        return backend, backend.tokenizer_spec()

    def _folder_of(self, path: Path) -> _Folder | None:
        for f in self.folders.values():
            try:
                path.resolve().relative_to(f.root)
                return f
            except ValueError:
                continue
        return None

    def _index(self, f: _Folder, force: bool = False, rebuild: bool = False) -> None:
        cfg = self.service.config
        if not cfg.index_workspace:
            self._stop_watch(f)
            f.state = "disabled"
            self.service.repository.set(f.key, None)
            return
        try:
            backend, tok = self._tokenizer_spec()
        except RuntimeError as exc:
            f.state, f.error = "failed", str(exc)
            return
        if f.backend is backend and f.state == "ready" and not force:
            return
        f.backend = backend
        self._stop_watch(f)
        cache = Path(cfg.cache_dir).expanduser() if cfg.cache_dir else cache_root()
        f.store_dir = workspace_store_dir(cache, f.root)
        f.state, f.error = "indexing", None
        title = "rest-lsp: rebuilding the index" if rebuild else "rest-lsp: indexing"
        token = self.progress.begin(title, str(f.root)) if self.progress else None
        t0 = time.perf_counter()
        try:
            store, detail = indexing.open_or_build(
                f.root, f.store_dir, tokenizer=tok, exclude=cfg.exclude, rebuild=rebuild,
                progress=lambda msg, pct=None: self.progress and self.progress.report(token, msg, pct))
        except Exception as exc:  # noqa: BLE001 - an unwritable cache or a broken store: serve without it
            f.state, f.error = "failed", f"{type(exc).__name__}: {exc}"
            self.notify("warning", f"workspace {f.root} not indexed ({f.error}); completions go on "
                                   "without its datastore")
            if self.progress:
                self.progress.end(token, f"failed: {f.error}")
            return
        f.detail, f.indexed_s = detail, round(time.perf_counter() - t0, 2)
        self.service.repository.set(f.key, store)
        # watching before "ready" is announced: a file saved right after a client sees "ready" is not missed
        try:
            f.watcher = indexing.watch(store, lambda summary: self._watched(f, summary))
        except Exception as exc:  # noqa: BLE001
            self.notify("warning", f"not watching {f.root}: {type(exc).__name__}: {exc}")
        f.state = "ready"
        f.rebuilds += int(rebuild)
        if self.progress:
            self.progress.end(token, f"indexed in {f.indexed_s:.1f} s")
        self.notify("info", f"workspace {f.root} indexed in {f.indexed_s:.1f} s ({detail})")
        self._catch_up(f, store)
        with self._live_lock:
            uris = list(self._live)
        for uri in uris:          # buffers opened before the index existed move to its live shard
            self._feed_live(uri)

    def _catch_up(self, f: _Folder, store) -> None:
        """One scan after the watcher started: a file saved while the build read the folder (or after it, before
        the watcher was on) has no event coming, and would stay stale until its next change."""
        try:
            summary = store.sync()
        except Exception as exc:  # noqa: BLE001 - the store still serves what the build read
            self.notify("warning", f"catch-up scan of {f.root} failed: {type(exc).__name__}: {exc}")
            return
        if summary.get("added") or summary.get("changed") or summary.get("removed"):
            f.updates += 1
            log.info("workspace %s caught up: %s", f.root, summary)

    def _watched(self, f: _Folder, summary: dict) -> None:
        """A batch of changed files on disk is searchable now (called on the watcher's thread)."""
        f.updates += 1
        log.info("workspace %s updated: %s", f.root, summary)

    def _stop_watch(self, f: _Folder) -> None:
        w, f.watcher = f.watcher, None
        if w is not None:
            try:
                w.stop()
            except Exception:  # noqa: BLE001
                log.exception("stopping the watcher of %s", f.root)

    def _feed_live(self, uri: str) -> None:
        with self._live_lock:
            self._dirty.discard(uri)
            text = self._live.get(uri)
        if text is None:
            return
        if callable(text):
            text = text()
        cfg = self.service.config
        if len(text) > cfg.max_live_bytes:
            if uri not in self._too_big:
                self._too_big.add(uri)
                self.notify("info", f"{uri}: {len(text)} characters, more than max_live_bytes; its edits do "
                                    "not feed the drafts")
            return
        self.service.worker.wait_loaded()
        backend = self.service.worker.backend
        if backend is None:
            return          # no model: nothing to tokenise with
        from indexer.discover import is_secret_name
        from indexer.secrets import clean

        path = uri_to_path(uri)
        name = buffer_name(uri)
        buf = self._buffers.get(uri)
        if not is_secret_name(name):
            if buf is None or buf.backend is not backend:   # a new model may tokenize differently
                buf = self._buffers[uri] = LiveBuffer(name, _batch_encoder(backend), clean)
                buf.backend = backend
            buf.update(text)   # re-tokenizes only what the edit touched, secrets masked first
        if buf is None or is_secret_name(name) or buf.key_material:
            # key material by name (.env, id_rsa) or content (a private key): never fed, gone if it was
            if uri not in self._secret:
                self._secret[uri] = "key material"
                self.notify("info", f"{uri}: key material; it does not feed the drafts")
            self._drop_live(uri, keep_text=True)
            return
        self._secret.pop(uri, None)
        self._masked[uri] = buf.masked_lines
        ids = buf.tokens()
        folder = self._folder_of(path) if path is not None else None
        ctx = backend.context
        if folder is not None and folder.state == "ready" and \
                self.service.repository.call(folder.key, "set_live", uri, ids):
            folder.live_updates += 1
            ctx.drop_buffer(uri)   # fed there before the index was ready: not twice
        else:
            ctx.set_buffer(uri, ids)

    def _drop_live(self, uri: str, keep_text: bool = False) -> None:
        if not keep_text:
            with self._live_lock:
                self._live.pop(uri, None)
                self._dirty.discard(uri)
            self._masked.pop(uri, None)
            self._secret.pop(uri, None)
            self._buffers.pop(uri, None)
        for f in self.folders.values():
            if f.state == "ready":
                self.service.repository.call(f.key, "drop_live", uri)
        backend = self.service.worker.backend
        if backend is not None:
            backend.context.drop_buffer(uri)

    def _update_paths(self, paths: list[Path]) -> None:
        by_folder: dict[str, list[Path]] = {}
        for p in paths:
            f = self._folder_of(Path(p))
            if f is not None and f.state == "ready":
                by_folder.setdefault(f.key, []).append(Path(p))
        for key, ps in by_folder.items():
            if self.service.repository.call(key, "update_paths", ps):
                self.folders[key].saved += len(ps)
