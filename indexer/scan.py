"""A live shard (an open buffer, generated text) searched by a scan instead of a suffix array: replacing it
costs one array conversion, and a search is one compiled pass over its tokens."""
from __future__ import annotations

import threading

import numpy as np

from restbase.jit import njit

from .kernels import grown, padded_ids, rank_order_kernel, same_row
from .layout import be_dtype, check_ids, native_dtype, sentinel_for_width


_SCAN_BLOCK = 128  # tokens a scan tests at once for its last token before looking at them one by one


@njit
def _scan_longest(tok, q, n_hi):
    """(n, starts): the largest n <= n_hi whose last n tokens of q occur in tok (native ids), and where they
    start, in text order ([k] int64); (0, []) when not even q's last token occurs. One pass: each position
    holding q's last token is extended backwards."""
    m = q.shape[0]
    n_hi = min(n_hi, m)
    best, k = 0, 0
    ends = np.empty(16, np.int64)
    if m == 0:
        return best, ends[:0]
    last = q[m - 1]
    for b0 in range(0, tok.shape[0], _SCAN_BLOCK):
        block = tok[b0:b0 + _SCAN_BLOCK]
        hits = 0
        # branch-free over a view (indices from 0: no negative-index wrapping), so compiled to SIMD: most
        # blocks hold no candidate
        for j in range(block.shape[0]):
            hits += block[j] == last
        if hits == 0:
            continue
        for i in range(b0, b0 + block.shape[0]):
            if tok[i] != last:
                continue
            length = 1
            while length < n_hi and length <= i and tok[i - length] == q[m - 1 - length]:
                length += 1
            if length < best:
                continue
            if length > best:
                best, k = length, 0
            if k == ends.shape[0]:
                ends = grown(ends, 2 * k)
            ends[k] = i
            k += 1
    return best, ends[:k] - best + 1


@njit
def _sorted_distinct_rows(tok, sentinel, pos, n, max_len):
    """As `kernels.distinct_rows` for positions in any order over native tokens (ScanShard): the rows sorted by
    tokens, then grouped. max_len > 0."""
    rows = np.empty((pos.shape[0], max_len), np.int64)
    last = tok.shape[0] - 1
    for i in range(pos.shape[0]):
        ended = False
        for j in range(max_len):  # past the token array: its last token (a sentinel), as take(mode="clip")
            t = sentinel if ended else np.int64(tok[min(pos[i] + n + j, last)])
            ended = t == sentinel
            rows[i, j] = t
    none = np.zeros(pos.shape[0], np.int64)
    order = rank_order_kernel(rows, none, none)
    out = np.empty_like(rows)
    lengths = np.empty(pos.shape[0], np.int64)
    counts = np.empty(pos.shape[0], np.int64)
    u = 0
    for i in order:
        if u > 0 and same_row(rows, i, out, u - 1):
            counts[u - 1] += 1
            continue
        out[u] = rows[i]
        length = 0
        while length < max_len and rows[i, length] != sentinel:
            length += 1
        lengths[u], counts[u] = length, 1
        u += 1
    return out[:u], lengths[:u], counts[:u]


class ScanShard:
    """A live shard searched by a scan instead of a suffix array: replacing it costs one array conversion
    (well under a millisecond for 5,000 lines), and a search is one compiled pass over it that extends every
    occurrence of the last context token backwards (`_scan_longest`). Same interface as Shard."""

    def __init__(self, shard_id: str, kind: str, tokens, width: int, weight: float = 1.0):
        self.id, self.kind, self.width, self.weight = shard_id, kind, width, weight
        self.sentinel = sentinel_for_width(width)
        arr = np.asarray(tokens)
        if arr.dtype.kind not in "iu":
            arr = np.asarray(tokens, dtype=np.int64)
        check_ids(arr, width)
        self.tok = np.empty(arr.size + 1, dtype=native_dtype(width))
        self.tok[:-1] = arr
        self.tok[-1] = self.sentinel
        self.n = int(self.tok.size) if arr.size else 0
        self.dead, self.dead_tokens, self.files = [], 0, ()
        self._tl = threading.local()

    alpha = None

    def prefault(self) -> None:
        """Nothing to map: a live shard is in memory (Shard.prefault)."""

    def encode(self, ctx: np.ndarray) -> bytes:
        return ctx.astype(be_dtype(self.width)).tobytes()

    def ids(self, start: int, end: int) -> np.ndarray:
        return self.tok[start:end].astype(np.int64)

    def longest(self, cb: bytes, n_lo: int, n_hi: int) -> tuple[int, None]:
        """As Shard.longest; no first index to give (`count` reads this search's memo instead)."""
        if n_hi < n_lo or self.n == 0:
            return 0, None
        best, starts = _scan_longest(self.tok, np.frombuffer(cb, dtype=be_dtype(self.width)).astype(np.int64),
                                     n_hi)
        if best < n_lo:
            return 0, None
        self._tl.memo = (cb[-best * self.width:], starts)
        return best, None

    def _starts(self, p: bytes) -> np.ndarray:
        memo = getattr(self._tl, "memo", None)
        if memo is not None and memo[0] == p:
            return memo[1]
        q = np.frombuffer(p, dtype=be_dtype(self.width)).astype(np.int64)
        n, starts = _scan_longest(self.tok, q, q.size)
        if n < q.size:
            starts = np.zeros(0, dtype=np.int64)
        self._tl.memo = (p, starts)
        return starts

    def count(self, p: bytes, first: int | None = None) -> tuple[int, int, int]:
        c = int(self._starts(p).size)
        return c, 0, c

    def find(self, p: bytes, first: int | None = None) -> tuple[int, int]:
        c = int(self._starts(p).size)
        return 0, c

    def sample(self, lo: int, hi: int, quota: int) -> np.ndarray:
        memo = getattr(self._tl, "memo", None)
        starts = memo[1] if memo is not None else np.zeros(0, np.int64)
        r = starts.size
        if r <= quota:
            return starts.astype(np.int64)
        return starts[(np.arange(quota, dtype=np.int64) * r) // quota].astype(np.int64)

    def first(self, lo: int, hi: int, n: int) -> np.ndarray:
        """The first n occurrences in text order: a scan shard has no suffix array."""
        return self.sample(lo, hi, hi - lo)[:n]

    def id_rows(self, lo: int, hi: int, quota: int, n: int, max_len: int) -> tuple[np.ndarray, np.ndarray]:
        """As Shard.id_rows, over this search's occurrences (in text order, see `sample`)."""
        return padded_ids(*self.continuations(self.sample(lo, hi, quota), n, max_len))

    def continuations(self, pos: np.ndarray, n: int, max_len: int):
        """As Shard.continuations; positions are in text order here, not suffix order: the rows are sorted
        before they are grouped."""
        if pos.size == 0 or max_len <= 0:
            return np.zeros((0, max(max_len, 0)), np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64)
        return _sorted_distinct_rows(self.tok, self.sentinel, np.asarray(pos, dtype=np.int64), n, max_len)
