"""The compiled search over one suffix-array shard: binary searches for a pattern, the longest match (one
gallop), sampling occurrences, their distinct continuations, ranking them, and encoding a context in a shard's
storage. numba (restbase/jit.py) compiles them over the token bytes viewed as uint8: comparing big-endian bytes
compares tokens (indexer/layout.py), and numba cannot read a big-endian array. A lookup costs ~26 steps at 50M
tokens.

Arguments as `Shard.kernel_view` gives them: tb the token bytes (uint8, big-endian tokens from `off`), sa the
suffix array, w bytes per token, p / cb pattern bytes (uint8), dead the tokens of masked documents (each
followed by a sentinel; empty when none is masked). A suffix compares with a pattern as `bytes` slices do: a
suffix that ends before the pattern does (the last sentinel's) is smaller.
"""
from __future__ import annotations

import numpy as np

from restbase.jit import njit

NO_ALPHA = np.zeros(0, np.int64)  # `id_rows_kernel`'s alphabet for a shard that stores ids
NO_DEAD = np.zeros(0, np.int64)   # the masked documents' tokens of a shard without any


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
def sa_first(tb, sa, off, w, p) -> int:
    """The first SA index whose suffix starts with p, or -1."""
    n = sa.shape[0]
    lo = _sa_lower(tb, sa, off, w, p, 0, n)
    if lo >= n or _cmp_at(tb, off + sa[lo] * w, p) != 0:
        return -1
    return lo


@njit
def sa_find(tb, sa, off, w, p, first):
    """(lo, hi): the SA range of suffixes that start with p; first: `sa_first` if known, else -1."""
    lo = sa_first(tb, sa, off, w, p) if first < 0 else first
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
def _token_at(tb, off, w, n_tok, i) -> int:
    """Token i of the big-endian bytes; past the end, the last one (a sentinel), as numpy's take(mode="clip")."""
    s = off + min(i, n_tok - 1) * w
    v = 0
    for j in range(w):
        v = (v << 8) | tb[s + j]
    return v


@njit
def dead_count(dead, p, w) -> int:
    """Occurrences of the pattern inside masked documents: `dead` holds their tokens, each document followed by
    a sentinel, so no occurrence spans two of them."""
    n = p.shape[0] // w
    q = np.empty(n, np.int64)
    for j in range(n):
        q[j] = _token_at(p, 0, w, n, j)
    found = 0
    for i in range(dead.shape[0] - n + 1):
        j = 0
        while j < n and dead[i + j] == q[j]:
            j += 1
        found += j == n
    return found


@njit
def alive_first(tb, sa, off, w, p, dead) -> int:
    """`sa_first(p)` when p occurs outside masked documents, else -1."""
    lo = sa_first(tb, sa, off, w, p)
    if lo < 0 or dead.shape[0] == 0:
        return lo
    lo, hi = sa_find(tb, sa, off, w, p, lo)
    return lo if hi - lo - dead_count(dead, p, w) > 0 else -1


@njit
def sa_longest(tb, sa, off, w, cb, n_lo, n_hi, dead):
    """(n, first): the largest n in [n_lo, n_hi] whose last n tokens of cb occur outside masked documents,
    and the first SA index of those n tokens; (0, -1) if none. Occurrence is monotone in n (an occurrence of a
    suffix contains its shorter suffixes), so a gallop from the short end (typical matches are short), then a
    bisection of the last step."""
    good_at = alive_first(tb, sa, off, w, _last(cb, n_lo, w), dead)
    if good_at < 0:
        return 0, -1
    good, bad = n_lo, n_hi + 1
    step = 1
    while good + step < bad:
        probe = good + step
        at = alive_first(tb, sa, off, w, _last(cb, probe, w), dead)
        if at >= 0:
            good, good_at = probe, at
            step *= 2
        else:
            bad = probe
            break
    while bad - good > 1:
        mid = (good + bad) // 2
        at = alive_first(tb, sa, off, w, _last(cb, mid, w), dead)
        if at >= 0:
            good, good_at = mid, at
        else:
            bad = mid
    return good, good_at


@njit
def sa_sample(sa, lo, hi, quota):
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
def grown(a, size):
    """a's first rows in a new array of `size` rows (the rest uninitialized)."""
    out = np.empty((size,) + a.shape[1:], a.dtype)
    out[:a.shape[0]] = a
    return out


@njit
def same_row(a, i, b, k) -> bool:
    for j in range(a.shape[1]):
        if a[i, j] != b[k, j]:
            return False
    return True


@njit
def distinct_rows(tb, off, w, n_tok, sentinel, pos, n, max_len):
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
        if u > 0 and same_row(rows, u, rows, u - 1):
            counts[u - 1] += 1
            continue
        lengths[u], counts[u] = length, 1
        u += 1
        if u == rows.shape[0]:
            size = min(2 * size, pos.shape[0] + 1)
            rows, lengths, counts = grown(rows, size), grown(lengths, size), grown(counts, size)
    return rows[:u], lengths[:u], counts[:u]


@njit
def id_rows_kernel(tb, off, w, n_tok, sentinel, sa, alpha, lo, hi, quota, n, max_len):
    """What a search takes from one shard without masked documents: the distinct non-empty continuations of
    up to `quota` sampled occurrences in SA[lo:hi], in token ids: (rows [u, max_len] int64 padded with -1,
    counts [u] int64), in SA order. alpha: the shard's alphabet (ranks -> ids), empty when tokens are ids."""
    pos = sa_sample(sa, lo, hi, quota)
    rows, lengths, counts = distinct_rows(tb, off, w, n_tok, sentinel, pos, n, max_len)
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
