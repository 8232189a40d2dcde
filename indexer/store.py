"""The datastore: one directory of suffix-array shards plus in-memory live shards, searched together.

    ds = Datastore.open(".rest-index")                 # mmap; checksums verified
    ds.set_live("buffer:///a.py", ids)                 # open editor buffers, generated text
    r = ds.search(context_ids)                          # SearchResult (indexer.types)
    ds.update_paths([changed_file])                     # delta shard + masking, atomic

A Datastore is the reader: the snapshot of shards a search sees (this directory's, attached stores', live
ones), opening, refreshing after another process wrote, reporting. The search itself is indexer/search.py's;
changing the directory (update_paths, sync, compact, repair) is indexer/writer.py's, which reaches the store
through the seams below ("what a writer changes"). Readers never lock.
"""
from __future__ import annotations

import dataclasses
import os
import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from . import discover as disc
from .layout import sentinel_for_width, width_for_vocab
from .manifest import (MANIFEST, SHARD_DIR, Doc, kind_of, manifest_signature, pack_docs, read_manifest,
                       unpack_docs)
from .refresh import unwatch as unwatch_manifest, watch as watch_manifest
from .scan import ScanShard
from .search import one_shard_search, search_context, search_shards
from .shard import Shard
from .types import CorruptShard, IndexerError, SearchResult, SearchRows, TokenizerMismatch
from .writer import StoreWriter

DEFAULT_WEIGHTS = {"live": 4.0, "repository": 2.0, "corpus": 1.0}
MASKED_LISTED = 200  # files listed by name in stats()["masked"] (the most masked lines first)
# Searches are remembered per snapshot of the shards: a drafter asks for the same short suffix again and again
# (its 2-token back-off: a code corpus holds few distinct bigrams after the same tokens), and a remembered
# answer costs a dict lookup instead of two binary searches, a sample and its continuations.
SEARCH_CACHE_SIZE = 4096


