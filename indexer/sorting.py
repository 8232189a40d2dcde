"""Making a shard: documents joined with sentinels, ids compacted to ranks where they fit 2 bytes, the suffix
array sorted (pydivsufsort), and the shard's files written. The suffix array (int32, int64 past 2^31 tokens)
orders all suffixes of the token array (indexer/layout.py: big-endian, a sentinel after every document)."""
from __future__ import annotations

import threading
from pathlib import Path

import numpy as np

from restbase.storage import fsync_dir

from .layout import be_dtype, check_ids, native_dtype, sentinel_for_width
from .shardfile import write_npy_atomic
from .types import TokenOutOfRange


def join_documents(token_lists, width: int) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """Concatenate documents, each followed by a sentinel; returns (array, spans [start, end)). A document
    is a sequence of ids or a list of id arrays (a big file tokenized in pieces, indexer/ingest.py); such a
    list is emptied as its arrays are copied, so a big document is never held twice."""
    nd = native_dtype(width)
    s = sentinel_for_width(width)
    docs = [d if isinstance(d, list) and d and isinstance(d[0], np.ndarray) else [np.asarray(d)]
            for d in token_lists]
    arr = np.empty(sum(int(p.size) for d in docs for p in d) + len(docs), dtype=nd)
    spans, pos = [], 0
    for d in docs:
        start = pos
        for k, p in enumerate(d):
            if p.size:
                check_ids(p, width)
            arr[pos:pos + p.size] = p
            pos += p.size
            d[k] = None
        arr[pos] = s
        spans.append((start, pos))
        pos += 1
    return arr, spans


def compact_tokens(arr: np.ndarray, width: int, vocab_size: int | None = None):
    """Storage for a joined token array: (stored array, storage width, alphabet or None).

    A 4-byte vocabulary whose shard uses at most 65,534 distinct ids (a 50M-token Python corpus uses about
    63k of Qwen's 151,936) is stored as 2-byte ranks into the shard's sorted alphabet: ranks keep the ids'
    order, so the suffix array and byte comparisons are unchanged, and the shard takes 6 bytes per token
    instead of 8. Ids are never truncated: a shard with more distinct ids keeps 4-byte tokens."""
    if width != 4 or arr.size == 0:
        return arr, width, None
    s = sentinel_for_width(4)
    # in slices, with the sentinel clipped onto an extra last slot: whole-array temporaries (masks, fancy
    # indices, which numpy widens to int64) would cost several times the token array on a big shard
    step = 1 << 20
    top = int(vocab_size) if vocab_size else max(int(arr[i:i + step][arr[i:i + step] != s].max(initial=0))
                                                  for i in range(0, arr.size, step)) + 1
    present = np.zeros(top + 1, dtype=bool)
    for i in range(0, arr.size, step):
        part = arr[i:i + step]
        if ((part >= top) & (part != s)).any():
            raise TokenOutOfRange(f"token id {int(part[part != s].max())} is not below the vocabulary size {top}")
        present[np.minimum(part, top)] = True
    present[top] = False
    alpha = np.flatnonzero(present).astype(np.uint32)
    if alpha.size > 0xFFFE:
        return arr, width, None
    rank = np.full(top + 1, 0xFFFF, dtype=np.uint16)   # rank[top]: the sentinel
    rank[alpha] = np.arange(alpha.size, dtype=np.uint16)
    stored = np.empty(arr.size, dtype=np.uint16)
    for i in range(0, arr.size, step):
        np.take(rank, arr[i:i + step], mode="clip", out=stored[i:i + step])
    return stored, 2, alpha


def divsufsort(arr: np.ndarray) -> np.ndarray:
    """pydivsufsort's suffix array, sorted on a thread that ends with the sort.

    pydivsufsort sorts on an OpenMP team, and in a process that has imported torch that team lives in torch's
    libgomp. A team stays docked for as long as the thread that started it lives; once a process holds more
    OpenMP threads than CPUs, libgomp stops letting idle ones spin and wakes them through the kernel at every
    parallel region, and a model forward has hundreds. Sorted on the daemon's long-lived indexing thread, one
    workspace index made every later decoding step 1.55x slower on 2 cores (docs/cpu.md: 32.5 -> 50.3 ms at
    int4w). A thread of its own takes the team with it when it ends; a daemon thread, so that an interrupted
    build does not wait for its sort."""
    from pydivsufsort import divsufsort as sort

    out: list = []

    def run() -> None:
        try:
            out.append(sort(arr))
        except BaseException as exc:  # noqa: BLE001 - raised again on the caller's thread
            out.append(exc)

    t = threading.Thread(target=run, name="rest-index-sort", daemon=True)
    t.start()
    t.join()
    if isinstance(out[0], BaseException):
        raise out[0]
    return out[0]


