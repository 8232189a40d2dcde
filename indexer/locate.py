"""Where a token sequence occurs in a datastore's files: exact search through the suffix arrays, answered as
(file path, token offset in that file). The daemon's cross-file context (rest_lsp/service/crossfile.py) finds
the files that define or use a name, and the code most like the cursor's, with it.

    finder = Locator(store)
    total, hits = finder.occurrences(ids_of(" parse_header"), limit=64)   # hits: [("pkg/http.py", 812), ...]
    tokens = finder.tokens("pkg/http.py")                                 # the file's ids as indexed

Only the store's own files count (documents of its manifest, the current version of each): attached stores
(a corpus) and live shards (open buffers) are not files of this repository, and a changed file's old version
is not a document any more. What the store holds was filtered (`exclude`, .gitignore) and masked (secrets)
when it was indexed, so nothing located here can bring an excluded file or a secret into a prompt.
"""
from __future__ import annotations

import threading
from typing import Sequence

import numpy as np


class Locator:
    """Occurrences of token sequences in one Datastore's documents; safe to use while the store is updated
    (a search sees one snapshot of shards; its document table is rebuilt when the documents change)."""

    def __init__(self, store):
        self.store = store
        self._lock = threading.Lock()
        self._table_for: object = None
        self._tables: dict[str, tuple[np.ndarray, np.ndarray, list[str]]] = {}

    def _doc_tables(self) -> dict[str, tuple[np.ndarray, np.ndarray, list[str]]]:
        """Per shard id: its documents' start and end token positions (sorted by start) and paths."""
        docs = self.store.documents
        key = (id(docs), len(docs), id(self.store.manifest))
        with self._lock:
            if self._table_for != key:
                by_shard: dict[str, list] = {}
                for path, d in docs.items():
                    by_shard.setdefault(d.shard, []).append((d.start, d.end, path))
                tables = {}
                for sid, rows in by_shard.items():
                    rows.sort()
                    tables[sid] = (np.array([r[0] for r in rows], dtype=np.int64),
                                   np.array([r[1] for r in rows], dtype=np.int64), [r[2] for r in rows])
                self._tables, self._table_for = tables, key
            return self._tables

    def occurrences(self, pattern: Sequence[int], limit: int = 64) -> tuple[int, list[tuple[str, int]]]:
        """(how many times the pattern occurs in the store's documents, up to `limit` of those occurrences as
        (path, offset of the pattern's first token in the file's tokens), spread over the suffix-array range)."""
        pat = np.asarray(pattern, dtype=np.int64)
        if pat.size == 0:
            return 0, []
        tables = self._doc_tables()
        total, hits = 0, []
        for sh in self.store.shards:
            table = tables.get(sh.id)
            if table is None or sh.kind == "live":
                continue
            cb = sh.encode(pat)
            if len(cb) != pat.size * sh.width:
                continue  # a token this shard does not hold: no occurrence here
            lo, hi = sh.find(cb)
            if hi <= lo:
                continue
            starts, ends, paths = table
            pos = sh.sample(lo, hi, max(limit, 1))
            i = np.searchsorted(starts, pos, side="right") - 1
            ok = (i >= 0) & (pos < ends[np.maximum(i, 0)])
            # the share of this shard's range that is a current document (the rest: old versions, masked)
            total += int(round((hi - lo) * (ok.sum() / max(1, pos.size))))
            for p, k in zip(pos[ok].tolist(), i[ok].tolist()):
                if len(hits) < limit:
                    hits.append((paths[k], p - int(starts[k])))
        return total, hits

    def tokens(self, path: str) -> np.ndarray | None:
        """The file's token ids as indexed (secrets masked), or None when it is not a document of the store."""
        d = self.store.documents.get(path)
        if d is None:
            return None
        for sh in self.store.shards:
            if sh.id == d.shard:
                return sh.ids(d.start, d.end)
        return None
