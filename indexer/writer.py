"""Changing a datastore directory: files re-read (added, changed, deleted, renamed), their old versions masked,
new content in a delta shard, small shards merged (log-structured, size-tiered), compaction and repair.

A writer holds the directory's writer lock for a whole change, writes new shard files first and the manifest
last, each through a temporary file, fsync and rename, and only then deletes files that the new manifest no
longer names. What it changed is searchable in this process before it is durable (`Datastore.publish`).
The store it changes (indexer/store.py) stays the reader: the writer reaches it through `lock`, `manifest`,
`documents`, `own_shards`, `publish`/`unpublish` and `adopt`.
"""
from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Iterable
from pathlib import Path

from . import discover as disc
from .ingest import read_document
from .manifest import (SHARD_DIR, Doc, pack_docs, racy_documents, read_manifest, remove_unreferenced,
                       unpack_docs, write_manifest, writer_lock)
from .shard import Shard
from .sorting import join_documents, sort_shard, write_shard
from .types import IndexerError

MERGE_FANOUT = 4  # shards of one size class that trigger a merge (log-structured, size-tiered)
LEVEL_BASE_TOKENS = 1 << 16  # size class 0: shards below 64k tokens


def _level(tokens: int) -> int:
    lvl, size = 0, LEVEL_BASE_TOKENS
    while tokens >= size:
        lvl += 1
        size *= MERGE_FANOUT
    return lvl