class Datastore:
    """Search over a datastore directory (may be None: live shards only) and any attached stores."""

    def __init__(self, path: Path | None, manifest: dict, shards: list[Shard], *, weights=None,
                 tokenizer=None, auto_refresh: bool = True):
        self.path = Path(path) if path is not None else None
        self.weights = dict(DEFAULT_WEIGHTS)
        self.weights.update(weights or {})
        self.lock = threading.RLock()  # held while the shards change: by a writer for its whole change
        self._tokenizer = tokenizer
        self._live: dict[str, Shard] = {}
        self._attached: list[Datastore] = []
        self.searched = False  # since the refresh thread's last look (indexer.refresh)
        self._cache_lock = threading.Lock()
        self._cache: dict[tuple, SearchResult] = {}
        self._cache_for: tuple = ()  # the snapshot the cached results were found in
        self._discovery_for: tuple | None = None  # (the manifest's filters, Filters, IgnoreRules)
        compile_kernels()
        self._install(manifest, shards)
        self._sig = manifest_signature(self.path) if self.path is not None else None
        if auto_refresh and path is not None:
            watch_manifest(self)  # another writer's manifest is picked up off the search path

    # ---- opening ---------------------------------------------------------------------------------
    @classmethod
    def open(cls, path, *, tokenizer=None, weights: dict | None = None, verify: bool = True,
             repair: bool = False, attach: Iterable = (), auto_refresh: bool = True) -> "Datastore":
        """Open a datastore directory. `tokenizer` (name, path or tokenizer object) must have the
        vocabulary the store was built with (TokenizerMismatch otherwise). `verify` checks every shard's
        sha256; a damaged shard raises CorruptShard unless `repair`, which drops it and re-indexes its
        documents from their files. `attach`: more datastore directories searched together (read-only)."""
        path = Path(path)
        m = read_manifest(path)
        tok_obj = None
        if tokenizer is not None:
            tok_obj, given = _fingerprint_of(tokenizer)
            from .tokenizer import same_vocabulary

            if not same_vocabulary(m["tokenizer"], given):
                raise TokenizerMismatch(m["tokenizer"], given)
        w = dict(DEFAULT_WEIGHTS)
        w.update(weights or {})
        shards, bad = [], []
        for meta in m["shards"]:
            try:
                shards.append(Shard.load(path / SHARD_DIR, meta, m["width"], weight=w.get(kind_of(meta), 1.0),
                                         verify=verify))
            except CorruptShard:
                if not repair:
                    raise
                bad.append(meta["id"])
        ds = cls(path, m, shards, weights=weights, tokenizer=tok_obj, auto_refresh=auto_refresh)
        if bad:
            ds._repaired = StoreWriter(ds).repair(bad)
        for other in attach:
            ds.attach(other, verify=verify)
        return ds

    @classmethod
    def memory(cls, tokenizer=None, *, vocab_size: int | None = None, weights: dict | None = None) -> "Datastore":
        """A store without a directory: live shards only (tests, generated text)."""
        fp = None
        tok_obj = None
        if tokenizer is not None:
            tok_obj, fp = _fingerprint_of(tokenizer)
            vocab_size = fp["vocab_size"]
        if vocab_size is None:
            raise ValueError("give a tokenizer or a vocab_size")
        width = width_for_vocab(vocab_size)
        m = {"format": 1, "kind": "memory", "tokenizer": fp or {"name": None, "vocab_hash": None,
             "vocab_size": vocab_size}, "width": width, "sentinel": sentinel_for_width(width), "shards": [],
             "docs": pack_docs({}), "roots": [], "filters": None}
        return cls(None, m, [], weights=weights, tokenizer=tok_obj)

    @classmethod
    def build(cls, roots, path, **kw) -> "Datastore":
        """Build (or rebuild) a datastore from the files under roots, then open it."""
        from .build import build_datastore

        from .tokenizer import load_tokenizer

        open_kw = {k: kw.pop(k) for k in ("weights", "attach") if k in kw}
        kw["tokenizer"] = tok = load_tokenizer(kw.get("tokenizer"))   # resolved once, kept for updates
        build_datastore(roots, path, **kw)
        return cls.open(path, verify=False, tokenizer=tok, **open_kw)

    def attach(self, other, *, verify: bool = True) -> "Datastore":
        """Search another datastore together with this one (e.g. the corpus next to a repository)."""
        if not isinstance(other, Datastore):
            other = Datastore.open(other, verify=verify, weights=self.weights)
        from .tokenizer import same_vocabulary

        if self._manifest["tokenizer"].get("vocab_hash") and not same_vocabulary(
                self._manifest["tokenizer"], other._manifest["tokenizer"]):
            raise TokenizerMismatch(other._manifest["tokenizer"], self._manifest["tokenizer"])
        if other.width != self.width:
            raise IndexerError("attached datastore has a different token width")
        with self.lock:
            self._attached.append(other)
            self._rebuild_snapshot()
        return self

    def prefault(self) -> float:
        """Map the pages of every shard (attached stores too) into this process now, so that the first
        searches do not fault them in one by one (`Shard.prefault`; about 75 ms for a 47M-token corpus from
        the page cache). Returns the seconds it took."""
        t = time.perf_counter()
        for sh in self._snapshot:
            sh.prefault()
        return time.perf_counter() - t

    def close(self) -> None:
        unwatch_manifest(self)
        with self.lock:
            self._shards = []
            self._live = {}
            self._attached = []
            self._snapshot = ()

    def __enter__(self):
        return self

    def __exit__(self, *a):
        self.close()

    # ---- state -----------------------------------------------------------------------------------
    def _install(self, manifest: dict, shards: list[Shard], docs: dict | None = None) -> None:
        with self.lock:
            self._manifest = manifest
            self.width = int(manifest["width"])
            self.sentinel = sentinel_for_width(self.width)
            self._docs: dict[str, Doc] = docs if docs is not None else unpack_docs(manifest["docs"])
            self._shards = shards
            self._rebuild_snapshot()

    def _rebuild_snapshot(self, shards: list | None = None) -> None:
        snap = [s for s in (self._shards if shards is None else shards) if s.n]
        for a in self._attached:
            snap += [s for s in a._shards if s.n]
        snap += [s for s in self._live.values() if s.n]
        snap.sort(key=lambda s: -s.n)
        self._snapshot = tuple(snap)

    @property
    def manifest(self) -> dict:
        return self._manifest

    @property
    def kind(self) -> str:
        return self._manifest.get("kind", "repository")

    @property
    def fingerprint(self) -> dict:
        return dict(self._manifest["tokenizer"])

    @property
    def documents(self) -> dict[str, Doc]:
        return self._docs

    @property
    def shards(self) -> tuple:
        """The shards searched now (this store's, attached stores', live ones), largest first."""
        return self._snapshot

    @property
    def tokenizer(self):
        """The store's tokenizer (loaded on first use from what the manifest names)."""
        if self._tokenizer is None:
            from .tokenizer import EMBEDDED_NAME, load_tokenizer

            src = self._manifest.get("tokenizer_source")
            if src is None and self._manifest["tokenizer"].get("name") == EMBEDDED_NAME:
                src = "embedded"  # stores built before sources were always recorded
            tok = load_tokenizer(src)
            _, fp = _fingerprint_of(tok)
            from .tokenizer import same_vocabulary

            if not same_vocabulary(self._manifest["tokenizer"], fp):
                raise TokenizerMismatch(self._manifest["tokenizer"], fp)
            self._tokenizer = tok
        return self._tokenizer

    def live_names(self) -> list[str]:
        return list(self._live)

    # ---- search ----------------------------------------------------------------------------------
    def search(self, context: Sequence[int], *, n_max: int = 16, n_min: int = 2, k: int = 5000,
               max_len: int = 10, limit: int | None = None, first_k: bool = False) -> SearchResult:
        """Longest suffix of `context` (n_max down to n_min tokens) that occurs in any shard, and up to
        k of its occurrences' continuations (up to max_len tokens, never past a document's end), spread
        evenly over the whole match range of each shard, merged with each shard's weight. `limit`: return
        only that many continuations, the heaviest (saves building the objects of the long tail).
        `first_k`: take the first k occurrences in suffix-array order instead, shard by shard in snapshot
        order, as the REST reference code does (a biased sample, kept for the `rest-paper` baseline)."""
        return self.search_rows(context, n_max=n_max, n_min=n_min, k=k, max_len=max_len, limit=limit,
                                first_k=first_k).result()

    def search_rows(self, context: Sequence[int], *, n_max: int = 16, n_min: int = 2, k: int = 5000,
                    max_len: int = 10, limit: int | None = None, first_k: bool = False) -> SearchRows:
        """`search` as arrays (indexer.types.SearchRows): the drafter's path, with no object per continuation."""
        self.searched = True
        shards = self._snapshot
        if n_max <= 0 or not shards:
            return SearchRows.empty(max_len=max_len)
        ctx = search_context(context, n_max, self.sentinel)
        n_min = max(1, n_min)
        if len(ctx) < n_min:
            return SearchRows.empty(max_len=max_len)
        if SEARCH_CACHE_SIZE <= 0:
            return search_shards(shards, ctx, n_min, k, max_len, limit, first_k)
        key = (ctx.tobytes(), n_min, k, max_len, limit, first_k)  # the tokens searched: len(ctx) <= n_max
        with self._cache_lock:
            if self._cache_for is not shards:
                self._cache, self._cache_for = {}, shards
            hit = self._cache.pop(key, None)
            if hit is not None:
                self._cache[key] = hit  # the most recently used go last: evicted last
                return hit
        result = search_shards(shards, ctx, n_min, k, max_len, limit, first_k)
        with self._cache_lock:
            if self._cache_for is shards:
                if len(self._cache) >= SEARCH_CACHE_SIZE:
                    del self._cache[next(iter(self._cache))]  # the least recently used
                self._cache[key] = result
        return result

    # ---- live shards -----------------------------------------------------------------------------
    def set_live(self, name: str, tokens: Sequence[int], *, weight: float | None = None) -> None:
        """Replace the live shard `name` (an open buffer, generated text) with these tokens."""
        sh = ScanShard(name, "live", tokens, self.width, weight=self.weights["live"] if weight is None else weight)
        with self.lock:
            self._live[name] = sh
            self._rebuild_snapshot()

    def drop_live(self, name: str) -> None:
        with self.lock:
            if self._live.pop(name, None) is not None:
                self._rebuild_snapshot()

    # ---- refresh (another process wrote the directory) ---------------------------------------------
    def refresh(self, *, verify: bool = True, wait: bool = True) -> bool:
        """Reload the manifest if another writer changed it; unchanged shards stay mapped. Returns whether
        it reloaded (`wait=False`: not when this object's own writer holds the lock right now)."""
        if self.path is None:
            return False
        sig = manifest_signature(self.path)
        if sig is None or sig == self._sig:
            return False
        if not self.lock.acquire(blocking=wait):
            return False
        try:
            return self.reload_if_changed(verify=verify)
        finally:
            self.lock.release()

    def _load_from_manifest(self, m: dict, *, verify: bool, docs: dict | None = None) -> None:
        if self._manifest.get("tokenizer", {}).get("vocab_hash") != m["tokenizer"].get("vocab_hash") or \
                m["width"] != self.width:
            self._tokenizer = None
        old = {s.id: s for s in self._shards}
        shards = []
        for meta in m["shards"]:
            s = old.get(meta["id"])
            dead = [tuple(x) for x in meta.get("dead", [])]
            if s is not None and s.n == meta["tokens"]:
                if dead != s.dead:
                    s = dataclasses.replace(s, dead=dead)
            else:
                s = Shard.load(self.path / SHARD_DIR, meta, m["width"], weight=self.weights.get(kind_of(meta), 1.0),
                               verify=verify)
            shards.append(s)
        self._install(m, shards, docs)

    # ---- what a writer changes (indexer/writer.py) -------------------------------------------------
    @property
    def own_shards(self) -> list[Shard]:
        """This directory's shards as installed (not attached stores', not live ones)."""
        return self._shards

    def publish(self, dead_add: dict, delta: Shard | None) -> None:
        """Search the new masks and the delta shard before they are on disk."""
        shards = [dataclasses.replace(s, dead=sorted(set(s.dead) | {tuple(x) for x in dead_add[s.id]}))
                  if s.id in dead_add else s for s in self._shards]
        if delta is not None:
            shards.append(delta)
        with self.lock:
            self._rebuild_snapshot(shards)

    def unpublish(self) -> None:
        """Serve the installed shards again (what `publish` showed was not written)."""
        with self.lock:
            self._rebuild_snapshot()

    def adopt(self, m: dict, docs: dict | None = None) -> None:
        """Serve the manifest this process has just written; its signature is remembered, so that the refresh
        thread does not load it again."""
        self._sig = manifest_signature(self.path)
        self._load_from_manifest(m, verify=False, docs=docs)

    def reload_if_changed(self, *, verify: bool = False) -> bool:
        """Under `lock`: load the manifest on disk if another writer changed it (unchanged shards stay mapped);
        whether it did."""
        sig = manifest_signature(self.path)
        if sig == self._sig:
            return False
        self._load_from_manifest(read_manifest(self.path), verify=verify)
        self._sig = sig
        return True

    def filters(self) -> disc.Filters:
        """The discovery filters of this datastore (what a build, an update and the watcher skip)."""
        return self._discovery()[0]

    def ignore_rules(self) -> disc.IgnoreRules:
        """The ignore files' rules under these filters (each directory's read once while unchanged)."""
        return self._discovery()[1]

    def _discovery(self) -> tuple[disc.Filters, disc.IgnoreRules]:
        src = self._manifest.get("filters")
        if self._discovery_for is None or self._discovery_for[0] is not src:
            f = disc.Filters.from_dict(src)
            self._discovery_for = (src, f, disc.IgnoreRules(f))
        return self._discovery_for[1:]

    # ---- changing the directory: indexer/writer.py ------------------------------------------------
    def update_paths(self, paths: Iterable[Path]) -> dict:
        """Re-read these files or folders (changed, created, deleted, renamed): the old content of a
        changed or deleted document is masked in its shard, new content goes into a delta shard, and
        small shards merge (log-structured). Returns a summary {"added", "removed", "unchanged", ...}."""
        return StoreWriter(self).update_paths(paths)

    def sync(self) -> dict:
        """Bring the store up to date with its roots (`StoreWriter.sync`): a full scan against the manifest.
        Returns the summary of `update_paths`, with "rechecked"."""
        return StoreWriter(self).sync()

    def compact(self) -> dict:
        """Merge every shard into one, dropping masked documents; returns `stats()`."""
        return StoreWriter(self).compact()

    # ---- reporting -------------------------------------------------------------------------------
    def stats(self) -> dict:
        tokens = sum(d.end - d.start for d in self._docs.values())
        size = 0
        if self.path is not None:
            for f in [self.path / MANIFEST] + [self.path / SHARD_DIR / n for s in self._shards for n in s.files]:
                try:
                    size += f.stat().st_size
                except OSError:
                    pass
        stored = sum(s.n for s in self._shards)
        masked = {p: d.masked for p, d in self._docs.items() if d.masked}
        return {
            "tokens": tokens,
            "documents": len(self._docs),
            "bytes_on_disk": size,
            "bytes_per_token": round(size / tokens, 3) if tokens else 0.0,
            "shards": len(self._shards),
            "kind": self.kind,
            "width": self.width,
            "stored_tokens": stored,
            "dead_tokens": sum(s.dead_tokens for s in self._shards),
            "live_shards": len(self._live),
            "tokenizer": self.fingerprint,
            "generation": self._manifest.get("generation", 0),
            # lines emptied before tokenization because they carry a secret: counts, never the values
            "masked_lines": sum(masked.values()),
            "masked_files": len(masked),
            "masked": dict(sorted(masked.items(), key=lambda kv: (-kv[1], kv[0]))[:MASKED_LISTED]),
        }

    def verify(self) -> list[str]:
        """Re-check every shard's checksum; returns the problems found (empty: all good)."""
        problems = []
        if self.path is None:
            return problems
        for meta in self._manifest["shards"]:
            try:
                Shard.load(self.path / SHARD_DIR, meta, self.width, verify=True)
            except CorruptShard as e:
                problems.append(str(e))
        return problems


