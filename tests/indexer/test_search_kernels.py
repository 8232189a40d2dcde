"""The compiled search (indexer/kernels.py, indexer/search.py, indexer/scan.py) against the Python/numpy code it replaced, on
random shards: both token widths, with an alphabet and without, repeated patterns, documents that end
inside a continuation, patterns that do not occur."""
from __future__ import annotations

import numpy as np
import pytest

from indexer.layout import be_dtype
from indexer.scan import ScanShard
from indexer.search import _continuations as store_continuations
from indexer.search import _one_shard_ranked, _ranked, one_shard_search
from indexer.shard import Shard
from indexer.sorting import join_documents


# ---- the reference: the code before the compiled search -------------------------------------------------
def ref_lower(sh, p: bytes, lo: int, hi: int) -> int:
    while lo < hi:
        mid = (lo + hi) >> 1
        s = sh.off + int(sh.sa[mid]) * sh.width
        if sh.tb[s:s + len(p)] < p:
            lo = mid + 1
        else:
            hi = mid
    return lo


def ref_upper(sh, p: bytes, lo: int, hi: int) -> int:
    while lo < hi:
        mid = (lo + hi) >> 1
        s = sh.off + int(sh.sa[mid]) * sh.width
        if sh.tb[s:s + len(p)] <= p:
            lo = mid + 1
        else:
            hi = mid
    return lo


def ref_first(sh, p: bytes) -> int:
    lo = ref_lower(sh, p, 0, sh.n)
    if lo >= sh.n:
        return -1
    s = sh.off + int(sh.sa[lo]) * sh.width
    return lo if sh.tb[s:s + len(p)] == p else -1


def ref_find(sh, p: bytes) -> tuple[int, int]:
    lo = ref_first(sh, p)
    return (0, 0) if lo < 0 else (lo, ref_upper(sh, p, lo, sh.n))


def ref_encode(sh, ctx: np.ndarray) -> bytes:
    """Shard.encode before its loop was compiled: a rank table lookup (clipped), cut after the last absent id."""
    if sh.alpha is None:
        return ctx.astype(be_dtype(sh.width)).tobytes()
    table = np.full(int(sh.alpha[-1]) + 2, -1, dtype=np.int64)
    table[sh.alpha] = np.arange(sh.alpha.size)
    r = np.take(table, ctx, mode="clip")
    missing = np.flatnonzero(r < 0)
    if missing.size:
        r = r[missing[-1] + 1:]
    return r.astype(">u2").tobytes()


def ref_longest(sh, cb: bytes, n_lo: int, n_hi: int):
    """The longest n in [n_lo, n_hi] by a plain scan down from n_hi (no gallop to get wrong)."""
    w = sh.width
    for n in range(n_hi, n_lo - 1, -1):
        at = ref_first(sh, cb[-n * w:])
        if at >= 0:
            return n, at
    return 0, None


