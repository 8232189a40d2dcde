"""Readers pick up another writer's changes off the search path.

A store opened with `auto_refresh` is watched here: one daemon thread per process checks the manifests of the
watched stores (one stat each) every REFRESH_INTERVAL_S while they are searched, every IDLE_INTERVAL_S while
they are not, and reloads the ones another writer changed (`Datastore.refresh`: unchanged shards stay mapped).
A search only sets a flag. It used to stat the manifest itself at most every 0.1 s, which a CPU decoding step
(60-150 ms) made nearly every step: through pathlib and right after a forward pass had flushed the caches, that
was 0.1 ms of a 0.7 ms drafting step per store (docs/engine.md). The thread takes the GIL when it wakes, so it
wakes seldom: every 0.5 s it lands inside a CPU step's drafting (under 1 ms of 60-150) about once in 500 steps.
"""
from __future__ import annotations

import threading
import time
import weakref

REFRESH_INTERVAL_S = 0.5  # how soon a searched store sees another writer's manifest
IDLE_INTERVAL_S = 2.0  # the same for a store nobody searched since the last check

_watched: "weakref.WeakSet" = weakref.WeakSet()
_lock = threading.Lock()
_thread: threading.Thread | None = None


def watch(store) -> None:
    """Check `store` (anything with `searched` and `refresh(verify=, wait=)`) from now on, until it is
    garbage or `unwatch`ed."""
    global _thread
    with _lock:
        _watched.add(store)
        if _thread is None or not _thread.is_alive():
            _thread = threading.Thread(target=_run, name="rest-index-refresh", daemon=True)
            _thread.start()


def unwatch(store) -> None:
    with _lock:
        _watched.discard(store)


def check_once() -> bool:
    """One round over the watched stores: reload the changed ones; whether any was searched since the last."""
    with _lock:
        stores = list(_watched)
    busy = False
    for store in stores:
        busy |= store.searched
        store.searched = False
        try:  # never waits for a writer; a failure leaves the store serving the state it has
            store.refresh(verify=False, wait=False)
        except Exception:
            pass
    return busy


def _run() -> None:
    while True:
        busy = check_once()
        time.sleep(REFRESH_INTERVAL_S if busy else IDLE_INTERVAL_S)
