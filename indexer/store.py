"""The datastore: one directory of suffix-array shards plus in-memory live shards, searched together.

    ds = Datastore.open(".rest-index")                 # mmap; checksums verified
    ds.set_live("buffer:///a.py", ids)                 # open editor buffers, generated text
    r = ds.search(context_ids)                          # SearchResult (indexer.types)
    ds.update_paths([changed_file])                     # delta shard + masking, atomic

Readers never lock. Writers (update_paths, sync, compact, build) hold the directory's writer lock, write
new shard files first and the manifest last, each through a temporary file, fsync and rename, and only
then delete files that the new manifest no longer names.
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
from .ingest import content_hash, read_document  # noqa: F401 - content_hash: callers import it from here
from .manifest import (MANIFEST, SHARD_DIR, Doc, manifest_signature, pack_docs, racy_documents, read_manifest,
                       remove_unreferenced, unpack_docs, write_manifest, writer_lock)
from .refresh import unwatch as unwatch_manifest, watch as watch_manifest
from rest_lsp.jit import njit
from .shard import (ScanShard, Shard, sa_find, sa_longest, encode_kernel, id_rows_kernel, padded_ids,
                    rank_order_kernel, join_documents, kind_of, sentinel_for_width, sort_shard, width_for_vocab,
                    write_shard)
from .types import CorruptShard, IndexerError, SearchResult, SearchRows, TokenizerMismatch

DEFAULT_WEIGHTS = {"live": 4.0, "repository": 2.0, "corpus": 1.0}
MERGE_FANOUT = 4  # shards of one size class that trigger a merge (log-structured, size-tiered)
LEVEL_BASE_TOKENS = 1 << 16  # size class 0: shards below 64k tokens
MASKED_LISTED = 200  # files listed by name in stats()["masked"] (the most masked lines first)
# Searches are remembered per snapshot of the shards: a drafter asks for the same short suffix again and again
# (its 2-token back-off: a code corpus holds few distinct bigrams after the same tokens), and a remembered
# answer costs a dict lookup instead of two binary searches, a sample and its continuations.
SEARCH_CACHE_SIZE = 4096


def _level(tokens: int) -> int:
    lvl, size = 0, LEVEL_BASE_TOKENS
    while tokens >= size:
        lvl += 1
        size *= MERGE_FANOUT
    return lvl


class Datastore:
    """Search over a datastore directory (may be None: live shards only) and any attached stores."""

    def __init__(self, path: Path | None, manifest: dict, shards: list[Shard], *, weights=None,
                 tokenizer=None, auto_refresh: bool = True):
        self.path = Path(path) if path is not None else None
        self.weights = dict(DEFAULT_WEIGHTS)
        self.weights.update(weights or {})
        self._lock = threading.RLock()
        self._tokenizer = tokenizer
        self._live: dict[str, Shard] = {}
        self._attached: list[Datastore] = []
        self.searched = False  # since the refresh thread's last look (indexer.refresh)
        self._cache_lock = threading.Lock()
        self._cache: dict[tuple, SearchResult] = {}
        self._cache_for: tuple = ()  # the snapshot the cached results were found in
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
            ds._repair(bad)
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
        with self._lock:
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
        with self._lock:
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
        with self._lock:
            self._manifest = manifest
            self.width = int(manifest["width"])
            self.sentinel = sentinel_for_width(self.width)
            self._docs: dict[str, Doc] = docs if docs is not None else unpack_docs(manifest["docs"])
            self._shards = shards
            self._rebuild_snapshot()

    def _publish(self, dead_add: dict, delta: Shard | None) -> None:
        """Search the new masks and the delta shard before they are on disk."""
        shards = [dataclasses.replace(s, dead=sorted(set(s.dead) | {tuple(x) for x in dead_add[s.id]}))
                  if s.id in dead_add else s for s in self._shards]
        if delta is not None:
            shards.append(delta)
        with self._lock:
            self._rebuild_snapshot(shards)

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
        ctx = self._search_context(context, n_max)
        n_min = max(1, n_min)
        if len(ctx) < n_min:
            return SearchRows.empty(max_len=max_len)
        if SEARCH_CACHE_SIZE <= 0:
            return self._search(shards, ctx, n_min, k, max_len, limit, first_k)
        key = (ctx.tobytes(), n_min, k, max_len, limit, first_k)  # the tokens searched: len(ctx) <= n_max
        with self._cache_lock:
            if self._cache_for is not shards:
                self._cache, self._cache_for = {}, shards
            hit = self._cache.pop(key, None)
            if hit is not None:
                self._cache[key] = hit  # the most recently used go last: evicted last
                return hit
        result = self._search(shards, ctx, n_min, k, max_len, limit, first_k)
        with self._cache_lock:
            if self._cache_for is shards:
                if len(self._cache) >= SEARCH_CACHE_SIZE:
                    del self._cache[next(iter(self._cache))]  # the least recently used
                self._cache[key] = result
        return result

    def _search(self, shards: tuple, ctx_a: np.ndarray, n_min: int, k: int, max_len: int, limit: int | None,
                first_k: bool) -> SearchRows:
        lim = -1 if limit is None else max(0, limit)
        if len(shards) == 1 and _compiled_whole(shards[0]) and not first_k and k > 0 and max_len > 0:
            # the common case (a corpus, a repository in one shard): the whole search in one compiled call.
            # Right after a CPU forward pass every Python and numpy call runs from cold caches (0.05-0.1 ms
            # each), and the path below makes about twenty of them: docs/engine.md
            sh = shards[0]
            return SearchRows(*_one_shard_search(*sh.kernel_view(), sh.rank_table(), ctx_a, n_min, k, max_len,
                                                 float(sh.weight), lim))
        best, hits = _longest_match(shards, ctx_a, n_min)
        if best == 0:
            return SearchRows.empty(max_len=max_len)
        info = []
        total = 0
        for sh, cb, first in hits:
            c, lo, hi = sh.count(cb[-best * sh.width:], first)
            if c > 0:
                info.append((sh, c, lo, hi))
                total += c
        if k <= 0 or max_len <= 0:
            return SearchRows.empty(best, total, max_len)
        if len(info) == 1 and not first_k and _compiled_whole(info[0][0]):
            # the common case (the corpus alone holds the match): sample to ranking in one compiled call
            sh, c, lo, hi = info[0]
            quota = (hi - lo) if total <= k else max(1, round(k * c / total))
            return SearchRows(best, total, *_one_shard_ranked(*sh.kernel_view(), lo, hi, quota, best, max_len,
                                                              float(sh.weight), lim))
        rows, counts, weights = _continuations(info, total, best, k, max_len, first_k)
        return SearchRows(best, total, *_ranked(rows, counts, weights, lim))

    def _search_context(self, context: Sequence[int], n_max: int) -> np.ndarray:
        """The last n_max tokens of the context [<= n_max] int64, after the last one no shard can hold (out of
        range). A few calls, not one per token: right after a CPU forward pass each costs 0.02-0.06 ms."""
        tail = np.ascontiguousarray(context[-n_max:], dtype=np.int64)  # n_max > 0
        return tail[_in_range_from(tail, self.sentinel):]

    # ---- live shards -----------------------------------------------------------------------------
    def set_live(self, name: str, tokens: Sequence[int], *, weight: float | None = None) -> None:
        """Replace the live shard `name` (an open buffer, generated text) with these tokens."""
        sh = ScanShard(name, "live", tokens, self.width, weight=self.weights["live"] if weight is None else weight)
        with self._lock:
            self._live[name] = sh
            self._rebuild_snapshot()

    def drop_live(self, name: str) -> None:
        with self._lock:
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
        if not self._lock.acquire(blocking=wait):
            return False
        try:
            sig = manifest_signature(self.path)
            if sig == self._sig:
                return False
            m = read_manifest(self.path)
            self._load_from_manifest(m, verify=verify)
            self._sig = sig
            return True
        finally:
            self._lock.release()

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

    # ---- writing ---------------------------------------------------------------------------------
    def _require_dir(self):
        if self.path is None:
            raise IndexerError("this datastore has no directory (Datastore.memory): nothing to update")

    def _reload_locked(self) -> None:
        """Under the writer lock: pick up another writer's manifest before changing anything, and delete
        what a writer that died left behind (nothing else can be writing now)."""
        sig = manifest_signature(self.path)
        if sig != self._sig:
            self._load_from_manifest(read_manifest(self.path), verify=False)
            self._sig = sig
        remove_unreferenced(self.path, {f["name"] for s in self._manifest["shards"] for f in s["files"].values()})

    def _next_id(self, m: dict) -> str:
        n = int(m.get("next_shard", 0))
        m["next_shard"] = n + 1
        return f"s{n:06d}"

    def _filters(self) -> disc.Filters:
        f = getattr(self, "_filters_obj", None)
        if f is None or self._filters_src is not self._manifest.get("filters"):
            self._filters_src = self._manifest.get("filters")
            f = self._filters_obj = disc.Filters.from_dict(self._filters_src)
            self._rules = disc.IgnoreRules(f)
        return f

    def filters(self) -> disc.Filters:
        """The discovery filters of this datastore (what a build, an update and the watcher skip)."""
        return self._filters()

    def update_paths(self, paths: Iterable[Path]) -> dict:
        """Re-read these files or folders (changed, created, deleted, renamed): the old content of a
        changed or deleted document is masked in its shard, new content goes into a delta shard, and
        small shards merge (log-structured). Returns a summary {"added", "removed", "unchanged", ...}."""
        self._require_dir()
        t0 = time.perf_counter()
        with writer_lock(self.path), self._lock:
            self._reload_locked()
            return self._update_locked([Path(p) for p in paths], t0)

    def sync(self) -> dict:
        """Bring the store up to date with its roots: a full scan comparing size and mtime with the manifest,
        and the content hash of the documents whose recorded mtime is too close to the last full scan for the
        stat to tell (`racy_documents`). Returns the summary of `update_paths`, with "rechecked"."""
        self._require_dir()
        t0 = time.perf_counter()
        with writer_lock(self.path), self._lock:
            self._reload_locked()
            scanned_ns = time.time_ns()   # before the walk: a write after its stat is after this time too
            filters = self._filters()
            rep = disc.Report()
            seen = {}
            for c in disc.walk(self._manifest["roots"], filters, rep, self._rules):
                seen[str(c.path)] = c
            stale = [Path(p) for p, d in self._docs.items() if p not in seen]
            changed = [c.path for p, c in seen.items()
                       if p not in self._docs or (self._docs[p].size, self._docs[p].mtime_ns) != (c.size, c.mtime_ns)]
            racy = racy_documents(self._docs, self._manifest.get("scanned_ns"))
            recheck = {p for p in racy if p in seen}
            out = self._update_locked(stale + changed + [seen[p].path for p in recheck], t0, known=seen,
                                      recheck=recheck, scanned_ns=scanned_ns)
            out["rechecked"] = len(recheck)
            out["errors"] = out.get("errors", []) + rep.errors
            return out

    def _update_locked(self, paths: list[Path], t0: float, known: dict | None = None, *,
                       recheck: set[str] = frozenset(), scanned_ns: int | None = None) -> dict:
        """scanned_ns: this update is a full scan started then (sync), recorded for the next one's racy check."""
        m = dict(self._manifest)
        # a first full scan of an older manifest, or racy documents found unchanged: record this scan anyway,
        # or the next start would re-read them all again
        stamp = scanned_ns is not None and (m.get("scanned_ns") is None or bool(recheck))
        if scanned_ns is not None:
            m["scanned_ns"] = scanned_ns
        edit = _Edit(self._docs)
        cands = self._candidates(paths, [Path(r) for r in m.get("roots", [])], edit, known)
        new, touched_meta = self._read_changed(cands, edit, recheck)
        summary, docs = edit.summary, edit.docs
        if not new and not edit.dead and not touched_meta:
            if stamp:
                self._commit(m, dict(docs))
            summary["seconds"] = time.perf_counter() - t0
            return summary

        kind = m.get("kind", "repository")
        sid = arr = prepared = None
        if new:
            sid = self._next_id(m)
            arr, prepared = self._tokenize_delta(new, sid, m, docs)
        # searchable now, in this process: the new masks and the delta from memory; durable below
        self._publish(edit.dead, Shard.from_sorted(sid, kind, prepared, weight=self.weights.get(kind, 1.0))
                      if prepared is not None else None)
        summary["searchable_s"] = time.perf_counter() - t0
        metas = {s["id"]: dict(s) for s in m["shards"]}
        order = [s["id"] for s in m["shards"]]
        try:
            if prepared is not None:
                metas[sid], _ = write_shard(self.path / SHARD_DIR, sid, kind, arr, self.width, prepared=prepared)
                order.append(sid)
            for s_id, spans in edit.dead.items():
                if s_id in metas:
                    md = metas[s_id]
                    md["dead"] = sorted(set(tuple(x) for x in md.get("dead", [])) | set(spans))
            self._drop_empty(metas, order, docs)
            self._commit_shards(m, metas, order, docs, stats=True)
        except BaseException:
            with self._lock:  # not written: serve what is on disk again
                self._rebuild_snapshot()
            raise
        summary["durable_s"] = time.perf_counter() - t0
        # merging comes after the update is searchable, as a commit of its own
        before = list(order)
        self._merge(m, metas, order, docs, self.path / SHARD_DIR)
        if order != before:
            self._commit_shards(dict(m), metas, order, docs)
            summary["merged"] = True
        summary["shards"] = len(order)
        summary["seconds"] = time.perf_counter() - t0
        return summary

    def _commit_shards(self, m: dict, metas: dict, order: list, docs: dict, *, stats: bool = False) -> None:
        """Commit manifest `m` with these shards (in `order`) and documents, as the next generation."""
        m["shards"] = [metas[s] for s in order]
        m["docs"] = pack_docs(docs)
        m["generation"] = int(m.get("generation", 0)) + 1
        if stats:
            m["stats"] = _stats_of(docs)
        self._commit(m, dict(docs))

    def _candidates(self, paths: list[Path], roots: list[Path], edit: "_Edit",
                    known: dict | None) -> dict[str, disc.Candidate]:
        """The documents among `paths` (files, or folders walked) to read again; what is no longer a
        document (deleted, ignored, too big) is removed from `edit`."""
        filters, rules, docs = self._filters(), self._rules, edit.docs
        cands: dict[str, disc.Candidate] = {}
        for p in paths:
            p = p.absolute()
            key = str(p)
            if known is not None and key in known:
                cands[key] = known[key]
                continue
            if p.is_dir():
                found = {}
                for root in roots:
                    try:
                        p.relative_to(root)
                    except ValueError:
                        continue
                    # walked as its own root, then checked against the real root's ignore files
                    for c in disc.walk([p], filters, disc.Report(), rules):
                        if disc.is_document(c.path, roots, filters, rules)[0]:
                            found[str(c.path)] = c
                prefix = key.rstrip(os.sep) + os.sep
                for k2 in [k2 for k2 in docs if k2.startswith(prefix) and k2 not in found]:
                    edit.remove(k2)
                cands.update(found)
            elif p.is_file():
                ok, root = disc.is_document(p, roots, filters, rules)
                if not ok:
                    edit.remove(key)
                    continue
                try:
                    st = p.stat()
                except OSError:
                    edit.remove(key)
                    continue
                if st.st_size > filters.max_file_size:
                    edit.remove(key)
                    continue
                cands[key] = disc.Candidate(p, root, st.st_size, st.st_mtime_ns)
            else:
                edit.remove(key)
                prefix = key.rstrip(os.sep) + os.sep
                for k2 in [k2 for k2 in docs if k2.startswith(prefix)]:
                    edit.remove(k2)
        return cands

    def _read_changed(self, cands: dict[str, disc.Candidate], edit: "_Edit",
                      recheck: set[str] = frozenset()) -> tuple[list[tuple], bool]:
        """Read the candidates whose size or mtime changed, and those in `recheck` whatever their stat says:
        ([(key, mtime_ns, document)] of new content, whether only metadata changed somewhere (same hash, new
        mtime))."""
        filters, docs, summary = self._filters(), edit.docs, edit.summary
        new: list[tuple] = []
        touched_meta = False
        for key, c in cands.items():
            d = docs.get(key)
            if d is not None and d.size == c.size and d.mtime_ns == c.mtime_ns and key not in recheck:
                summary["unchanged"] += 1
                continue
            try:
                doc = read_document(c.path, filters.max_file_size, self.tokenizer)
            except FileNotFoundError:
                edit.remove(key)
                continue
            except OSError as e:  # unreadable now: keep serving what we had
                summary["errors"].append(f"{c.path}: {e.strerror or e}")
                continue
            if doc.skip is not None:
                edit.remove(key)
                continue
            if d is not None and d.hash == doc.hash:
                if (d.size, d.mtime_ns) != (doc.size, c.mtime_ns):
                    docs[key] = dataclasses.replace(d, size=doc.size, mtime_ns=c.mtime_ns)
                    touched_meta = True
                summary["unchanged"] += 1
                continue
            summary["undecodable"] += doc.undecodable
            summary["masked_lines"] += doc.masked_lines
            if edit.remove(key, count=False):
                summary["changed"] += 1
            else:
                summary["added"] += 1
            new.append((key, c.mtime_ns, doc))
        return new, touched_meta

    def _tokenize_delta(self, new: list[tuple], sid: str, m: dict, docs: dict):
        """The delta shard `sid` of the new documents, joined and suffix-sorted (not written yet); their
        entries in `docs` point into it. Returns (ids, prepared sort)."""
        from .tokenizer import encode_batch

        texts = [doc.text for _, _, doc in new if doc.pieces is None]
        ids = iter(encode_batch(self.tokenizer, texts) if texts else [])
        arr, spans = join_documents([doc.pieces if doc.pieces is not None else next(ids)
                                     for _, _, doc in new], self.width)
        prepared = sort_shard(arr, self.width, m["tokenizer"].get("vocab_size"))
        for (key, mtime, doc), (a, b) in zip(new, spans):
            docs[key] = Doc(doc.size, mtime, doc.hash, sid, a, b, doc.masked_lines)
        return arr, prepared

    @staticmethod
    def _drop_empty(metas: dict, order: list, docs: dict) -> None:
        alive = {d.shard for d in docs.values()}
        for sid in [s for s in order if s not in alive]:
            order.remove(sid)
            metas.pop(sid, None)

    def _merge(self, m: dict, metas: dict, order: list, docs: dict, shard_dir: Path) -> None:
        """Compact mostly-dead shards, merge size classes holding MERGE_FANOUT shards."""
        while True:
            groups: dict[int, list[str]] = {}
            compact = None
            for sid in order:
                md = metas[sid]
                dead = sum(b - a + 1 for a, b in md.get("dead", []))
                if md["tokens"] > 4096 and dead * 2 > md["tokens"]:
                    compact = [sid]
                    break
                groups.setdefault(_level(md["tokens"] - dead), []).append(sid)
            todo = compact or next((g for _, g in sorted(groups.items()) if len(g) >= MERGE_FANOUT), None)
            if not todo:
                return
            self._merge_group(m, metas, order, docs, shard_dir, todo)

    def _merge_group(self, m, metas, order, docs, shard_dir, group: list[str]) -> None:
        by_id = {s.id: s for s in self._shards}
        members = set(group)
        sel = sorted(((group.index(d.shard), d.start, key) for key, d in docs.items() if d.shard in members))
        toks = []
        for _, _, key in sel:
            d = docs[key]
            sh = by_id.get(d.shard)
            if sh is None:  # written in this same update: load it
                sh = Shard.load(shard_dir, metas[d.shard], self.width, verify=False)
                by_id[sh.id] = sh
            toks.append(sh.ids(d.start, d.end))
        arr, spans = join_documents(toks, self.width)
        sid = self._next_id(m)
        meta, _ = write_shard(shard_dir, sid, m.get("kind", "repository"), arr, self.width,
                              m["tokenizer"].get("vocab_size"))
        for (_, _, key), (a, b) in zip(sel, spans):
            docs[key] = dataclasses.replace(docs[key], shard=sid, start=a, end=b)
        pos = min(order.index(g) for g in group)
        for g in group:
            order.remove(g)
            metas.pop(g, None)
        order.insert(pos, sid)
        metas[sid] = meta

    def _commit(self, m: dict, docs: dict | None = None) -> None:
        """Manifest last; then swap the in-memory view; then delete what nothing names any more."""
        write_manifest(self.path, m)
        self._sig = manifest_signature(self.path)
        self._load_from_manifest(m, verify=False, docs=docs)
        keep = {f["name"] for s in m["shards"] for f in s["files"].values()}
        remove_unreferenced(self.path, keep)

    def compact(self) -> dict:
        """Merge every shard into one, dropping masked documents."""
        self._require_dir()
        with writer_lock(self.path), self._lock:
            self._reload_locked()
            m = dict(self._manifest)
            docs = dict(self._docs)
            metas = {s["id"]: dict(s) for s in m["shards"]}
            order = [s["id"] for s in m["shards"]]
            if len(order) > 1 or any(metas[s].get("dead") for s in order):
                self._merge_group(m, metas, order, docs, self.path / SHARD_DIR, list(order))
                m["shards"] = [metas[s] for s in order]
                m["docs"] = pack_docs(docs)
                m["generation"] = int(m.get("generation", 0)) + 1
                self._commit(m)
            return self.stats()

    def _repair(self, bad: list[str]) -> None:
        """Drop damaged shards and re-index their documents from the files."""
        with writer_lock(self.path), self._lock:
            m = read_manifest(self.path)
            docs = unpack_docs(m["docs"])
            lost = [p for p, d in docs.items() if d.shard in bad]
            for p in lost:
                del docs[p]
            m["shards"] = [s for s in m["shards"] if s["id"] not in bad]
            m["docs"] = pack_docs(docs)
            m["generation"] = int(m.get("generation", 0)) + 1
            write_manifest(self.path, m)
            self._sig = manifest_signature(self.path)
            self._load_from_manifest(m, verify=False)
            self._repaired = {"shards": bad, "documents": len(lost)}
            if lost:
                self._update_locked([Path(p) for p in lost], time.perf_counter())

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