def ref_sample(sh, lo: int, hi: int, quota: int) -> np.ndarray:
    r = hi - lo
    if r <= 0 or quota <= 0:
        return np.zeros(0, dtype=np.int64)
    if r <= quota:
        return np.asarray(sh.sa[lo:hi], dtype=np.int64)
    return np.asarray(sh.sa[lo + (np.arange(quota, dtype=np.int64) * r) // quota], dtype=np.int64)


def ref_continuations(tok: np.ndarray, sentinel: int, pos: np.ndarray, n: int, max_len: int, *, sort: bool):
    """Distinct continuations of a match of length n at positions pos (in suffix-array order, so equal
    continuations are adjacent, unless `sort`): (rows [u, max_len] int64 padded with the sentinel past a
    document's end, lengths [u], counts [u]).

    The rows stay in the stored dtype until the distinct ones are known: each row's bytes are one fixed-length
    byte string, so finding where a row differs from the one above is one comparison of strings, not an
    element-wise comparison and a reduction over a short row axis (a cold corpus search spent most of its
    time in such calls on a few hundred rows)."""
    if pos.size == 0 or max_len <= 0:
        return np.zeros((0, max(max_len, 0)), np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64)
    idx = np.add.outer(pos, np.arange(n, n + max_len, dtype=np.int64))  # [p, max_len]
    rows = tok.take(idx, mode="clip")  # clipped to the last token, a sentinel; a fresh C-ordered array
    at_end = rows == sentinel
    after = np.maximum.accumulate(at_end, axis=1) if at_end.any() else None  # at or past the document's end
    if after is not None:
        rows[after] = sentinel  # the sentinel is the largest value: token order is kept
    if sort:
        order = np.lexsort(rows.T[::-1])
        rows = rows[order]
        after = after[order] if after is not None else None
    # equal-length byte strings: equal as strings exactly when equal as rows (numpy's trailing-NUL rule
    # cannot make two strings of the same length equal)
    keys = rows.view(f"S{rows.itemsize * max_len}").ravel()
    starts = np.flatnonzero(np.concatenate(([True], keys[1:] != keys[:-1])))
    counts = np.diff(np.append(starts, len(keys)))
    lengths = max_len - after[starts].sum(axis=1) if after is not None else np.full(len(starts), max_len)
    return rows[starts].astype(np.int64), lengths, counts


def ref_shard_continuations(sh, pos, n, max_len):
    uniq, lengths, counts = ref_continuations(sh.tok, sh.sentinel, pos, n, max_len, sort=False)
    if sh.alpha is not None:
        uniq = sh.alpha[np.minimum(uniq, sh.alpha.size - 1)]
    return uniq, lengths, counts


def ref_id_rows(sh, lo, hi, quota, n, max_len):
    uniq, lengths, counts = ref_shard_continuations(sh, ref_sample(sh, lo, hi, quota), n, max_len)
    keep = lengths > 0
    uniq, lengths, counts = uniq[keep], lengths[keep], counts[keep]
    uniq[np.arange(max_len)[None, :] >= lengths[:, None]] = -1
    return uniq, counts


def ref_ranked(rows, counts, weights, limit):
    order = np.lexsort(tuple(rows[:, j] for j in range(rows.shape[1] - 1, -1, -1)) + (-counts, -weights))
    if limit is not None:
        order = order[:max(0, limit)]
    return rows[order], counts[order].astype(np.int64), weights[order].astype(np.float64)


def same(a, b) -> None:
    """Identical arrays: values, dtype and shape."""
    a, b = np.asarray(a), np.asarray(b)
    assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b), (a, b)


# ---- random shards ----------------------------------------------------------------------------------------
def random_docs(rng, n_docs: int, vocab: np.ndarray) -> list[np.ndarray]:
    """Documents of few distinct tokens with repeated runs (long matches, wide SA ranges) and some very short
    ones (a continuation ends at the document's end)."""
    docs = []
    for _ in range(n_docs):
        size = int(rng.choice([1, 2, 3, 40, 200]))
        d = rng.choice(vocab, size=size)
        if size > 20:
            run = d[:int(rng.integers(2, 8))]
            for _ in range(int(rng.integers(1, 6))):
                at = int(rng.integers(0, size - run.size))
                d[at:at + run.size] = run
        docs.append(d)
    return docs


SHARDS = [  # (width, compact, vocabulary): tokens as ids (2 and 4 bytes), and 4-byte ids stored as ranks
    (2, False, np.arange(7)),
    (2, False, np.array([0, 1, 255, 256, 65000, 65534])),  # ids whose bytes differ in either byte
    (4, False, np.array([3, 70_000, 70_001, 2**24 + 5, 2**32 - 2])),
    (4, True, np.array([5, 9, 100_000, 151_000, 151_935])),
]


def make_shard(rng, width, compact, vocab) -> tuple[Shard, list[np.ndarray]]:
    docs = random_docs(rng, int(rng.integers(1, 12)), vocab)
    arr, _ = join_documents(docs, width)
    sh = Shard.from_tokens("s", "corpus", arr, width, compact=compact)
    assert (sh.alpha is not None) == compact
    return sh, docs


def doc_piece(rng, docs, size_below: int) -> np.ndarray:
    """A random run of 1 to size_below - 1 ids of a random document (int64)."""
    d = docs[int(rng.integers(len(docs)))]
    size = int(rng.integers(1, size_below))
    at = int(rng.integers(0, max(1, d.size - size + 1)))
    return d[at:at + size].astype(np.int64)


def patterns(rng, sh: Shard, docs, count: int):
    """Encoded contexts: pieces of the documents (found), mutated (often not found), ids absent from the shard."""
    vocab = np.unique(np.concatenate(docs))
    for _ in range(count):
        ctx = doc_piece(rng, docs, 12)
        if rng.random() < 0.4:
            ctx = np.concatenate([rng.choice(vocab, size=int(rng.integers(0, 4))), ctx])
        if rng.random() < 0.3:
            ctx[int(rng.integers(ctx.size))] = rng.choice(vocab)
        cb = sh.encode(ctx)
        if cb:
            yield cb


@pytest.mark.parametrize("width,compact,vocab", SHARDS)
def test_binary_search_matches_python(width, compact, vocab):
    rng = np.random.default_rng(width * 10 + compact)
    for _ in range(12):
        sh, docs = make_shard(rng, width, compact, vocab)
        found = 0
        for cb in patterns(rng, sh, docs, 40):
            m = len(cb) // sh.width  # the storage width: 2 for ranks into an alphabet
            for n in range(1, m + 1):
                p = cb[-n * sh.width:]
                assert sh._first(p) == ref_first(sh, p)
                lo, hi = ref_find(sh, p)
                assert sh.find(p) == (lo, hi)
                assert sh.count(p) == (hi - lo, lo, hi)
                if hi > lo:
                    found += 1
                    assert sh.find(p, lo) == (lo, hi)
            for n_lo in (1, 2, 3):
                for n_hi in (n_lo - 1, n_lo, m):
                    got = sh.longest(cb, n_lo, n_hi)
                    want = ref_longest(sh, cb, n_lo, n_hi) if n_hi >= n_lo else (0, None)
                    assert got == want, (cb, n_lo, n_hi)
        assert found  # the patterns did find something


def contexts(rng, sh: Shard, docs, vocab, count: int):
    """Id contexts: pieces of the documents, some with an id of the vocabulary the shard may lack and, for a
    shard of ranks, ids past its alphabet's last (the rank table clips them)."""
    for _ in range(count):
        ctx = doc_piece(rng, docs, 14)
        if rng.random() < 0.3:
            ctx[int(rng.integers(ctx.size))] = rng.choice(vocab)
        if sh.alpha is not None and rng.random() < 0.2:
            ctx[int(rng.integers(ctx.size))] = int(sh.alpha[-1]) + int(rng.integers(1, 3))
        yield ctx


@pytest.mark.parametrize("width,compact,vocab", SHARDS)
def test_encode_matches_numpy(width, compact, vocab):
    rng = np.random.default_rng(200 + width * 10 + compact)
    cut = 0
    for _ in range(10):
        sh, docs = make_shard(rng, width, compact, vocab)
        for ctx in contexts(rng, sh, docs, vocab, 30):
            got, want = sh.encode(ctx), ref_encode(sh, ctx)
            assert got == want, ctx
            cut += len(got) < ctx.size * sh.width
    assert cut if compact else not cut  # ids a shard of ranks lacks cut the context; ids stored as such never


@pytest.mark.parametrize("width,compact,vocab", SHARDS)
def test_one_call_search_matches_its_parts(width, compact, vocab):
    """The datastore's one-shard search in one compiled call (`one_shard_search`) against the reference
    parts: the encoding, the longest match by a plain scan, its range, the sampled rows, their ranking."""
    rng = np.random.default_rng(300 + width * 10 + compact)
    found = 0
    for _ in range(10):
        sh, docs = make_shard(rng, width, compact, vocab)
        for ctx in contexts(rng, sh, docs, vocab, 25):
            for n_min, k, max_len, limit in ((1, 5000, 4, -1), (2, 3, 6, 2), (3, 1, 1, 0)):
                cb = ref_encode(sh, ctx)
                m = len(cb) // sh.width
                n, _ = ref_longest(sh, cb, n_min, m) if m >= n_min else (0, None)
                got = one_shard_search(*sh.kernel_view(), sh.rank_table(), ctx, n_min, k, max_len, 2.0, limit)
                if n == 0:
                    assert got[:2] == (0, 0) and got[2].shape == (0, max_len) and got[3].size == got[4].size == 0
                    continue
                found += 1
                lo, hi = ref_find(sh, cb[-n * sh.width:])
                rows, counts = ref_id_rows(sh, lo, hi, min(k, hi - lo), n, max_len)
                assert got[:2] == (n, hi - lo)
                for g, w in zip(got[2:], ref_ranked(rows, counts, counts * 2.0, None if limit < 0 else limit)):
                    same(g, w)
    assert found


def test_pattern_past_the_last_suffix():
    """A pattern that starts like the shard's last token run but is longer than what is left of the tokens."""
    sh = Shard.from_tokens("s", "corpus", np.array([4, 4, 4], dtype=np.uint16), 2)
    for n in range(1, 7):
        p = np.full(n, 4, dtype=">u2").tobytes()
        assert sh.find(p) == ref_find(sh, p)
        assert sh.longest(p, 1, n) == ref_longest(sh, p, 1, n)
    assert sh.longest(np.full(5, 4, dtype=">u2").tobytes(), 1, 5) == (3, 0)
    # raw sentinel bytes: the only patterns that can run past the last suffix (the lone final sentinel)
    for p in (b"\xff\xff", b"\xff\xff\xff\xff", b"\x00\x04\xff\xff\x00"):
        assert sh.find(p) == ref_find(sh, p) and sh._first(p) == ref_first(sh, p)
    assert sh.find(b"\xff\xff\xff\xff") == (0, 0) and sh.find(b"\xff\xff") == (3, 4)


@pytest.mark.parametrize("width,compact,vocab", SHARDS)
def test_continuations_match_numpy(width, compact, vocab):
    rng = np.random.default_rng(100 + width * 10 + compact)
    checked = 0
    for _ in range(12):
        sh, docs = make_shard(rng, width, compact, vocab)
        for cb in patterns(rng, sh, docs, 25):
            n = min(len(cb) // sh.width, int(rng.integers(1, 4)))
            lo, hi = sh.find(cb[-n * sh.width:])
            for quota in (0, 1, 3, 1000):
                same(sh.sample(lo, hi, quota), ref_sample(sh, lo, hi, quota))
                pos = ref_sample(sh, lo, hi, quota)
                for max_len in (0, 1, 4, 12):
                    for got, want in zip(sh.continuations(pos, n, max_len),
                                         ref_shard_continuations(sh, pos, n, max_len)):
                        same(got, want)
                    if max_len:
                        rows, counts = ref_id_rows(sh, lo, hi, quota, n, max_len)
                        for got, want in zip(sh.id_rows(lo, hi, quota, n, max_len), (rows, counts)):
                            same(got, want)
                        for weight in (1.0, 2.5):
                            for limit in (None, 0, 2):
                                want = ref_ranked(rows, counts, counts * weight, limit)
                                got = _one_shard_ranked(*sh.kernel_view(), lo, hi, quota, n, max_len, weight,
                                                        -1 if limit is None else limit)
                                for g, w in zip(got, want):
                                    same(g, w)
                                checked += int(rows.shape[0] > 1)
    assert checked  # some rankings had more than one row to order


def test_masked_shard_counts_only_alive_occurrences():
    """A shard with masked documents: a match only inside a masked document does not count."""
    docs = [np.array([1, 2, 3, 4]), np.array([1, 2, 5, 6]), np.array([1, 2, 3, 7])]
    arr, spans = join_documents(docs, 2)
    sh = Shard.from_tokens("s", "corpus", arr, 2)
    cb = np.array([9, 1, 2, 3], dtype=">u2").tobytes()
    assert sh.longest(cb, 1, 4)[0] == 3
    assert sh.id_rows(*sh.find(cb[-6:-2]), 10, 2, 3)[0].shape[0] == 3  # after [1, 2]
    sh.set_dead([spans[0], spans[2]])
    assert sh.longest(cb, 1, 4) == (0, None)  # token 3 only occurs in masked documents
    n, first = sh.longest(cb[:-2], 1, 3)
    c, lo, hi = sh.count(cb[-6:-2], first)
    assert (n, c, hi - lo) == (2, 1, 3)
    rows, counts = sh.id_rows(lo, hi, 10, 2, 3)
    same(rows, np.array([[5, 6, -1]]))
    same(counts, np.array([1]))


def test_ranked_matches_lexsort():
    """Several shards: rows merged by np.unique, weights summed, then ranked by the compiled sort; ties in
    weight broken by counts, ties in both by tokens."""
    rng = np.random.default_rng(7)
    for _ in range(200):
        u = int(rng.integers(0, 40))
        rows = np.unique(rng.integers(-1, 4, size=(u, 3)), axis=0)
        counts = rng.integers(1, 4, size=rows.shape[0]).astype(np.int64)
        weights = counts * rng.choice([1.0, 2.0, 4.0], size=rows.shape[0])
        for limit in (None, 0, 1, 5, 100):
            for g, w in zip(_ranked(rows, counts, weights, -1 if limit is None else limit),
                            ref_ranked(rows, counts, weights, limit)):
                same(g, w)


def test_store_continuations_over_shards_match_numpy():
    """store._continuations over two shards (one with an alphabet): the compiled per-shard rows merged."""
    docs = [np.array([1, 2, 3, 4, 5]), np.array([1, 2, 3, 9]), np.array([7, 1, 2])]
    arr, _ = join_documents(docs, 4)
    a = Shard.from_tokens("a", "corpus", arr, 4, weight=1.0, compact=True)
    b = Shard.from_tokens("b", "repository", arr[:11], 4, weight=2.0)
    info = []
    for sh in (a, b):
        c, lo, hi = sh.count(sh.encode(np.array([1, 2])))
        info.append((sh, c, lo, hi))
    total = sum(c for _, c, _, _ in info)
    rows, counts, weights = store_continuations(info, total, 2, 5000, 4, False)
    want = {(3, 4, 5, -1): (2, 3.0), (3, 9, -1, -1): (2, 3.0)}
    assert {tuple(r): (int(c), float(w)) for r, c, w in zip(rows.tolist(), counts, weights)} == want


def test_many_distinct_continuations():
    """More distinct continuations than the first allocation holds (the row arrays grow), and a limit."""
    rng = np.random.default_rng(3)
    docs = [np.concatenate([[0], rng.integers(1, 50, size=3)]) for _ in range(600)]
    arr, _ = join_documents(docs, 2)
    sh = Shard.from_tokens("s", "corpus", arr, 2)
    lo, hi = sh.find(np.array([0], ">u2").tobytes())
    assert hi - lo == 600
    rows, counts = sh.id_rows(lo, hi, 5000, 1, 4)
    want_rows, want_counts = ref_id_rows(sh, lo, hi, 5000, 1, 4)
    assert rows.shape[0] > 300
    same(rows, want_rows)
    same(counts, want_counts)
    for got, want in zip(_one_shard_ranked(*sh.kernel_view(), lo, hi, 5000, 1, 4, 4.0, 100),
                         ref_ranked(want_rows, want_counts, want_counts * 4.0, 100)):
        same(got, want)


# ---- the live buffer's scan shard --------------------------------------------------------------------------
def ref_scan_ends(tok: np.ndarray, q: np.ndarray, n_hi: int):
    """The scan before the compiled one: ends of runs matching q's suffix, for each length 1..n_hi."""
    ends = np.flatnonzero(tok == q[-1])
    if ends.size == 0:
        return
    yield 1, ends
    for j in range(1, n_hi):
        ends = ends[ends >= j]
        ends = ends[tok[ends - j] == q[-1 - j]]
        if ends.size == 0:
            return
        yield j + 1, ends


def ref_scan_longest(tok, q, n_lo, n_hi):
    """(n, starts) as ScanShard.longest finds them, (0, None) below n_lo."""
    best, best_ends = 0, None
    for n, ends in ref_scan_ends(tok, q, n_hi):
        best, best_ends = n, ends
    return (0, None) if best < n_lo else (best, best_ends - best + 1)


def ref_scan_starts(tok, q):
    ends = np.zeros(0, dtype=np.int64)
    for n, e in ref_scan_ends(tok, q, q.size):
        ends = e if n == q.size else ends
    return ends - q.size + 1


@pytest.mark.parametrize("width", [2, 4])
def test_scan_shard_matches_numpy(width):
    rng = np.random.default_rng(50 + width)
    vocab = np.array([0, 1, 2, 3, 300, 70_000 if width == 4 else 65534])
    for _ in range(30):
        docs = random_docs(rng, int(rng.integers(1, 4)), vocab)
        tokens = np.concatenate(docs)
        sh = ScanShard("l", "live", tokens, width)
        matched = 0
        for cb in patterns(rng, sh, docs, 30):
            q = np.frombuffer(cb, dtype=be_dtype(width)).astype(np.int64)
            for n_lo, n_hi in ((1, q.size), (2, q.size), (1, min(2, q.size)), (3, 2)):
                want = ref_scan_longest(sh.tok, q, n_lo, n_hi) if n_hi >= n_lo else (0, None)
                n, first = sh.longest(cb, n_lo, n_hi)
                assert (n, first) == (want[0], None)
                if n:
                    matched += 1
                    same(sh._starts(cb[-n * width:]), want[1])  # the memo of this search
                    for quota in (1, 5, 1000):
                        pos = sh.sample(0, want[1].size, quota)
                        for max_len in (0, 1, 4, 12):
                            for got, ref in zip(sh.continuations(pos, n, max_len),
                                                ref_continuations(sh.tok, sh.sentinel, pos, n, max_len, sort=True)):
                                same(got, ref)
            sh._tl.memo = None
            same(sh._starts(cb), ref_scan_starts(sh.tok, q))
        assert matched
