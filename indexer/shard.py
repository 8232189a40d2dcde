"""One suffix-array shard: token array + token-level suffix array, on disk (mmap) or in memory.

Layout: tokens are stored big-endian with a fixed width (2 or 4 bytes) so that comparing raw bytes of
two token runs compares them lexicographically as token sequences; every document is followed by a
sentinel token (the width's largest value, never a real id), so a match or a continuation never crosses a
document, and the array ends with one. The suffix array (int32, int64 past 2^31 tokens) orders all
suffixes of the token array (pydivsufsort). Search is a binary search over the suffix array, compiled
(rest_lsp/jit.py) over the token bytes viewed as uint8: comparing big-endian bytes compares tokens, and
numba cannot read a big-endian array. A lookup costs ~26 steps at 50M tokens.
"""
from __future__ import annotations

import hashlib
import mmap
import threading
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from rest_lsp.storage import atomic_file, fsync_dir

from rest_lsp.jit import njit
from .types import CorruptShard, TokenOutOfRange


def width_for_vocab(vocab_size: int) -> int:
    """Bytes per token: 2 when every id and the sentinel fit in uint16 (ids < 65,535), else 4."""
    return 2 if vocab_size <= 0xFFFF else 4


def sentinel_for_width(width: int) -> int:
    return 0xFFFF if width == 2 else 0xFFFFFFFF


def native_dtype(width: int):
    return np.dtype(np.uint16 if width == 2 else np.uint32)


def be_dtype(width: int):
    return np.dtype(">u2" if width == 2 else ">u4")


def check_ids(ids: np.ndarray, width: int) -> None:
    """Raise instead of wrapping: an id that does not fit below the sentinel is an error."""
    if ids.size == 0:
        return
    lo, hi = int(ids.min()), int(ids.max())
    if lo < 0 or hi >= sentinel_for_width(width):
        raise TokenOutOfRange(
            f"token id {hi if hi >= sentinel_for_width(width) else lo} does not fit a {8 * width}-bit "
            f"token store (ids must lie in 0..{sentinel_for_width(width) - 1})"
        )


def suffix_array(tokens: np.ndarray, width: int, vocab_size: int | None = None) -> np.ndarray:
    """Suffix array of a native token array (with sentinels). Ids are first mapped to dense ranks (order
    kept, the sentinel stays largest) so a 151k-word vocabulary whose corpus uses ~60k ids sorts as uint16."""
    from pydivsufsort import divsufsort

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


def kind_of(meta: dict) -> str:
    """A shard's kind as its manifest entry says it (one written without a kind is a repository shard)."""
    return meta.get("kind", "repository")


# ---- compiled search ------------------------------------------------------------------------------
# tb: the token bytes (uint8, big-endian tokens from `off`), sa: the suffix array, w: bytes per token,
# p / cb: pattern bytes (uint8). A suffix compares with a pattern as `bytes` slices do: a suffix that ends
# before the pattern does (the last sentinel's) is smaller.

@njit
def _cmp_at(tb, s, p) -> int:
    """-1, 0 or 1: tb[s:s + len(p)] compared with p."""
    end = tb.shape[0]
    for j in range(p.shape[0]):
        if s + j >= end:  # only the final sentinel's suffix can end first (a pattern holds no sentinel)
            return -1
        a, b = tb[s + j], p[j]
        if a != b:
            return -1 if a < b else 1
    return 0


@njit
def _sa_lower(tb, sa, off, w, p, lo, hi) -> int:
    """The first SA index in [lo, hi) whose suffix is not below p (hi if none)."""
    while lo < hi:
        mid = (lo + hi) >> 1
        if _cmp_at(tb, off + sa[mid] * w, p) < 0:
            lo = mid + 1
        else:
            hi = mid
    return lo


@njit
def _sa_upper(tb, sa, off, w, p, lo, hi) -> int:
    """The first SA index in [lo, hi) whose suffix is above p and does not start with it (hi if none)."""
    while lo < hi:
        mid = (lo + hi) >> 1
        if _cmp_at(tb, off + sa[mid] * w, p) <= 0:
            lo = mid + 1
        else:
            hi = mid
    return lo


@njit
def _sa_first(tb, sa, off, w, p) -> int:
    """The first SA index whose suffix starts with p, or -1."""
    n = sa.shape[0]
    lo = _sa_lower(tb, sa, off, w, p, 0, n)
    if lo >= n or _cmp_at(tb, off + sa[lo] * w, p) != 0:
        return -1
    return lo