def _compiled_whole(sh) -> bool:
    """Can one compiled call search this shard (a suffix-array shard without masked documents)?"""
    return isinstance(sh, Shard) and not sh.dead


@njit
def _in_range_from(ctx, sentinel):
    """Where the ids after the last one outside [0, sentinel) begin."""
    for i in range(ctx.shape[0] - 1, -1, -1):
        if ctx[i] < 0 or ctx[i] >= sentinel:
            return i + 1
    return 0


def _longest_match(shards, ctx_a: np.ndarray, n_min: int) -> tuple[int, list]:
    """The longest suffix of the context (at least n_min tokens) found in any shard, and the shards holding
    it with the context in each one's encoding and the first SA index of the match (`Shard.longest`):
    (length, [(shard, encoded context, first)]); (0, []) if none."""
    enc: dict = {}
    best, hits = 0, []
    for sh in shards:
        key = sh.width if sh.alpha is None else id(sh.alpha)
        cb = enc.get(key)
        if cb is None:
            cb = enc[key] = sh.encode(ctx_a)
        nl, first = sh.longest(cb, max(n_min, best), len(cb) // sh.width)
        if nl == 0:
            continue
        if nl > best:
            best, hits = nl, [(sh, cb, first)]
        else:
            hits.append((sh, cb, first))
    return best, hits


def _continuations(info: list, total: int, best: int, k: int, max_len: int, first_k: bool):
    """Up to k occurrences' continuations over the shards' match ranges `info` [(shard, count, lo, hi)],
    distinct: (rows [u, max_len] padded with -1, counts [u] int64, weights [u] float64)."""
    rows_l, cnt_l, wts_l = [], [], []
    left = k
    for sh, c, lo, hi in info:
        if first_k:
            if left <= 0:
                break
            pos = sh.first(lo, hi, left)
            left -= int(pos.size)
            uniq, counts = padded_ids(*sh.continuations(pos, best, max_len))
        else:
            quota = (hi - lo) if total <= k else max(1, round(k * c / total))
            uniq, counts = sh.id_rows(lo, hi, quota, best, max_len)
        rows_l.append(uniq)
        cnt_l.append(counts)
        wts_l.append(counts * float(sh.weight))
    if len(rows_l) == 1:  # distinct already
        return rows_l[0], cnt_l[0], wts_l[0]
    # the same continuation from several shards: one entry, counts and weights summed
    rows, inv = np.unique(np.concatenate(rows_l), axis=0, return_inverse=True)
    inv = inv.reshape(-1)
    counts = np.bincount(inv, weights=np.concatenate(cnt_l), minlength=len(rows)).astype(np.int64)
    weights = np.bincount(inv, weights=np.concatenate(wts_l), minlength=len(rows))
    return rows, counts, weights


@njit
def _ranked(rows, counts, weights, limit):
    """The continuations heaviest first, then most frequent, then by tokens: the first `limit` (-1: all) of
    (rows [u, max_len] int64, counts [u] int64, weights [u] float64)."""
    order = rank_order_kernel(rows, counts, weights)
    m = order.shape[0] if limit < 0 else min(limit, order.shape[0])
    out_rows = np.empty((m, rows.shape[1]), np.int64)
    out_counts = np.empty(m, np.int64)
    out_weights = np.empty(m, np.float64)
    for i in range(m):
        out_rows[i] = rows[order[i]]
        out_counts[i] = counts[order[i]]
        out_weights[i] = weights[order[i]]
    return out_rows, out_counts, out_weights


@njit
def _one_shard_ranked(tb, off, w, n_tok, sentinel, sa, alpha, lo, hi, quota, n, max_len, weight, limit):
    """`_ranked` of one shard's `Shard.id_rows` (no masked documents; arguments as `Shard.kernel_view`)."""
    rows, counts = id_rows_kernel(tb, off, w, n_tok, sentinel, sa, alpha, lo, hi, quota, n, max_len)
    return _ranked(rows, counts, counts * weight, limit)


@njit
def _one_shard_search(tb, off, w, n_tok, sentinel, sa, alpha, ranks, ctx, n_min, k, max_len, weight, limit):
    """`Datastore._search` over one shard without masked documents (k > 0, max_len > 0; arguments as
    `Shard.kernel_view`, then `Shard.rank_table`): (match length, count, rows, counts, weights)."""
    cb = encode_kernel(ranks, w, ctx)
    n_hi = cb.shape[0] // w
    best, first = sa_longest(tb, sa, off, w, cb, n_min, n_hi) if n_hi >= n_min else (0, -1)
    if best == 0:
        return 0, 0, np.full((0, max_len), -1, np.int64), np.zeros(0, np.int64), np.zeros(0, np.float64)
    lo, hi = sa_find(tb, sa, off, w, cb[cb.shape[0] - best * w:], first)
    rows, counts, weights = _one_shard_ranked(tb, off, w, n_tok, sentinel, sa, alpha, lo, hi, min(hi - lo, k), best,
                                              max_len, weight, limit)
    return best, hi - lo, rows, counts, weights


class _Edit:
    """An update in the making: the documents after it, the spans of old shards it makes dead, its summary."""

    def __init__(self, docs: dict):
        self.docs = dict(docs)
        self.dead: dict[str, list] = {}
        self.summary = {"added": 0, "changed": 0, "removed": 0, "unchanged": 0, "errors": [], "undecodable": 0,
                        "masked_lines": 0}

    def remove(self, key: str, *, count: bool = True) -> bool:
        """Drop the document `key` (its span goes dead); whether it was there. `count`: as a removal."""
        d = self.docs.pop(key, None)
        if d is None:
            return False
        self.dead.setdefault(d.shard, []).append((d.start, d.end))
        if count:
            self.summary["removed"] += 1
        return True


def _stats_of(docs: dict) -> dict:
    return {"documents": len(docs), "tokens": sum(d.end - d.start for d in docs.values())}


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
    ds = Datastore.memory(vocab_size=70_000)
    ds._install(ds.manifest, shards)
    ds.set_live("live", tokens.tolist())
    for context in (tokens[:40].tolist(), np.arange(60, 75).tolist(), [1, 2, 3]):
        for n_max, n_min in ((16, 2), (2, 2)):
            ds.search_rows(context, n_max=n_max, n_min=n_min, k=256, max_len=6, limit=32)
    for sh in shards:  # a store of one shard searches in one call
        _one_shard_search(*sh.kernel_view(), sh.rank_table(), np.arange(60, 75, dtype=np.int64), 2, 256, 6, 1.0, 32)


_COMPILED = False