class StoreWriter:
    """One change of a Datastore's directory (`Datastore.update_paths`, `sync`, `compact`, and the repair
    `Datastore.open` runs)."""

    def __init__(self, store):
        self.store = store
        self.path = store.path
        if self.path is None:
            raise IndexerError("this datastore has no directory (Datastore.memory): nothing to update")

    def _reload_locked(self) -> None:
        """Under the writer lock: pick up another writer's manifest before changing anything, and delete
        what a writer that died left behind (nothing else can be writing now)."""
        self.store.reload_if_changed()
        remove_unreferenced(self.path, {f["name"] for s in self.store.manifest["shards"]
                                        for f in s["files"].values()})

    def _next_id(self, m: dict) -> str:
        n = int(m.get("next_shard", 0))
        m["next_shard"] = n + 1
        return f"s{n:06d}"

    def update_paths(self, paths: Iterable[Path]) -> dict:
        """Re-read these files or folders (changed, created, deleted, renamed): the old content of a
        changed or deleted document is masked in its shard, new content goes into a delta shard, and
        small shards merge (log-structured). Returns a summary {"added", "removed", "unchanged", ...}."""
        t0 = time.perf_counter()
        with writer_lock(self.path), self.store.lock:
            self._reload_locked()
            return self._update_locked([Path(p) for p in paths], t0)

    def sync(self) -> dict:
        """Bring the store up to date with its roots: a full scan comparing size and mtime with the manifest,
        and the content hash of the documents whose recorded mtime is too close to the last full scan for the
        stat to tell (`racy_documents`). Returns the summary of `update_paths`, with "rechecked"."""
        t0 = time.perf_counter()
        with writer_lock(self.path), self.store.lock:
            self._reload_locked()
            scanned_ns = time.time_ns()   # before the walk: a write after its stat is after this time too
            filters, rules = self.store.filters(), self.store.ignore_rules()
            rep = disc.Report()
            seen = {}
            for c in disc.walk(self.store.manifest["roots"], filters, rep, rules):
                seen[str(c.path)] = c
            docs = self.store.documents
            stale = [Path(p) for p, d in docs.items() if p not in seen]
            changed = [c.path for p, c in seen.items()
                       if p not in docs or (docs[p].size, docs[p].mtime_ns) != (c.size, c.mtime_ns)]
            racy = racy_documents(docs, self.store.manifest.get("scanned_ns"))
            recheck = {p for p in racy if p in seen}
            out = self._update_locked(stale + changed + [seen[p].path for p in recheck], t0, known=seen,
                                      recheck=recheck, scanned_ns=scanned_ns)
            out["rechecked"] = len(recheck)
            out["errors"] = out.get("errors", []) + rep.errors
            return out

    def _update_locked(self, paths: list[Path], t0: float, known: dict | None = None, *,
                       recheck: set[str] = frozenset(), scanned_ns: int | None = None) -> dict:
        """scanned_ns: this update is a full scan started then (sync), recorded for the next one's racy check."""
        m = dict(self.store.manifest)
        # a first full scan of an older manifest, or racy documents found unchanged: record this scan anyway,
        # or the next start would re-read them all again
        stamp = scanned_ns is not None and (m.get("scanned_ns") is None or bool(recheck))
        if scanned_ns is not None:
            m["scanned_ns"] = scanned_ns
        edit = _Edit(self.store.documents)
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
        self.store.publish(edit.dead, Shard.from_sorted(sid, kind, prepared, weight=self.store.weights.get(kind, 1.0))
                           if prepared is not None else None)
        summary["searchable_s"] = time.perf_counter() - t0
        metas = {s["id"]: dict(s) for s in m["shards"]}
        order = [s["id"] for s in m["shards"]]
        try:
            if prepared is not None:
                metas[sid], _ = write_shard(self.path / SHARD_DIR, sid, kind, arr, self.store.width,
                                            prepared=prepared)
                order.append(sid)
            for s_id, spans in edit.dead.items():
                if s_id in metas:
                    md = metas[s_id]
                    md["dead"] = sorted(set(tuple(x) for x in md.get("dead", [])) | set(spans))
            self._drop_empty(metas, order, docs)
            self._commit_shards(m, metas, order, docs, stats=True)
        except BaseException:
            self.store.unpublish()  # not written: serve what is on disk again
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
        filters, rules, docs = self.store.filters(), self.store.ignore_rules(), edit.docs
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
        filters, docs, summary = self.store.filters(), edit.docs, edit.summary
        new: list[tuple] = []
        touched_meta = False
        for key, c in cands.items():
            d = docs.get(key)
            if d is not None and d.size == c.size and d.mtime_ns == c.mtime_ns and key not in recheck:
                summary["unchanged"] += 1
                continue
            try:
                doc = read_document(c.path, filters.max_file_size, self.store.tokenizer)
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
        ids = iter(encode_batch(self.store.tokenizer, texts) if texts else [])
        arr, spans = join_documents([doc.pieces if doc.pieces is not None else next(ids)
                                     for _, _, doc in new], self.store.width)
        prepared = sort_shard(arr, self.store.width, m["tokenizer"].get("vocab_size"))
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
        by_id = {s.id: s for s in self.store.own_shards}
        members = set(group)
        sel = sorted(((group.index(d.shard), d.start, key) for key, d in docs.items() if d.shard in members))
        toks = []
        for _, _, key in sel:
            d = docs[key]
            sh = by_id.get(d.shard)
            if sh is None:  # written in this same update: load it
                sh = Shard.load(shard_dir, metas[d.shard], self.store.width, verify=False)
                by_id[sh.id] = sh
            toks.append(sh.ids(d.start, d.end))
        arr, spans = join_documents(toks, self.store.width)
        sid = self._next_id(m)
        meta, _ = write_shard(shard_dir, sid, m.get("kind", "repository"), arr, self.store.width,
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
        self.store.adopt(m, docs)
        keep = {f["name"] for s in m["shards"] for f in s["files"].values()}
        remove_unreferenced(self.path, keep)

    def compact(self) -> dict:
        """Merge every shard into one, dropping masked documents."""
        with writer_lock(self.path), self.store.lock:
            self._reload_locked()
            m = dict(self.store.manifest)
            docs = dict(self.store.documents)
            metas = {s["id"]: dict(s) for s in m["shards"]}
            order = [s["id"] for s in m["shards"]]
            if len(order) > 1 or any(metas[s].get("dead") for s in order):
                self._merge_group(m, metas, order, docs, self.path / SHARD_DIR, list(order))
                m["shards"] = [metas[s] for s in order]
                m["docs"] = pack_docs(docs)
                m["generation"] = int(m.get("generation", 0)) + 1
                self._commit(m)
            return self.store.stats()

    def repair(self, bad: list[str]) -> dict:
        """Drop damaged shards and re-index their documents from the files: {"shards", "documents"} dropped."""
        with writer_lock(self.path), self.store.lock:
            m = read_manifest(self.path)
            docs = unpack_docs(m["docs"])
            lost = [p for p, d in docs.items() if d.shard in bad]
            for p in lost:
                del docs[p]
            m["shards"] = [s for s in m["shards"] if s["id"] not in bad]
            m["docs"] = pack_docs(docs)
            m["generation"] = int(m.get("generation", 0)) + 1
            write_manifest(self.path, m)
            self.store.adopt(m)
            if lost:
                self._update_locked([Path(p) for p in lost], time.perf_counter())
            return {"shards": bad, "documents": len(lost)}


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

