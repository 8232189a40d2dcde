"""Keeping a datastore current: a watchdog observer on the roots feeding `Datastore.update_paths`.

Events are coalesced: a batch is applied once no event came for `quiet_s` (default 30 ms) or, under a
steady stream of events, `debounce_s` (default 200 ms) after its first event, whichever comes first. An
editor's atomic save (write a temporary file, rename it over the original) arrives as create + modify +
move within a few milliseconds and becomes one update of the final path; deletions, renames and moved
folders are updated by path (a folder that no longer exists drops every document under it, one that
appeared is walked).

No event comes for what changed before the observer started (between the build or the last sync reading a
file and `start`): `start` runs one catch-up scan once the observer is on (`Datastore.sync`: size and mtime
against the manifest, content hashes where those cannot tell), so nothing stays stale until its next change.
"""
from __future__ import annotations

import logging
import os
import sys
import threading
import time
from pathlib import Path

from .store import Datastore

log = logging.getLogger("rest_index.watch")


class Watcher:
    def __init__(self, ds: Datastore, roots=None, *, debounce_s: float = 0.2, quiet_s: float | None = None,
                 on_update=None, catch_up: bool = True):
        from watchdog.events import FileSystemEventHandler
        from watchdog.observers import Observer

        self.ds = ds
        self.roots = [Path(r).absolute() for r in (roots or ds.manifest.get("roots", []))]
        self.debounce_s = debounce_s
        self.quiet_s = min(0.03, debounce_s) if quiet_s is None else quiet_s
        self.on_update = on_update
        self.catch_up = catch_up
        self.caught_up: dict | None = None   # the catch-up scan's summary
        self._pending: dict[str, float] = {}  # path -> time of its first event in this batch
        self._first = None
        self._last = 0.0
        self._cv = threading.Condition()
        self._stop = False
        self.updates = 0
        self.errors: list[str] = []
        self._skip_dirs = set(ds.filters().exclude_dirs)
        self._skip_dirs.discard("site-packages")
        store_dir = str(ds.path.absolute()) if ds.path is not None else None
        watcher = self

        class Handler(FileSystemEventHandler):
            def on_any_event(self, event):
                if event.event_type in ("opened", "closed_no_write"):
                    return
                for p in (event.src_path, getattr(event, "dest_path", "")):
                    if p:
                        p = os.fsdecode(p)
                        if store_dir and (p == store_dir or p.startswith(store_dir + os.sep)):
                            continue
                        watcher._add(p)

        self._handler_cls = Handler
        self._observer = self._schedule(Observer())
        self._thread = threading.Thread(target=self._run, name="rest-index-watch", daemon=True)

    def _add(self, path: str) -> None:
        parts = Path(path).parts
        if any(p in self._skip_dirs for p in parts[:-1]):
            return
        now = time.monotonic()
        with self._cv:
            self._pending.setdefault(path, now)
            if self._first is None:
                self._first = now
            self._last = now
            self._cv.notify()

    def _schedule(self, observer):
        for r in self.roots:
            if r.is_dir():
                observer.schedule(self._handler_cls(), str(r), recursive=True)
            elif r.exists():
                observer.schedule(self._handler_cls(), str(r.parent), recursive=False)
        return observer

    def start(self) -> "Watcher":
        try:
            self._observer.start()
        except OSError as e:  # e.g. inotify's max_user_watches exhausted by a huge tree: poll instead
            from watchdog.observers.polling import PollingObserver

            log.warning("native file watching failed (%s); polling every second instead", e)
            self._observer = self._schedule(PollingObserver(timeout=1.0))
            self._observer.start()
        self._thread.start()
        if self.catch_up:
            self._catch_up()
        return self

    def _catch_up(self) -> None:
        """One scan once the observer is on: a change made before it started has no event coming. A change
        during the scan is seen by it or has an event queued, so nothing falls between the two."""
        try:
            t0 = time.monotonic()
            summary = self.ds.sync()
            summary["apply_s"] = summary["latency_s"] = time.monotonic() - t0
            self.caught_up = summary
            if summary.get("added") or summary.get("changed") or summary.get("removed"):
                self.updates += 1
                if self.on_update is not None:
                    self.on_update(summary)
        except Exception as e:  # the store still serves what it held; events keep it current from here
            msg = f"catch-up scan failed: {e}"
            self.errors.append(msg)
            log.warning(msg)

    def stop(self) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify()
        self._observer.stop()
        self._observer.join(timeout=5)
        self._thread.join(timeout=10)

    def __enter__(self):
        return self.start()

    def __exit__(self, *a):
        self.stop()

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._stop and self._first is None:
                    self._cv.wait()
                if self._stop:
                    return
                while not self._stop:
                    now = time.monotonic()
                    due = min(self._last + self.quiet_s, self._first + self.debounce_s)
                    if now >= due:
                        break
                    self._cv.wait(due - now)
                if self._stop:
                    return
                batch = self._pending
                self._pending, self._first = {}, None
            self._apply(batch)

    def _apply(self, batch: dict[str, float]) -> None:
        try:
            t0 = time.monotonic()
            summary = self.ds.update_paths([Path(p) for p in batch])
            self.updates += 1
            searchable = t0 + summary.get("searchable_s", time.monotonic() - t0)
            summary["latency_s"] = searchable - min(batch.values())
            summary["apply_s"] = time.monotonic() - t0
            if self.on_update is not None:
                self.on_update(summary)
        except Exception as e:  # keep watching: the next event retries these paths
            msg = f"update failed: {e}"
            self.errors.append(msg)
            log.warning(msg)


def open_or_build(roots, out, *, tokenizer, filters=None, log_fn=None) -> Datastore:
    """Open the store at `out` when it indexes these roots with this tokenizer (then sync it with the
    files), else build it."""
    from .types import DatastoreNotFound, IndexerError

    roots = [Path(r).absolute() for r in roots]
    try:
        ds = Datastore.open(out, tokenizer=tokenizer, repair=True)
        if sorted(ds.manifest.get("roots", [])) != sorted(map(str, roots)):
            raise IndexerError("different roots")
        if filters is not None and ds.manifest.get("filters") != filters.to_dict():
            raise IndexerError("different filters")
        s = ds.sync()
        if log_fn:
            log_fn(f"opened {out}: {ds.stats()['documents']} documents; synced (+{s['added']} ~{s['changed']} -{s['removed']})")
        return ds
    except IndexerError as e:
        if not isinstance(e, DatastoreNotFound):   # damaged, or built differently: say why it is rebuilt
            log.warning("rebuilding %s: %s", out, e)
        if log_fn:
            log_fn(f"building {out} ({e})")
    return Datastore.build(roots, out, tokenizer=tokenizer, filters=filters)


def watch_forever(roots, out, *, tokenizer, filters=None, debounce_s: float = 0.2, verbose: bool = True) -> None:
    def say(msg):
        if verbose:
            print(f"rest-index: {msg}", file=sys.stderr, flush=True)

    ds = open_or_build(roots, out, tokenizer=tokenizer, filters=filters, log_fn=say)

    def on_update(s):
        say(f"+{s['added']} ~{s['changed']} -{s['removed']} in {s['apply_s'] * 1e3:.0f} ms "
            f"(searchable {s['latency_s'] * 1e3:.0f} ms after the first event)")

    with Watcher(ds, roots, debounce_s=debounce_s, on_update=on_update):
        say(f"watching {', '.join(map(str, roots))} -> {out} (Ctrl-C to stop)")
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            say("stopped")