@njit
def sa_find(tb, sa, off, w, p, first):
    """(lo, hi): the SA range of suffixes that start with p; first: `_sa_first` if known, else -1."""
    lo = _sa_first(tb, sa, off, w, p) if first < 0 else first
    if lo < 0:
        return 0, 0
    # gallop from lo (most ranges are short), then bisect the last step
    n = sa.shape[0]
    inside, step = lo, 1
    while inside + step < n:
        if _cmp_at(tb, off + sa[inside + step] * w, p) <= 0:
            inside += step
            step *= 2
        else:
            break
    return lo, _sa_upper(tb, sa, off, w, p, inside + 1, min(inside + step, n))


@njit
def _last(cb, n, w):
    """The last n tokens' bytes of cb, all of it when shorter (as the bytes slice cb[-n * w:])."""
    return cb[max(0, cb.shape[0] - n * w):]


@njit
def sa_longest(tb, sa, off, w, cb, n_lo, n_hi):
    """(n, first) as Shard.longest for a shard without masked documents; (0, -1) if none."""
    good_at = _sa_first(tb, sa, off, w, _last(cb, n_lo, w))
    if good_at < 0:
        return 0, -1
    good, bad = n_lo, n_hi + 1
    # gallop from the short end: typical matches are short
    step = 1
    while good + step < bad:
        probe = good + step
        at = _sa_first(tb, sa, off, w, _last(cb, probe, w))
        if at >= 0:
            good, good_at = probe, at
            step *= 2
        else:
            bad = probe
            break
    while bad - good > 1:
        mid = (good + bad) // 2
        at = _sa_first(tb, sa, off, w, _last(cb, mid, w))
        if at >= 0:
            good, good_at = mid, at
        else:
            bad = mid
    return good, good_at


@njit
def _token_at(tb, off, w, n_tok, i) -> int:
    """Token i of the big-endian bytes; past the end, the last one (a sentinel), as numpy's take(mode="clip")."""
    s = off + min(i, n_tok - 1) * w
    v = 0
    for j in range(w):
        v = (v << 8) | tb[s + j]
    return v