def _fingerprint_of(tokenizer):
    """(tokenizer object or None, fingerprint dict) from a name/path, a tokenizer object or a dict."""
    from .tokenizer import fingerprint, load_tokenizer

    if isinstance(tokenizer, dict):
        return None, tokenizer
    if isinstance(tokenizer, (str, os.PathLike)):
        tok = load_tokenizer(tokenizer)
        return tok, fingerprint(tok)
    return tokenizer, fingerprint(tokenizer)


def compile_kernels() -> None:
    """The search's compiled loops, compiled now (the first time on a machine: seconds) or loaded from the disk
    cache (milliseconds), not in a first completion: a tiny in-memory store holding a shard of each storage
    kind (2-byte ranks with an alphabet, 4-byte ids) and a live buffer, searched once at every match level.
    The first store a process opens calls it."""
    global _COMPILED
    if _COMPILED:
        return
    _COMPILED = True
    rng = np.random.default_rng(0)
    tokens = np.concatenate([rng.integers(0, 60, 300), np.tile(np.arange(60, 80), 8)]).astype(np.uint32)
    shards = [Shard.from_tokens("ranks", "repository", tokens, 4, compact=True),
              Shard.from_tokens("ids", "corpus", tokens + 65_600, 4)]
    masked = dataclasses.replace(shards[0], id="masked", dead=[(0, 40)])  # counts that leave masks out
    ds = Datastore.memory(vocab_size=70_000)
    ds._install(ds.manifest, shards + [masked])
    ds.set_live("live", tokens.tolist())
    for context in (tokens[:40].tolist(), np.arange(60, 75).tolist(), [1, 2, 3]):
        for n_max, n_min in ((16, 2), (2, 2)):
            ds.search_rows(context, n_max=n_max, n_min=n_min, k=256, max_len=6, limit=32)
    for sh in shards:  # a store of one shard searches in one call
        one_shard_search(*sh.kernel_view(), sh.rank_table(), np.arange(60, 75, dtype=np.int64), 2, 256, 6, 1.0, 32)


_COMPILED = False
