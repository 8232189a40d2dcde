"""A suffix-array shard: token array + token-level suffix array, on disk (mmap) or in memory, searched by the
compiled kernels (indexer/kernels.py) with its masked documents (old versions of changed files) left out.

Layout: indexer/layout.py; files: indexer/shardfile.py; making one: indexer/sorting.py.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from . import shardfile
from .kernels import (NO_ALPHA, NO_DEAD, alive_first, dead_count, distinct_rows, encode_kernel, id_rows_kernel,
                      padded_ids, sa_find, sa_first, sa_longest, sa_sample)
from .layout import be_dtype, check_ids, native_dtype, sentinel_for_width
from .manifest import kind_of
from .sorting import compact_tokens, suffix_array
from .types import CorruptShard


@dataclass
class Shard:
    """A searchable shard. `tb[off + i*w : ...]` are the big-endian bytes of token i."""

    id: str
    kind: str  # "corpus" | "repository" | "live"
    width: int
    tb: object  # bytes or mmap: slicing returns bytes
    off: int
    tok: np.ndarray  # big-endian token view (len N)
    sa: np.ndarray
    weight: float = 1.0
    dead: list = field(default_factory=list)  # [(start, end)] token spans of masked documents
    files: tuple = ()
    alpha: np.ndarray | None = None  # sorted ids when tokens are stored as 2-byte ranks into it

    def __post_init__(self):
        if self.alpha is not None:
            self.alpha = np.asarray(self.alpha, dtype=np.int64)
        self._ranks: np.ndarray | None = None  # rank_table
        self.n = int(self.tok.shape[0])
        # what the compiled search reads: the token bytes as uint8 (numba has no big-endian arrays), and the
        # suffix array read-only like a mapped one's, so that in-memory and mapped shards share machine code
        self._tbu = np.frombuffer(self.tb, dtype=np.uint8)
        self._sa = np.ascontiguousarray(self.sa).view()
        self._sa.flags.writeable = False
        self.sentinel = sentinel_for_width(self.width)
        self.set_dead(self.dead)

    # ---- construction ------------------------------------------------------------------------
    @classmethod
    def from_tokens(cls, shard_id: str, kind: str, tokens, width: int, *, weight: float = 1.0,
                    compact: bool = False) -> "Shard":
        """An in-memory shard over one or more documents already joined with sentinels (or one doc)."""
        arr = np.asarray(tokens)
        nd = native_dtype(width)
        s = sentinel_for_width(width)
        if arr.size == 0 or arr.dtype != nd or int(arr[-1]) != s:
            if arr.size:
                check_ids(arr, width)
            arr = np.concatenate([arr.astype(nd, copy=False), np.array([s], dtype=nd)])
        alpha = None
        if compact:
            arr, width, alpha = compact_tokens(arr, width)
        sa = suffix_array(arr, width)
        tb = arr.astype(be_dtype(width)).tobytes()
        tok = np.frombuffer(tb, dtype=be_dtype(width))
        return cls(shard_id, kind, width, tb, 0, tok, sa, weight, alpha=alpha)

    @classmethod
    def from_sorted(cls, shard_id: str, kind: str, prepared, *, weight: float = 1.0) -> "Shard":
        """An in-memory shard from sort_shard's output (searchable before its files are written)."""
        stored, tw, alpha, sa = prepared
        tb = np.asarray(stored, dtype=be_dtype(tw)).tobytes()
        return cls(shard_id, kind, tw, tb, 0, np.frombuffer(tb, dtype=be_dtype(tw)), sa, weight, alpha=alpha)

    @classmethod
    def load(cls, directory: Path, meta: dict, width: int, *, weight: float = 1.0, verify: bool = True) -> "Shard":
        sid = meta["id"]
        ft, fs = meta["files"]["tok"], meta["files"]["sa"]
        tw = int(meta.get("token_width", width))
        mm_t, off_t, dt_t, n_t = shardfile.open_npy(directory / ft["name"], ft, sid, verify)
        mm_s, off_s, dt_s, n_s = shardfile.open_npy(directory / fs["name"], fs, sid, verify)
        if dt_t != be_dtype(tw) or n_t != n_s or n_t != meta["tokens"]:
            raise CorruptShard(sid, ft["name"], "token array does not match the manifest")
        alpha, names = None, (ft["name"], fs["name"])
        fa = meta["files"].get("alpha")
        if fa is not None:
            mm_a, off_a, dt_a, n_a = shardfile.open_npy(directory / fa["name"], fa, sid, True)
            alpha = np.frombuffer(mm_a, dtype=dt_a, count=n_a, offset=off_a)
            names += (fa["name"],)
        elif tw != width:
            raise CorruptShard(sid, ft["name"], "ranked tokens without an alphabet")
        tok = np.frombuffer(mm_t, dtype=dt_t, count=n_t, offset=off_t) if n_t else np.zeros(0, dt_t)
        sa = np.frombuffer(mm_s, dtype=dt_s, count=n_s, offset=off_s) if n_s else np.zeros(0, np.int32)
        return cls(sid, kind_of(meta), tw, mm_t, off_t, tok, sa, weight,
                   [tuple(x) for x in meta.get("dead", [])], names, alpha)

    def set_dead(self, spans) -> None:
        self.dead = sorted((int(a), int(b)) for a, b in spans)
        if self.dead:
            self._dead_starts = np.array([a for a, _ in self.dead], dtype=np.int64)
            self._dead_ends = np.array([b for _, b in self.dead], dtype=np.int64)
            parts = []
            for a, b in self.dead:
                parts.append(np.asarray(self.tok[a:b], dtype=np.int64))
                parts.append(np.array([self.sentinel], dtype=np.int64))
            self._dead_tokens = np.concatenate(parts)
        else:
            self._dead_starts = self._dead_ends = None
            self._dead_tokens = NO_DEAD
        self.dead_tokens = sum(b - a for a, b in self.dead)

    def encode(self, ctx: np.ndarray) -> bytes:
        """Big-endian bytes of the context (ids in [0, sentinel)) in this shard's storage (ranks when it has an
        alphabet); the context is cut after the last id this shard does not contain (it cannot match across it)."""
        return encode_kernel(self.rank_table(), self.width, np.asarray(ctx, dtype=np.int64)).tobytes()

    def rank_table(self) -> np.ndarray:
        """Per id up to the alphabet's last one plus one, its rank in the alphabet or -1 (built on first use:
        a table lookup per token); empty when the shard stores ids."""
        table = self._ranks
        if table is None:
            a = self.alpha
            if a is None:
                table = np.zeros(0, dtype=np.int32)
            else:
                table = np.full(int(a[-1]) + 2 if a.size else 1, -1, dtype=np.int32)
                table[a] = np.arange(a.size, dtype=np.int32)
            self._ranks = table
        return table

    def ids(self, start: int, end: int) -> np.ndarray:
        """Token ids of positions [start, end) (no sentinel inside a document's span)."""
        t = np.asarray(self.tok[start:end]).astype(np.int64)
        return self.alpha[t] if self.alpha is not None else t

    # ---- search primitives ---------------------------------------------------------------------
    def _first(self, p: bytes) -> int:
        """Index of the first suffix that starts with p, or -1."""
        return sa_first(self._tbu, self._sa, self.off, self.width, np.frombuffer(p, np.uint8))

    def find(self, p: bytes, first: int | None = None) -> tuple[int, int]:
        """SA range [lo, hi) of suffixes that start with the pattern bytes p. first: `_first(p)` if known
        (`longest` found it), which saves its binary search."""
        return sa_find(self._tbu, self._sa, self.off, self.width, np.frombuffer(p, np.uint8),
                       -1 if first is None else first)

    def occurs(self, p: bytes) -> bool:
        """Does p occur outside masked documents? (one binary search without masks)"""
        return alive_first(self._tbu, self._sa, self.off, self.width, np.frombuffer(p, np.uint8),
                           self._dead_tokens) >= 0

    def count(self, p: bytes, first: int | None = None) -> tuple[int, int, int]:
        """(alive occurrences, lo, hi) of pattern bytes p. first: as for `find`."""
        lo, hi = self.find(p, first)
        c = hi - lo
        if c and self.dead:
            c -= dead_count(self._dead_tokens, np.frombuffer(p, np.uint8), self.width)
        return c, lo, hi

    def longest(self, cb: bytes, n_lo: int, n_hi: int) -> tuple[int, int | None]:
        """(n, first): the largest n in [n_lo, n_hi] whose last n tokens of cb occur (alive), 0 if none, and
        the first SA index of those n tokens (`count`'s `first`: the search then counts them without a
        binary search of its own)."""
        if n_hi < n_lo or self.n == 0:
            return 0, None
        n, first = sa_longest(self._tbu, self._sa, self.off, self.width, np.frombuffer(cb, np.uint8), n_lo, n_hi,
                              self._dead_tokens)
        return (n, first) if n else (0, None)

    def sample(self, lo: int, hi: int, quota: int) -> np.ndarray:
        """Positions of up to `quota` occurrences spread evenly over SA[lo:hi] (all when they fit),
        in suffix-array order, masked documents removed."""
        if not self.dead:
            return sa_sample(self._sa, lo, hi, quota)
        r = hi - lo
        if r <= 0 or quota <= 0:
            return np.zeros(0, dtype=np.int64)
        if r <= quota:
            pos = np.asarray(self.sa[lo:hi], dtype=np.int64)
        else:
            idx = lo + (np.arange(quota, dtype=np.int64) * r) // quota
            pos = np.asarray(self.sa[idx], dtype=np.int64)
        if self.dead:
            i = np.searchsorted(self._dead_starts, pos, side="right") - 1
            dead = (i >= 0) & (pos < self._dead_ends[np.maximum(i, 0)])
            pos = pos[~dead]
        return pos

    def first(self, lo: int, hi: int, n: int) -> np.ndarray:
        """Positions of the first n occurrences in suffix-array order, masked documents removed (the
        REST reference code's biased sample; `search(first_k=True)`)."""
        return self.sample(lo, min(hi, lo + n), n)

    def continuations(self, pos: np.ndarray, n: int, max_len: int):
        """Distinct continuations after a match of length n at positions pos (in SA order).
        Returns (rows [u, max_len] int64 padded with the sentinel, lengths [u], counts [u])."""
        if pos.size == 0 or max_len <= 0:
            return np.zeros((0, max(max_len, 0)), np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64)
        uniq, lengths, counts = distinct_rows(self._tbu, self.off, self.width, self.n, self.sentinel,
                                              np.asarray(pos, dtype=np.int64), n, max_len)
        if self.alpha is not None:  # ranks -> ids; padding past a document's end is cut by `lengths`
            uniq = self.alpha[np.minimum(uniq, self.alpha.size - 1)]
        return uniq, lengths, counts

    def kernel_view(self) -> tuple:
        """The compiled search's view of this shard: (token bytes uint8, off, width, tokens, sentinel, suffix
        array, alphabet int64 or empty)."""
        return (self._tbu, self.off, self.width, self.n, self.sentinel, self._sa,
                NO_ALPHA if self.alpha is None else self.alpha)

    def id_rows(self, lo: int, hi: int, quota: int, n: int, max_len: int) -> tuple[np.ndarray, np.ndarray]:
        """A search's take from this shard: the distinct non-empty continuations (ids) of up to `quota`
        occurrences spread over SA[lo:hi], each a match of length n: (rows [u, max_len] int64 padded with -1,
        counts [u] int64), in SA order. max_len > 0."""
        if not self.dead:  # one compiled call
            return id_rows_kernel(*self.kernel_view(), lo, hi, quota, n, max_len)
        return padded_ids(*self.continuations(self.sample(lo, hi, quota), n, max_len))

    def prefault(self) -> None:
        """Map every page of the shard's files into this process now (`shardfile.prefault`). Without it, a
        search's first visits to a region fault pages in one by one: a cold corpus search samples 256
        occurrences over the whole suffix array, each on its own page, and took 1-3 ms instead of 0.1-0.3 ms in
        the first pass over a replay."""
        shardfile.prefault(self.tb, self.sa)

    def bytes_on_disk(self, directory: Path | None) -> int:
        if directory is None:
            return 0
        return sum((directory / f).stat().st_size for f in self.files if (directory / f).exists())
