"""Building a datastore from files: discover, read, tokenize in batches, join, suffix-sort, write."""
from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

from . import discover as disc
from .manifest import (SHARD_DIR, Doc, pack_docs, read_manifest, remove_unreferenced, write_manifest,
                       writer_lock)
from .shard import join_documents, release_freed_memory, sentinel_for_width, width_for_vocab, write_shard
from .ingest import read_document
from .types import IndexerError

MAX_SHARD_TOKENS = 1 << 27  # 134M tokens: keeps one suffix sort's memory bounded
BATCH_BYTES = 1 << 20


def corpus_roots() -> list[Path]:
    """The Python standard library and this environment's site-packages (no download needed)."""
    import site
    import sysconfig

    roots = []
    std = sysconfig.get_paths().get("stdlib")
    if std:
        roots.append(Path(std))
    for p in list(site.getsitepackages()) + [sysconfig.get_paths().get("purelib"), sysconfig.get_paths().get("platlib")]:
        if p and Path(p).is_dir() and Path(p) not in roots:
            roots.append(Path(p))
    return roots


def corpus_filters() -> disc.Filters:
    # The stdlib keeps site-packages inside it: index that root on its own, not twice; skip test suites.
    ex = set(disc.EXCLUDED_DIRS) | {"test", "tests", "idlelib", "turtledemo", "lib2to3"}
    return disc.Filters(languages=("python",), exclude_dirs=frozenset(ex))


def default_corpus_dir(tokenizer) -> Path:
    """Where the default corpus for this tokenizer (the model's: an object or a name) lives:
    <rest-lsp cache>/corpus/<vocab hash>."""
    from .embedded import cache_root
    from .tokenizer import fingerprint, load_tokenizer

    tok = load_tokenizer(tokenizer)
    return cache_root() / "corpus" / fingerprint(tok)["vocab_hash"][:16]


def ensure_corpus(tokenizer, *, progress: bool = False, max_tokens: int | None = None) -> Path:
    """The default corpus datastore (stdlib + site-packages) for this tokenizer, built on first use.
    Takes minutes once (about 50M tokens with torch and transformers installed)."""
    from .manifest import read_manifest

    from .tokenizer import load_tokenizer

    tok = load_tokenizer(tokenizer)
    out = default_corpus_dir(tok)
    try:
        read_manifest(out)
        return out
    except IndexerError:
        pass
    build_datastore([], out, tokenizer=tok, corpus_from_env=True, progress=progress, max_tokens=max_tokens)
    return out


class _Progress:
    def __init__(self, enabled: bool, total: int):
        self.bar = None
        if enabled:
            try:
                from tqdm import tqdm

                self.bar = tqdm(total=total, unit="B", unit_scale=True, desc="indexing", file=sys.stderr)
            except Exception:  # pragma: no cover
                self.bar = None

    def update(self, n):
        if self.bar is not None:
            self.bar.update(n)

    def close(self):
        if self.bar is not None:
            self.bar.close()