def suffix_array(tokens: np.ndarray, width: int, vocab_size: int | None = None) -> np.ndarray:
    """Suffix array of a native token array (with sentinels). Ids are first mapped to dense ranks (order
    kept, the sentinel stays largest) so a 151k-word vocabulary whose corpus uses ~60k ids sorts as uint16."""
    if tokens.size == 0:
        return np.zeros(0, dtype=np.int32)
    if width == 4 and tokens.size > 4096:
        s = sentinel_for_width(width)
        top = int(vocab_size) if vocab_size else int(tokens[tokens != s].max(initial=0)) + 1
        t2 = tokens.astype(np.int64 if top >= 2**31 else np.int32)
        t2[tokens == s] = top
        counts = np.bincount(t2, minlength=top + 1)
        present = counts > 0
        rank = np.cumsum(present) - 1
        ndistinct = int(present.sum())
        rdt = np.uint16 if ndistinct <= 0x10000 else np.uint32
        ranks = rank.astype(rdt)[t2]
        del t2, counts, present, rank
        return divsufsort(ranks)
    return divsufsort(tokens)


def _suffix_array_be16(be: np.ndarray) -> np.ndarray:
    """Suffix array of big-endian 2-byte tokens, sorting their bytes as pydivsufsort does for uint16 input
    (a token suffix is a byte suffix at an even offset), but keeping the even offsets in place: pydivsufsort
    first copies the tokens to swap their bytes and then filters with whole-array temporaries, about 22 bytes
    per token at the peak; this peaks at the 8 bytes per token of the byte-level array."""
    n = be.size
    out = divsufsort(be.view(np.uint8))          # int32 (int64 past 2^31 bytes), 2n entries
    w, step = 0, 1 << 18
    for i in range(0, out.size, step):           # in place: the write position never passes the read one
        part = out[i:i + step]
        keep = part[part % 2 == 0] // 2
        out[w:w + keep.size] = keep
        w += keep.size
    assert w == n
    # a view keeps the whole buffer alive: only big shards (written to disk, then dropped) keep it
    return out[:n] if n > (1 << 22) else out[:n].copy()


def release_freed_memory() -> None:
    """Hand freed heap memory back to the system (glibc keeps it after many mid-size frees, such as a big
    file's token pieces; the suffix sort that follows needs that room). A no-op elsewhere."""
    import ctypes
    import ctypes.util

    try:
        ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def sort_shard(tokens, width: int, vocab_size: int | None = None):
    """(stored tokens big-endian, storage width, alphabet or None, suffix array) of joined documents.
    `tokens` given as a one-element list is handed over: the ids are freed once compacted, before the sort
    (the caller must hold no other reference), which keeps a big build's peak memory down."""
    handed = isinstance(tokens, list)
    arr = tokens.pop() if handed else tokens
    stored, tw, alpha = compact_tokens(arr, width, vocab_size)
    if tw == 2:
        owned = handed or stored is not arr     # never change the caller's array in place
        del arr
        if owned and stored.dtype.byteorder != ">":
            be = stored.byteswap(inplace=True).view(be_dtype(2))
        else:
            be = stored.astype(be_dtype(2))
        del stored
        if be.size > (1 << 22):
            release_freed_memory()
        return be, tw, alpha, _suffix_array_be16(be)
    return stored.astype(be_dtype(tw)), tw, alpha, suffix_array(stored, tw, vocab_size)


def write_shard(shard_dir: Path, sid: str, kind: str, arr, width: int,
                vocab_size: int | None = None, *, prepared=None) -> tuple[dict, dict]:
    """Sort (unless `prepared` by sort_shard) and write one shard of joined documents (native dtype,
    sentinels included; a one-element list hands them over, as for sort_shard). Returns (meta, timings)."""
    import time

    t0 = time.perf_counter()
    stored, tw, alpha, sa = prepared if prepared is not None else sort_shard(arr, width, vocab_size)
    del arr
    t1 = time.perf_counter()
    shard_dir.mkdir(parents=True, exist_ok=True)
    files = {"tok": write_npy_atomic(shard_dir / f"{sid}.tok.npy", np.asarray(stored, dtype=be_dtype(tw)),
                                     sync_dir=False),
             "sa": write_npy_atomic(shard_dir / f"{sid}.sa.npy", sa, sync_dir=False)}
    if alpha is not None:
        files["alpha"] = write_npy_atomic(shard_dir / f"{sid}.alpha.npy", alpha, sync_dir=False)
    fsync_dir(shard_dir)  # the renames are durable before any manifest names them
    t2 = time.perf_counter()
    meta = {"id": sid, "kind": kind, "tokens": int(sa.size), "token_width": tw, "files": files, "dead": [],
            "created": time.time()}
    return meta, {"sort_s": t1 - t0, "write_s": t2 - t1}