@njit
def _sa_sample(sa, lo, hi, quota):
    """Shard.sample for a shard without masked documents: [<= quota] int64 positions in SA order."""
    r = hi - lo
    if r <= 0 or quota <= 0:
        return np.zeros(0, np.int64)
    if r <= quota:
        return sa[lo:hi].astype(np.int64)
    pos = np.empty(quota, np.int64)
    for i in range(quota):
        pos[i] = sa[lo + (i * r) // quota]
    return pos


@njit
def _grown(a, size):
    """a's first rows in a new array of `size` rows (the rest uninitialized)."""
    out = np.empty((size,) + a.shape[1:], a.dtype)
    out[:a.shape[0]] = a
    return out


@njit
def _same_row(a, i, b, k) -> bool:
    for j in range(a.shape[1]):
        if a[i, j] != b[k, j]:
            return False
    return True


@njit
def _distinct_rows(tb, off, w, n_tok, sentinel, pos, n, max_len):
    """The distinct continuations of a match of length n at positions pos (SA order: equal rows adjacent):
    (rows [u, max_len] int64, the sentinel from a document's end on; lengths [u]; counts [u]). max_len > 0."""
    # the arrays grow as distinct rows come: a few thousand positions often hold a few dozen distinct rows,
    # and a fresh array for all of them (hundreds of kB) costs more in page faults than the gather itself
    size = min(pos.shape[0], 64) + 1  # + 1: the slot after the last kept row holds the candidate
    rows = np.empty((size, max_len), np.int64)
    lengths = np.empty(size, np.int64)
    counts = np.empty(size, np.int64)
    u = 0
    for i in range(pos.shape[0]):
        length = max_len
        for j in range(max_len):  # the candidate goes into slot u; kept only if it differs from u - 1
            t = sentinel if j >= length else _token_at(tb, off, w, n_tok, pos[i] + n + j)
            if t == sentinel:
                length = min(length, j)
            rows[u, j] = t
        if u > 0 and _same_row(rows, u, rows, u - 1):
            counts[u - 1] += 1
            continue
        lengths[u], counts[u] = length, 1
        u += 1
        if u == rows.shape[0]:
            size = min(2 * size, pos.shape[0] + 1)
            rows, lengths, counts = _grown(rows, size), _grown(lengths, size), _grown(counts, size)
    return rows[:u], lengths[:u], counts[:u]


@njit
def id_rows_kernel(tb, off, w, n_tok, sentinel, sa, alpha, lo, hi, quota, n, max_len):
    """What a search takes from one shard without masked documents: the distinct non-empty continuations of
    up to `quota` sampled occurrences in SA[lo:hi], in token ids: (rows [u, max_len] int64 padded with -1,
    counts [u] int64), in SA order. alpha: the shard's alphabet (ranks -> ids), empty when tokens are ids."""
    pos = _sa_sample(sa, lo, hi, quota)
    rows, lengths, counts = _distinct_rows(tb, off, w, n_tok, sentinel, pos, n, max_len)
    keep = 0
    for i in range(rows.shape[0]):  # an occurrence at a document's end has nothing to continue with
        if lengths[i] == 0:
            continue
        for j in range(max_len):
            t = rows[i, j]
            rows[keep, j] = -1 if j >= lengths[i] else (alpha[t] if alpha.shape[0] else t)
        counts[keep] = counts[i]
        keep += 1
    return rows[:keep], counts[:keep]


@njit
def _before(rows, counts, weights, a, b) -> bool:
    """Does continuation a rank strictly before b: heavier, then more frequent, then by tokens ascending."""
    if weights[a] != weights[b]:
        return weights[a] > weights[b]
    if counts[a] != counts[b]:
        return counts[a] > counts[b]
    for j in range(rows.shape[1]):
        if rows[a, j] != rows[b, j]:
            return rows[a, j] < rows[b, j]
    return False


@njit
def rank_order_kernel(rows, counts, weights):
    """The search's ranking of continuations (`_before`), stable ([u] int64): a bottom-up merge sort (numba
    has no lexsort). With equal weights and counts, the rows' lexicographic order."""
    u = counts.shape[0]
    order = np.arange(u)
    spare = np.empty(u, np.int64)
    run = 1
    while run < u:
        for lo in range(0, u, 2 * run):
            mid, hi = min(lo + run, u), min(lo + 2 * run, u)
            i, j = lo, mid
            for out in range(lo, hi):
                if j < hi and (i >= mid or _before(rows, counts, weights, order[j], order[i])):
                    spare[out] = order[j]
                    j += 1
                else:
                    spare[out] = order[i]
                    i += 1
        order, spare = spare, order
        run *= 2
    return order


@njit
def _sorted_distinct_rows(tok, sentinel, pos, n, max_len):
    """As `_distinct_rows` for positions in any order over native tokens (ScanShard): the rows sorted by
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
        if u > 0 and _same_row(rows, i, out, u - 1):
            counts[u - 1] += 1
            continue
        out[u] = rows[i]
        length = 0
        while length < max_len and rows[i, length] != sentinel:
            length += 1
        lengths[u], counts[u] = length, 1
        u += 1
    return out[:u], lengths[:u], counts[:u]


_NO_ALPHA = np.zeros(0, np.int64)  # `id_rows_kernel`' alphabet for a shard that stores ids


@njit
def encode_kernel(ranks, w, ctx):
    """`Shard.encode` as uint8 bytes: ranks: `Shard.rank_table` (empty: the shard stores ids); ctx [n] int64
    ids in [0, sentinel). An id past the table clips to its last entry, -1 (not in the alphabet)."""
    n = ctx.shape[0]
    start = 0
    for i in range(n):  # after the last id this shard lacks
        if ranks.shape[0] and ranks[min(ctx[i], ranks.shape[0] - 1)] < 0:
            start = i + 1
    out = np.empty((n - start) * w, np.uint8)
    for i in range(start, n):
        v = ranks[min(ctx[i], ranks.shape[0] - 1)] if ranks.shape[0] else ctx[i]
        for j in range(w):
            out[(i - start) * w + j] = (v >> (8 * (w - 1 - j))) & 0xFF
    return out


def padded_ids(uniq: np.ndarray, lengths: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`continuations`' output as `id_rows` gives it: empty continuations dropped, -1 after each one's end."""
    keep = lengths > 0  # an occurrence at a document's end has nothing to continue with
    uniq, lengths, counts = uniq[keep], lengths[keep], counts[keep]
    uniq[np.arange(uniq.shape[1])[None, :] >= lengths[:, None]] = -1  # one padding for every shard
    return uniq, counts


class _HashingWriter:
    def __init__(self, f):
        self.f = f
        self.h = hashlib.sha256()
        self.size = 0

    def write(self, b):
        mv = memoryview(b)
        self.h.update(mv)
        self.size += mv.nbytes
        return self.f.write(mv)


def write_npy_atomic(path: Path, arr: np.ndarray, *, sync_dir: bool = True) -> dict:
    """Write an .npy atomically; returns {"name", "size", "sha256"} (hashed while writing)."""
    with atomic_file(path, sync_dir=sync_dir) as f:
        w = _HashingWriter(f)
        np.lib.format.write_array(w, np.ascontiguousarray(arr), allow_pickle=False)
    return {"name": path.name, "size": w.size, "sha256": w.h.hexdigest()}


def file_sha256(path: Path, chunk: int = 8 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb", buffering=0) as f:
        buf = bytearray(chunk)
        mv = memoryview(buf)
        while True:
            n = f.readinto(buf)
            if not n:
                break
            h.update(mv[:n])
    return h.hexdigest()


def _open_npy(path: Path, expect: dict | None, shard_id: str, verify: bool):
    """mmap an .npy read-only; returns (mmap, offset, dtype, length). Size and checksum checked first."""
    try:
        st = path.stat()
    except OSError as e:
        raise CorruptShard(shard_id, path.name, f"missing ({e.strerror})") from e
    if expect is not None:
        if st.st_size != expect["size"]:
            raise CorruptShard(shard_id, path.name, f"size {st.st_size} != {expect['size']} (truncated?)")
        if verify and file_sha256(path) != expect["sha256"]:
            raise CorruptShard(shard_id, path.name, "checksum mismatch")
    with open(path, "rb") as f:
        try:
            major, minor = np.lib.format.read_magic(f)
            if (major, minor) == (1, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
            else:
                shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
        except Exception as e:
            raise CorruptShard(shard_id, path.name, f"bad .npy header ({e})") from e
        off = f.tell()
        n = int(shape[0]) if shape else 0
        if len(shape) != 1 or off + n * dtype.itemsize != st.st_size:
            raise CorruptShard(shard_id, path.name, "array length does not match the file size")
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if st.st_size else b""
    return mm, off, dtype, n


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
        mm_t, off_t, dt_t, n_t = _open_npy(directory / ft["name"], ft, sid, verify)
        mm_s, off_s, dt_s, n_s = _open_npy(directory / fs["name"], fs, sid, verify)
        if dt_t != be_dtype(tw) or n_t != n_s or n_t != meta["tokens"]:
            raise CorruptShard(sid, ft["name"], "token array does not match the manifest")
        alpha, names = None, (ft["name"], fs["name"])
        fa = meta["files"].get("alpha")
        if fa is not None:
            mm_a, off_a, dt_a, n_a = _open_npy(directory / fa["name"], fa, sid, True)
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
            self._dead_starts = self._dead_ends = self._dead_tokens = None
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
        return _sa_first(self._tbu, self._sa, self.off, self.width, np.frombuffer(p, np.uint8))

    def find(self, p: bytes, first: int | None = None) -> tuple[int, int]:
        """SA range [lo, hi) of suffixes that start with the pattern bytes p. first: `_first(p)` if known
        (`longest` found it), which saves its binary search."""
        return sa_find(self._tbu, self._sa, self.off, self.width, np.frombuffer(p, np.uint8),
                        -1 if first is None else first)

    def occurs(self, p: bytes) -> bool:
        """Does p occur outside masked documents? (one binary search without masks)"""
        return self._alive_first(p) >= 0

    def _alive_first(self, p: bytes) -> int:
        """`_first(p)` when p occurs outside masked documents, else -1."""
        lo = self._first(p)
        if lo < 0 or not self.dead:
            return lo
        return lo if self.count(p, lo)[0] > 0 else -1

    def _dead_count(self, p: bytes) -> int:
        a = self._dead_tokens
        q = np.frombuffer(p, dtype=be_dtype(self.width)).astype(np.int64)
        n = q.size
        if a is None or a.size < n:
            return 0
        k = a.size - n + 1
        m = a[:k] == q[0]
        for j in range(1, n):
            m &= a[j:j + k] == q[j]
        return int(m.sum())

    def count(self, p: bytes, first: int | None = None) -> tuple[int, int, int]:
        """(alive occurrences, lo, hi) of pattern bytes p. first: as for `find`."""
        lo, hi = self.find(p, first)
        c = hi - lo
        if c and self.dead:
            c -= self._dead_count(p)
        return c, lo, hi

    def longest(self, cb: bytes, n_lo: int, n_hi: int) -> tuple[int, int | None]:
        """(n, first): the largest n in [n_lo, n_hi] whose last n tokens of cb occur (alive), 0 if none, and
        the first SA index of those n tokens (`count`'s `first`: the search then counts them without a
        binary search of its own). Occurrence is monotone in n (an occurrence of a suffix contains its
        shorter suffixes)."""
        if n_hi < n_lo or self.n == 0:
            return 0, None
        if not self.dead:
            n, first = sa_longest(self._tbu, self._sa, self.off, self.width, np.frombuffer(cb, np.uint8),
                                   n_lo, n_hi)
            return (n, first) if n else (0, None)
        w = self.width
        good_at = self._alive_first(cb[-n_lo * w:])
        if good_at < 0:
            return 0, None
        good, bad = n_lo, n_hi + 1
        # gallop from the short end: typical matches are short
        step = 1
        while good + step < bad:
            probe = good + step
            at = self._alive_first(cb[-probe * w:])
            if at >= 0:
                good, good_at = probe, at
                step *= 2
            else:
                bad = probe
                break
        while bad - good > 1:
            mid = (good + bad) // 2
            at = self._alive_first(cb[-mid * w:])
            if at >= 0:
                good, good_at = mid, at
            else:
                bad = mid
        return good, good_at

    def sample(self, lo: int, hi: int, quota: int) -> np.ndarray:
        """Positions of up to `quota` occurrences spread evenly over SA[lo:hi] (all when they fit),
        in suffix-array order, masked documents removed."""
        if not self.dead:
            return _sa_sample(self._sa, lo, hi, quota)
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
        uniq, lengths, counts = _distinct_rows(self._tbu, self.off, self.width, self.n, self.sentinel,
                                               np.asarray(pos, dtype=np.int64), n, max_len)
        if self.alpha is not None:  # ranks -> ids; padding past a document's end is cut by `lengths`
            uniq = self.alpha[np.minimum(uniq, self.alpha.size - 1)]
        return uniq, lengths, counts

    def kernel_view(self) -> tuple:
        """The compiled search's view of this shard: (token bytes uint8, off, width, tokens, sentinel, suffix
        array, alphabet int64 or empty)."""
        return (self._tbu, self.off, self.width, self.n, self.sentinel, self._sa,
                _NO_ALPHA if self.alpha is None else self.alpha)

    def id_rows(self, lo: int, hi: int, quota: int, n: int, max_len: int) -> tuple[np.ndarray, np.ndarray]:
        """A search's take from this shard: the distinct non-empty continuations (ids) of up to `quota`
        occurrences spread over SA[lo:hi], each a match of length n: (rows [u, max_len] int64 padded with -1,
        counts [u] int64), in SA order. max_len > 0."""
        if not self.dead:  # one compiled call
            return id_rows_kernel(*self.kernel_view(), lo, hi, quota, n, max_len)
        return padded_ids(*self.continuations(self.sample(lo, hi, quota), n, max_len))

    def prefault(self) -> None:
        """Map every page of the shard's files into this process now (from the page cache, or read from disk).
        Without it, a search's first visits to a region fault pages in one by one: a cold corpus search
        samples 256 occurrences over the whole suffix array, each on its own page, and took 1-3 ms instead
        of 0.1-0.3 ms in the first pass over a replay. A hint: a kernel without MADV_POPULATE_READ (5.14)
        gets the asynchronous MADV_WILLNEED read-ahead instead, and an in-memory shard has nothing to do."""
        for m in {id(m): m for m in (_mapping_of(self.tb), _mapping_of(self.sa)) if m is not None}.values():
            for advice in (_MADV_POPULATE_READ, getattr(mmap, "MADV_WILLNEED", None)):
                try:
                    if advice is not None:
                        m.madvise(advice)
                        break
                except (OSError, ValueError):
                    continue

    def bytes_on_disk(self, directory: Path | None) -> int:
        if directory is None:
            return 0
        return sum((directory / f).stat().st_size for f in self.files if (directory / f).exists())


_MADV_POPULATE_READ = getattr(mmap, "MADV_POPULATE_READ", 22)  # Linux >= 5.14; Python 3.11 does not name it


def _mapping_of(obj) -> mmap.mmap | None:
    """The mmap under an array or buffer (numpy array -> memoryview -> mmap), or None (in memory)."""
    for _ in range(4):
        if isinstance(obj, mmap.mmap):
            return obj
        obj = getattr(obj, "base", None) if isinstance(obj, np.ndarray) else getattr(obj, "obj", None)
    return None


def _suffix_array_be16(be: np.ndarray) -> np.ndarray:
    """Suffix array of big-endian 2-byte tokens, sorting their bytes as pydivsufsort does for uint16 input
    (a token suffix is a byte suffix at an even offset), but keeping the even offsets in place: pydivsufsort
    first copies the tokens to swap their bytes and then filters with whole-array temporaries, about 22 bytes
    per token at the peak; this peaks at the 8 bytes per token of the byte-level array."""
    from pydivsufsort import divsufsort

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
                ends = _grown(ends, 2 * k)
            ends[k] = i
            k += 1
    return best, ends[:k] - best + 1


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
