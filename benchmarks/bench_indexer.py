"""Indexer benchmark: prints the issue's targets.

    .venv/bin/python benchmarks/bench_indexer.py [--sizes 1e6,1e7,5e7] [--tokenizer PATH] [--repo-files 5000]

- build throughput (tokens/s), tokenization and suffix sorting apart, at each size (the corpus: Python
  standard library + this environment's site-packages, tokenized once up to the largest size);
- query latency p50/p99 per size: the longest-suffix match alone (k=0) and a full search (k=5000, L=10),
  contexts taken from held-out code (this project's own sources, not in the corpus);
- bytes per token on disk and resident memory after opening each store;
- save-to-searchable p50/p95 in a generated repository of N files under a running watcher;
- set_live for a 5,000-line buffer.
Work files go under .bench/indexer (ignored by git). Figures depend on the machine and its load.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from indexer import discover as disc  # noqa: E402
from indexer.build import corpus_filters, corpus_roots  # noqa: E402
from indexer.layout import width_for_vocab  # noqa: E402
from indexer.sorting import join_documents, suffix_array, write_shard  # noqa: E402
from indexer.store import Datastore  # noqa: E402
from indexer.tokenizer import encode_batch, fingerprint, load_tokenizer  # noqa: E402


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def pct(xs, q):
    return float(np.percentile(np.asarray(xs), q)) if xs else float("nan")


def tokenize_corpus(tok, limit: int, cache: Path):
    """Token arrays of corpus documents until `limit` tokens; (docs, seconds, tokens-at-checkpoints)."""
    fp = fingerprint(tok)
    f = cache / f"corpus-{fp['vocab_hash'][:12]}-{limit}.npz"
    if f.exists():
        z = np.load(f, allow_pickle=False)
        lens = z["lens"]
        flat = z["flat"]
        docs = np.split(flat, np.cumsum(lens)[:-1])
        return docs, float(z["seconds"]), json.loads(str(z["marks"]))
    filters = corpus_filters()
    docs, total, t_tok = [], 0, 0.0
    marks = {}
    batch, bbytes = [], 0
    cands = []
    for r in corpus_roots():
        cands += list(disc.walk([r], filters))
    random.Random(0).shuffle(cands)  # a mix of libraries at every size, not stdlib first

    def flush():
        nonlocal batch, bbytes, total, t_tok
        t = time.perf_counter()
        ids = encode_batch(tok, batch)
        arrs = [np.asarray(x, dtype=np.int64) for x in ids]
        t_tok += time.perf_counter() - t
        for a in arrs:
            docs.append(a)
            total += a.size
        marks[str(total)] = t_tok
        batch, bbytes = [], 0

    for c in cands:
        if total >= limit:
            break
        try:
            text, raw, _, skip = disc.read_text(c.path, filters.max_file_size)
        except OSError:
            continue
        if skip:
            continue
        batch.append(text)
        bbytes += len(raw)
        if bbytes >= 2 << 20:
            flush()
    if batch:
        flush()
    cache.mkdir(parents=True, exist_ok=True)
    lens = np.array([d.size for d in docs])
    np.savez(f, flat=np.concatenate(docs), lens=lens, seconds=t_tok, marks=json.dumps(marks))
    return docs, t_tok, marks


def tok_time_at(marks: dict, n: int, total_s: float) -> float:
    """Tokenization seconds spent until n tokens (from the batch checkpoints)."""
    for k in sorted(marks, key=int):
        if int(k) >= n:
            return marks[k] * n / int(k)
    return total_s


def heldout_contexts(tok, n: int = 400, ctx_len: int = 64) -> list[list[int]]:
    texts = [p.read_text() for p in sorted((ROOT / "rest_lsp").rglob("*.py")) + sorted((ROOT / "indexer").rglob("*.py"))]
    ids = [i for t in texts for i in tok.encode(t, add_special_tokens=False).ids]
    rng = random.Random(1)
    return [ids[max(0, p - ctx_len):p] for p in (rng.randrange(ctx_len, len(ids)) for _ in range(n))]


def bench_queries(out: Path, ctxs) -> dict:
    """Open a store and time lookups: wall time, and this thread's CPU time (which leaves out the time
    spent waiting for a core on a loaded machine)."""
    import gc

    gc.collect()
    rss0 = rss_mb()
    t = time.perf_counter()
    ds = Datastore.open(out, auto_refresh=False)
    open_s = time.perf_counter() - t
    rss1 = rss_mb()
    match_ms, full_ms, lens, match_cpu, full_cpu = [], [], [], [], []
    for c in ctxs[:50]:
        ds.search(c)  # warm the pages a real session would have touched
    for c in ctxs:
        t, tc = time.perf_counter(), time.thread_time()
        r = ds.search(c, k=0)
        match_ms.append((time.perf_counter() - t) * 1e3)
        match_cpu.append((time.thread_time() - tc) * 1e3)
        lens.append(r.match_len)
        t, tc = time.perf_counter(), time.thread_time()
        ds.search(c)
        full_ms.append((time.perf_counter() - t) * 1e3)
        full_cpu.append((time.thread_time() - tc) * 1e3)
    st = ds.stats()
    return {
        "tokens": st["tokens"],
        "match_p50_ms": round(pct(match_ms, 50), 3), "match_p99_ms": round(pct(match_ms, 99), 3),
        "search_k5000_p50_ms": round(pct(full_ms, 50), 3), "search_k5000_p99_ms": round(pct(full_ms, 99), 3),
        "match_cpu_p50_ms": round(pct(match_cpu, 50), 3), "match_cpu_p99_ms": round(pct(match_cpu, 99), 3),
        "search_k5000_cpu_p50_ms": round(pct(full_cpu, 50), 3), "search_k5000_cpu_p99_ms": round(pct(full_cpu, 99), 3),
        "mean_match_len": round(float(np.mean(lens)), 2), "bytes_per_token": st["bytes_per_token"],
        "bytes_on_disk_mb": round(st["bytes_on_disk"] / 1e6, 1), "open_s": round(open_s, 2),
        "rss_open_delta_mb": round(rss1 - rss0, 1), "rss_after_queries_mb": round(rss_mb() - rss0, 1),
    }


def bench_store(docs, n_tokens, width, vocab, out: Path, ctxs):
    sel, total = [], 0
    for d in docs:
        if total >= n_tokens:
            break
        sel.append(d)
        total += d.size
    arr, spans = join_documents(sel, width)
    t = time.perf_counter()
    suffix_array(arr, width, vocab)
    sort_s = time.perf_counter() - t
    # a store on disk: shard written through the real writer, manifest with the documents
    import shutil

    from indexer.manifest import Doc, pack_docs, write_manifest

    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    meta, _ = write_shard(out / "shards", "s000000", "corpus", arr, width, vocab)
    docs_m = {f"/bench/doc{i}": Doc(0, 0, b"", "s000000", a, b) for i, (a, b) in enumerate(spans)}
    write_manifest(out, {"kind": "corpus", "tokenizer": BENCH_FP, "tokenizer_source": BENCH_SRC, "width": width,
                         "sentinel": 0, "roots": [], "filters": None, "next_shard": 1, "shards": [meta],
                         "docs": pack_docs(docs_m), "build_time_s": sort_s})
    del arr
    r = bench_queries(out, ctxs)
    r.update({"tokens": total, "sort_s": round(sort_s, 2), "sort_tok_per_s": round(total / sort_s)})
    return r


def bench_watch(tok_src, n_files: int, saves: int, work: Path):
    """A repository of n_files real source files under a watcher: time from a save to a search hit."""
    import shutil

    from indexer.watch import Watcher

    repo = work / "repo"
    shutil.rmtree(work, ignore_errors=True)
    repo.mkdir(parents=True)
    srcs = [c.path for r in corpus_roots() for c in disc.walk([r], corpus_filters()) if 200 < c.size < 8000]
    random.Random(2).shuffle(srcs)
    for i, s in enumerate(srcs[:n_files]):
        d = repo / f"pkg{i // 100}"
        d.mkdir(exist_ok=True)
        shutil.copyfile(s, d / f"m{i}.py")
    t = time.perf_counter()
    ds = Datastore.build([repo], work / "ds", tokenizer=tok_src)
    build_s = time.perf_counter() - t
    tok = ds.tokenizer
    lat, applies = [], []
    w = Watcher(ds, debounce_s=0.2, on_update=lambda s: applies.append(s["apply_s"])).start()
    time.sleep(0.5)
    rng = random.Random(3)
    files = sorted(repo.rglob("*.py"))
    try:
        for i in range(saves):
            p = rng.choice(files)
            marker = f"\nsaved_marker_{i}_{rng.randrange(10**9)} = {i}\n"
            ids = tok.encode(marker.strip(), add_special_tokens=False).ids
            text = p.read_text() + marker
            t0 = time.perf_counter()
            if i % 2:  # an editor's atomic save
                tmp = p.with_name(p.name + ".tmp~")
                tmp.write_text(text)
                os.replace(tmp, p)
            else:
                p.write_text(text)
            while ds.search(ids, n_max=len(ids), n_min=len(ids), k=0).match_len != len(ids):
                time.sleep(0.001)
                if time.perf_counter() - t0 > 10:
                    break
            lat.append((time.perf_counter() - t0) * 1e3)
            time.sleep(0.3)
    finally:
        w.stop()
    return {"files": n_files, "tokens": ds.stats()["tokens"], "build_s": round(build_s, 1), "saves": saves,
            "save_to_searchable_p50_ms": round(pct(lat, 50), 1), "save_to_searchable_p95_ms": round(pct(lat, 95), 1),
            "update_apply_p50_ms": round(pct(applies, 50) * 1e3, 1), "update_apply_p95_ms": round(pct(applies, 95) * 1e3, 1),
            "shards_after": ds.stats()["shards"]}


def bench_live(tok) -> dict:
    src = "\n".join(p.read_text() for p in sorted(Path(os.__file__).parent.glob("*.py"))[:40])
    lines = src.splitlines()[:5000]
    ids = tok.encode("\n".join(lines), add_special_tokens=False).ids
    ds = Datastore.memory(tok)
    arr = np.asarray(ids, dtype=np.int64)
    ts_list, ts_arr, q = [], [], []
    cpu_list = []
    for _ in range(30):
        t, tc = time.perf_counter(), time.thread_time()
        ds.set_live("buf", ids)
        ts_list.append((time.perf_counter() - t) * 1e3)
        cpu_list.append((time.thread_time() - tc) * 1e3)
        t = time.perf_counter()
        ds.set_live("buf", arr)
        ts_arr.append((time.perf_counter() - t) * 1e3)
    rng = random.Random(4)
    for _ in range(200):
        p = rng.randrange(64, len(ids))
        t = time.perf_counter()
        ds.search(ids[p - 64:p])
        q.append((time.perf_counter() - t) * 1e3)
    return {"lines": len(lines), "tokens": len(ids), "set_live_list_p50_ms": round(pct(ts_list, 50), 2),
            "set_live_list_p95_ms": round(pct(ts_list, 95), 2), "set_live_list_cpu_p95_ms": round(pct(cpu_list, 95), 2), "set_live_ndarray_p50_ms": round(pct(ts_arr, 50), 3),
            "live_search_p50_ms": round(pct(q, 50), 3), "live_search_p99_ms": round(pct(q, 99), 3)}


BENCH_FP: dict = {}
BENCH_SRC = None


def main(argv=None) -> int:
    global BENCH_FP, BENCH_SRC
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1e6,1e7,5e7")
    ap.add_argument("--tokenizer", default=None, help="default: the embedded model's (Qwen2.5-Coder, 151,936 ids)")
    ap.add_argument("--repo-files", type=int, default=5000)
    ap.add_argument("--saves", type=int, default=40)
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--work", default=str(ROOT / ".bench" / "indexer"))
    ap.add_argument("--skip", default="", help="comma-separated parts to skip: build,watch,live")
    ap.add_argument("--queries-only", action="store_true", help="time queries on the stores of an earlier run")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    work = Path(args.work)
    skip = set(filter(None, args.skip.split(",")))
    sizes = [int(float(s)) for s in args.sizes.split(",")]
    tok = load_tokenizer(args.tokenizer)
    BENCH_FP = fingerprint(tok)
    BENCH_SRC = args.tokenizer
    vocab = BENCH_FP["vocab_size"]
    width = width_for_vocab(vocab)
    out = {"tokenizer": BENCH_FP["name"], "vocab_size": vocab, "width": width, "cpus": os.cpu_count()}
    print(f"tokenizer {BENCH_FP['name']} (vocab {vocab}, {width}-byte tokens), {os.cpu_count()} CPUs", flush=True)
    if args.queries_only:  # the stores of an earlier run, timed again
        ctxs = heldout_contexts(tok, args.queries)
        for n in sizes:
            r = bench_queries(work / f"store-{n}", ctxs)
            print(f"{r['tokens']:>11,} tokens | match p50 {r['match_p50_ms']} p99 {r['match_p99_ms']} ms (CPU p50 "
                  f"{r['match_cpu_p50_ms']} p99 {r['match_cpu_p99_ms']}) | k=5000 search p50 {r['search_k5000_p50_ms']} "
                  f"p99 {r['search_k5000_p99_ms']} ms (CPU p50 {r['search_k5000_cpu_p50_ms']} p99 "
                  f"{r['search_k5000_cpu_p99_ms']}) | RSS +{r['rss_open_delta_mb']} MB after open", flush=True)
        skip |= {"build"}
    if "build" not in skip:
        docs, tok_s, marks = tokenize_corpus(tok, max(sizes), work / "cache")
        total = sum(d.size for d in docs)
        ctxs = heldout_contexts(tok, args.queries)
        out["sizes"] = []
        print(f"corpus tokenized: {total:,} tokens in {tok_s:.1f} s ({total / tok_s:,.0f} tokens/s)", flush=True)
        for n in sizes:
            r = bench_store(docs, n, width, vocab, work / f"store-{n}", ctxs)
            r["tokenize_s"] = round(tok_time_at(marks, r["tokens"], tok_s), 1)
            r["tokenize_tok_per_s"] = round(r["tokens"] / r["tokenize_s"]) if r["tokenize_s"] else None
            out["sizes"].append(r)
            print(f"{r['tokens']:>11,} tokens | tokenize {r['tokenize_tok_per_s']:>9,} tok/s | sort "
                  f"{r['sort_tok_per_s']:>10,} tok/s ({r['sort_s']} s) | match p50 {r['match_p50_ms']} p99 "
                  f"{r['match_p99_ms']} ms (CPU p99 {r['match_cpu_p99_ms']}) | k=5000 search p50 {r['search_k5000_p50_ms']} p99 "
                  f"{r['search_k5000_p99_ms']} ms (CPU p99 {r['search_k5000_cpu_p99_ms']})"
                  f" | {r['bytes_per_token']} B/token | RSS +{r['rss_open_delta_mb']} MB after open "
                  f"({r['bytes_on_disk_mb']} MB on disk), +{r['rss_after_queries_mb']} MB after queries", flush=True)
    if "live" not in skip:
        out["live"] = bench_live(tok)
        print("live buffer:", json.dumps(out["live"]), flush=True)
    if "watch" not in skip:
        src = args.tokenizer
        out["watch"] = bench_watch(src, args.repo_files, args.saves, work / "watch")
        print("watch:", json.dumps(out["watch"]), flush=True)
    if args.json:
        print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
