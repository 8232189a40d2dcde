"""Building a datastore from files: discover, read, tokenize in batches, join, suffix-sort, write."""
from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

from restbase.storage import cache_root

from . import discover as disc
from .layout import sentinel_for_width, width_for_vocab
from .manifest import (SHARD_DIR, Doc, pack_docs, read_manifest, remove_unreferenced, write_manifest,
                       writer_lock)
from .sorting import join_documents, release_freed_memory, write_shard
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
    from .tokenizer import fingerprint, load_tokenizer

    t_start = time.perf_counter()
    roots, kind, filters = _inputs(roots, kind, filters, corpus_from_env)
    tok = load_tokenizer(tokenizer)
    fp = fingerprint(tok)
    width = width_for_vocab(fp["vocab_size"])
    out = Path(out)
    rep = disc.Report()
    t0 = time.perf_counter()
    scanned_ns = time.time_ns()   # before any stat: the next sync re-hashes what was written near it
    cands = _discover(roots, filters, rep)
    discover_s = time.perf_counter() - t0

    with writer_lock(out):
        try:
            old = read_manifest(out)
        except IndexerError:
            old = None
        shards = _ShardWriter(out / SHARD_DIR, kind, tok, fp["vocab_size"], width,
                              next_shard=int(old.get("next_shard", 0)) if old else 0,
                              max_shard_tokens=max_shard_tokens, max_tokens=max_tokens, report=rep)
        shards.index(cands, filters, progress)
        m = _manifest(shards, tok, fp, roots, filters, old, time.perf_counter() - t_start, scanned_ns)
        write_manifest(out, m)
        remove_unreferenced(out, {f["name"] for s in shards.metas for f in s["files"].values()})
    return _report(out, shards, fp, rep, t_start, discover_s)


def _inputs(roots, kind: str | None, filters: disc.Filters | None,
            corpus_from_env: bool) -> tuple[list[Path], str, disc.Filters]:
    """The roots (the default corpus's added), the datastore kind and the filters of a build."""
    roots = [Path(r).expanduser().absolute() for r in roots]
    if corpus_from_env:
        roots += [r for r in corpus_roots() if r not in roots]
        filters = filters or corpus_filters()
        kind = kind or "corpus"
    if not roots:
        raise IndexerError("nothing to index: give ROOT paths or --corpus-from-env")
    missing = [r for r in roots if not r.exists()]
    if missing and len(missing) == len(roots):
        raise IndexerError("no root exists: " + ", ".join(map(str, missing)))
    return roots, kind or "repository", filters or disc.Filters()


def _discover(roots: list[Path], filters: disc.Filters, rep: disc.Report) -> list:
    """The candidate files, each once: the stdlib contains site-packages, so each root is walked without
    the other roots nested in it."""
    cands, seen = [], set()
    for r in roots:
        for c in disc.walk([r], filters, rep):
            k = str(c.path)
            if k not in seen and not any(o != r and _under(c.path, o) for o in roots if _under(o, r)):
                seen.add(k)
                cands.append(c)
    return cands