def build_datastore(roots, out, *, tokenizer, kind: str | None = None, filters: disc.Filters | None = None,
                    corpus_from_env: bool = False, progress: bool = False,
                    max_shard_tokens: int = MAX_SHARD_TOKENS, max_tokens: int | None = None) -> dict:
    """Build a datastore at `out` from the documents under `roots` (and/or the default corpus) in the
    model's tokenizer (an object or a name: indexer.tokenizer.load_tokenizer), replacing any datastore there
    only once the new one is complete. Returns a report."""
    from .tokenizer import encode_batch, fingerprint, load_tokenizer, tokenizer_source

    t_start = time.perf_counter()
    roots = [Path(r).expanduser().absolute() for r in roots]
    if corpus_from_env:
        roots += [r for r in corpus_roots() if r not in roots]
        filters = filters or corpus_filters()
        kind = kind or "corpus"
    kind = kind or "repository"
    filters = filters or disc.Filters()
    if not roots:
        raise IndexerError("nothing to index: give ROOT paths or --corpus-from-env")
    tok = load_tokenizer(tokenizer)
    fp = fingerprint(tok)
    width = width_for_vocab(fp["vocab_size"])
    out = Path(out)
    rep = disc.Report()
    missing = [r for r in roots if not r.exists()]
    if missing and len(missing) == len(roots):
        raise IndexerError("no root exists: " + ", ".join(map(str, missing)))

    # stdlib contains site-packages: walk each root once, excluding other roots nested in it
    t0 = time.perf_counter()
    cands, seen = [], set()
    for r in roots:
        for c in disc.walk([r], filters, rep):
            k = str(c.path)
            if k not in seen and not any(o != r and _under(c.path, o) for o in roots if _under(o, r)):
                seen.add(k)
                cands.append(c)
    discover_s = time.perf_counter() - t0

    with writer_lock(out):
        try:
            old = read_manifest(out)
        except IndexerError:
            old = None
        next_shard = int(old.get("next_shard", 0)) if old else 0
        shard_dir = out / SHARD_DIR
        docs: dict[str, Doc] = {}
        shard_metas = []
        tokenize_s = sort_s = write_s = 0.0
        undecodable = masked_lines = masked_files = 0
        pending_ids: list = []
        pending_meta: list = []
        pending_tokens = 0
        total_tokens = 0
        bar = _Progress(progress, sum(c.size for c in cands))

        def flush_shard():
            nonlocal next_shard, pending_ids, pending_meta, pending_tokens, sort_s, write_s
            if not pending_ids:
                return
            arr, spans = join_documents(pending_ids, width)
            pending_ids.clear()   # join_documents copied them: do not hold the tokens twice while sorting
            sid = f"s{next_shard:06d}"
            next_shard += 1
            handed = [arr]
            del arr               # write_shard frees the ids once compacted, before the suffix sort
            meta, tm = write_shard(shard_dir, sid, kind, handed, width, fp["vocab_size"])
            sort_s += tm["sort_s"]
            write_s += tm["write_s"]
            shard_metas.append(meta)
            for (key, size, mtime, h, masked), (a, b) in zip(pending_meta, spans):
                docs[key] = Doc(size, mtime, h, sid, a, b, masked)
            pending_ids, pending_meta, pending_tokens = [], [], 0

        batch_text, batch_meta, batch_bytes = [], [], 0

        def flush_batch():
            nonlocal batch_text, batch_meta, batch_bytes, tokenize_s, pending_tokens, total_tokens
            if not batch_text:
                return
            t = time.perf_counter()
            ids = encode_batch(tok, batch_text)
            arrs = [_compact_ids(x) for x in ids]
            tokenize_s += time.perf_counter() - t
            del ids
            release_freed_memory()   # the tokenizer's working memory, freed but kept by the allocator
            for a, meta in zip(arrs, batch_meta):
                add(a, a.size, meta)
            bar.update(batch_bytes)
            batch_text, batch_meta, batch_bytes = [], [], 0

        def add(tokens, n: int, meta: tuple) -> None:
            nonlocal pending_tokens, total_tokens
            if pending_tokens + n + 1 > max_shard_tokens and pending_ids:
                flush_shard()
            pending_ids.append(tokens)
            pending_meta.append(meta)
            pending_tokens += n + 1
            total_tokens += n

        try:
            for c in cands:
                if max_tokens is not None and total_tokens >= max_tokens:
                    rep.skip("token_limit")
                    continue
                t = time.perf_counter()
                try:
                    doc = read_document(c.path, filters.max_file_size, tok)
                except FileNotFoundError:
                    rep.skip("vanished")
                    continue
                except OSError as e:
                    rep.skip("unreadable")
                    rep.errors.append(f"cannot read {c.path}: {e.strerror or e}")
                    continue
                if doc.skip is not None:
                    rep.skip(doc.skip)
                    continue
                undecodable += doc.undecodable
                masked_lines += doc.masked_lines
                masked_files += bool(doc.masked_lines)
                if doc.undecodable:
                    rep.skip("files_with_undecodable_bytes_replaced")
                meta = (str(c.path), doc.size, c.mtime_ns, doc.hash, doc.masked_lines)
                if doc.pieces is not None:   # a big file, tokenized in pieces as it was read
                    tokenize_s += time.perf_counter() - t
                    add(doc.pieces, doc.tokens, meta)
                    bar.update(doc.size)
                    continue
                batch_text.append(doc.text)
                batch_meta.append(meta)
                batch_bytes += doc.size
                if batch_bytes >= (BATCH_BYTES if max_tokens is None else min(BATCH_BYTES, max(1 << 16, max_tokens))):
                    flush_batch()
            flush_batch()
            flush_shard()
        finally:
            bar.close()
        m = {
            "kind": kind,
            "created": time.time(),
            "build_time_s": time.perf_counter() - t_start,
            "tokenizer": fp,
            "tokenizer_source": tokenizer_source(tok),
            "width": width,
            "sentinel": sentinel_for_width(width),
            "roots": [str(r) for r in roots],
            "filters": filters.to_dict(),
            "next_shard": next_shard,
            "generation": (int(old.get("generation", 0)) + 1) if old else 1,
            "shards": shard_metas,
            "docs": pack_docs(docs),
            "stats": {"documents": len(docs), "tokens": total_tokens},
        }
        write_manifest(out, m)
        keep = {f["name"] for s in shard_metas for f in s["files"].values()}
        remove_unreferenced(out, keep)
    size = sum(f["size"] for s in shard_metas for f in s["files"].values())
    return {
        "out": str(out),
        "kind": kind,
        "documents": len(docs),
        "tokens": total_tokens,
        "shards": len(shard_metas),
        "bytes_on_disk": size,
        "bytes_per_token": round(size / total_tokens, 3) if total_tokens else 0.0,
        "seconds": round(time.perf_counter() - t_start, 3),
        "discover_s": round(discover_s, 3),
        "tokenize_s": round(tokenize_s, 3),
        "sort_s": round(sort_s, 3),
        "write_s": round(write_s, 3),
        "tokens_per_s_tokenize": round(total_tokens / tokenize_s) if tokenize_s else None,
        "tokens_per_s_sort": round(total_tokens / sort_s) if sort_s else None,
        "undecodable_chars": undecodable,
        "masked_lines": masked_lines,      # lines emptied because they carry a secret (indexer/secrets.py)
        "masked_files": masked_files,
        "skipped": rep.skipped,
        "errors": rep.errors,
        "tokenizer": fp,
        "width": width,
    }


def _compact_ids(ids: list[int]) -> np.ndarray:
    """A document's ids as they wait for their shard: 2 or 4 bytes each (they are checked against the
    store's width when joined), not 8: a shard holds up to MAX_SHARD_TOKENS of them."""
    a = np.array(ids, dtype=np.uint32)
    return a.astype(np.uint16) if a.size and int(a.max()) < 0xFFFF else a


def _under(p: Path, root: Path) -> bool:
    try:
        Path(p).relative_to(root)
        return True
    except ValueError:
        return False
