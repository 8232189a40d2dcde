"""The workspace datastores as one draft source, swappable while the server runs (no torch here)."""
from __future__ import annotations

import logging
import threading
from typing import Sequence

log = logging.getLogger(__name__)


class DatastoreSet:
    """Several datastores searched as one (the workspace folders), swappable while the server runs.

    Searches run on the inference thread while indexing threads swap datastores in and feed live shards,
    under one lock for the list itself; the longest match wins, ties merge their continuations.
    """

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._stores: dict[str, object] = {}

    def set(self, key: str, store) -> None:
        with self._lock:
            old = self._stores.pop(key, None)
            if store is not None:
                self._stores[key] = store
        close = getattr(old, "close", None)
        if close is not None and old is not store:
            try:
                close()
            except Exception:  # noqa: BLE001
                log.exception("closing datastore %s", key)

    def get(self, key: str):
        with self._lock:
            return self._stores.get(key)

    def keys(self) -> list[str]:
        with self._lock:
            return list(self._stores)

    def __bool__(self) -> bool:
        with self._lock:
            return bool(self._stores)

    def call(self, key: str, method: str, *args) -> bool:
        """Run a method (set_live, drop_live, update_paths) on one store; False when there is none.
        indexer's Datastore is safe to search while it is written, so no lock is held during the call."""
        store = self.get(key)
        if store is None:
            return False
        getattr(store, method)(*args)
        return True

    def search(self, context: Sequence[int], **kw):
        """The longest match over every store (indexer.types.SearchResult): `search_rows` as objects."""
        return self.search_rows(context, **kw).result()

    def search_rows(self, context: Sequence[int], **kw):
        """The longest suffix match over every store (indexer.types.SearchRows), what the drafter's
        DatastoreSource reads: the stores that match it longest, their continuations merged heaviest first."""
        import numpy as np

        from indexer.types import SearchRows

        with self._lock:
            stores = list(self._stores.values())
        results = [r for r in (s.search_rows(context, **kw) for s in stores) if r.match_len > 0]
        if not results:
            return SearchRows.empty(max_len=kw.get("max_len", 10))
        best = max(r.match_len for r in results)
        top = [r for r in results if r.match_len == best]
        if len(top) == 1:
            return top[0]
        weights = np.concatenate([r.weights for r in top])
        order = np.argsort(-weights, kind="stable")  # heaviest first; among equals store by store
        return SearchRows(best, sum(r.count for r in top), np.concatenate([r.rows for r in top])[order],
                          np.concatenate([r.counts for r in top])[order], weights[order])