class _ShardWriter:
    """Documents in, shards out: reads and tokenizes the files (small ones in batches, big ones in pieces
    as they are read), joins them into shards of at most `max_shard_tokens` and writes each shard (suffix
    sort included) as soon as it is full. `docs` and `metas` are what the manifest records."""

    def __init__(self, shard_dir: Path, kind: str, tok, vocab_size: int, width: int, *, next_shard: int,
                 max_shard_tokens: int, max_tokens: int | None, report: disc.Report):
        self.shard_dir, self.kind, self.tok = shard_dir, kind, tok
        self.vocab_size, self.width = vocab_size, width
        self.next_shard = next_shard
        self.max_shard_tokens, self.max_tokens = max_shard_tokens, max_tokens
        self.rep = report
        self.docs: dict[str, Doc] = {}
        self.metas: list[dict] = []
        self.tokenize_s = self.sort_s = self.write_s = 0.0
        self.undecodable = self.masked_lines = self.masked_files = 0
        self.total_tokens = 0
        self.pending_ids: list = []
        self.pending_meta: list = []
        self.pending_tokens = 0
        self.batch_text: list[str] = []
        self.batch_meta: list = []
        self.batch_bytes = 0
        self.batch_limit = BATCH_BYTES if max_tokens is None else min(BATCH_BYTES, max(1 << 16, max_tokens))
        self.bar: _Progress | None = None

    def index(self, cands, filters: disc.Filters, progress: bool) -> None:
        self.bar = _Progress(progress, sum(c.size for c in cands))
        try:
            for c in cands:
                if self.max_tokens is not None and self.total_tokens >= self.max_tokens:
                    self.rep.skip("token_limit")
                    continue
                self.read(c, filters)
            self.flush_batch()
            self.flush_shard()
        finally:
            self.bar.close()

    def read(self, c, filters: disc.Filters) -> None:
        """Read one candidate file: skipped with its reason, tokenized at once (big), or batched."""
        rep = self.rep
        t = time.perf_counter()
        try:
            doc = read_document(c.path, filters.max_file_size, self.tok)
        except FileNotFoundError:
            rep.skip("vanished")
            return
        except OSError as e:
            rep.skip("unreadable")
            rep.errors.append(f"cannot read {c.path}: {e.strerror or e}")
            return
        if doc.skip is not None:
            rep.skip(doc.skip)
            return
        self.undecodable += doc.undecodable
        self.masked_lines += doc.masked_lines
        self.masked_files += bool(doc.masked_lines)
        if doc.undecodable:
            rep.skip("files_with_undecodable_bytes_replaced")
        meta = (str(c.path), doc.size, c.mtime_ns, doc.hash, doc.masked_lines)
        if doc.pieces is not None:   # a big file, tokenized in pieces as it was read
            self.tokenize_s += time.perf_counter() - t
            self.add(doc.pieces, doc.tokens, meta)
            self.bar.update(doc.size)
            return
        self.batch_text.append(doc.text)
        self.batch_meta.append(meta)
        self.batch_bytes += doc.size
        if self.batch_bytes >= self.batch_limit:
            self.flush_batch()

    def flush_batch(self) -> None:
        from .tokenizer import encode_batch

        if not self.batch_text:
            return
        t = time.perf_counter()
        ids = encode_batch(self.tok, self.batch_text)
        arrs = [_compact_ids(x) for x in ids]
        self.tokenize_s += time.perf_counter() - t
        del ids
        release_freed_memory()   # the tokenizer's working memory, freed but kept by the allocator
        for a, meta in zip(arrs, self.batch_meta):
            self.add(a, a.size, meta)
        self.bar.update(self.batch_bytes)
        self.batch_text, self.batch_meta, self.batch_bytes = [], [], 0

    def add(self, tokens, n: int, meta: tuple) -> None:
        if self.pending_tokens + n + 1 > self.max_shard_tokens and self.pending_ids:
            self.flush_shard()
        self.pending_ids.append(tokens)
        self.pending_meta.append(meta)
        self.pending_tokens += n + 1
        self.total_tokens += n

    def flush_shard(self) -> None:
        if not self.pending_ids:
            return
        arr, spans = join_documents(self.pending_ids, self.width)
        self.pending_ids.clear()   # join_documents copied them: do not hold the tokens twice while sorting
        sid = f"s{self.next_shard:06d}"
        self.next_shard += 1
        handed = [arr]
        del arr               # write_shard frees the ids once compacted, before the suffix sort
        meta, tm = write_shard(self.shard_dir, sid, self.kind, handed, self.width, self.vocab_size)
        self.sort_s += tm["sort_s"]
        self.write_s += tm["write_s"]
        self.metas.append(meta)
        for (key, size, mtime, h, masked), (a, b) in zip(self.pending_meta, spans):
            self.docs[key] = Doc(size, mtime, h, sid, a, b, masked)
        self.pending_ids, self.pending_meta, self.pending_tokens = [], [], 0


def _manifest(shards: _ShardWriter, tok, fp: dict, roots: list[Path], filters: disc.Filters, old: dict | None,
              build_time_s: float, scanned_ns: int) -> dict:
    from .tokenizer import tokenizer_source

    return {
        "kind": shards.kind,
        "created": time.time(),
        "build_time_s": build_time_s,
        "scanned_ns": scanned_ns,       # when the walk began (indexer.manifest.racy_documents)
        "tokenizer": fp,
        "tokenizer_source": tokenizer_source(tok),
        "width": shards.width,
        "sentinel": sentinel_for_width(shards.width),
        "roots": [str(r) for r in roots],
        "filters": filters.to_dict(),
        "next_shard": shards.next_shard,
        "generation": (int(old.get("generation", 0)) + 1) if old else 1,
        "shards": shards.metas,
        "docs": pack_docs(shards.docs),
        "stats": {"documents": len(shards.docs), "tokens": shards.total_tokens},
    }


def _report(out: Path, shards: _ShardWriter, fp: dict, rep: disc.Report, t_start: float,
            discover_s: float) -> dict:
    size = sum(f["size"] for s in shards.metas for f in s["files"].values())
    total_tokens, tokenize_s, sort_s = shards.total_tokens, shards.tokenize_s, shards.sort_s
    return {
        "out": str(out),
        "kind": shards.kind,
        "documents": len(shards.docs),
        "tokens": total_tokens,
        "shards": len(shards.metas),
        "bytes_on_disk": size,
        "bytes_per_token": round(size / total_tokens, 3) if total_tokens else 0.0,
        "seconds": round(time.perf_counter() - t_start, 3),
        "discover_s": round(discover_s, 3),
        "tokenize_s": round(tokenize_s, 3),
        "sort_s": round(sort_s, 3),
        "write_s": round(shards.write_s, 3),
        "tokens_per_s_tokenize": round(total_tokens / tokenize_s) if tokenize_s else None,
        "tokens_per_s_sort": round(total_tokens / sort_s) if sort_s else None,
        "undecodable_chars": shards.undecodable,
        "masked_lines": shards.masked_lines,      # lines emptied because they carry a secret (indexer/secrets.py)
        "masked_files": shards.masked_files,
        "skipped": rep.skipped,
        "errors": rep.errors,
        "tokenizer": fp,
        "width": shards.width,
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
