"""One search over a snapshot of shards: the longest suffix of the context that any shard holds, its
occurrences counted per shard, a sample of them spread over each shard's match range, their continuations
merged over the shards with each shard's weight, and ranked. A store of one shard without masked documents
(a corpus, a repository in one shard) is searched in one compiled call."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from restbase.jit import njit

from .kernels import encode_kernel, id_rows_kernel, padded_ids, rank_order_kernel, sa_find, sa_longest
from .shard import Shard
from .types import SearchRows


def search_context(context: Sequence[int], n_max: int, sentinel: int) -> np.ndarray:
    """The last n_max tokens of the context [<= n_max] int64, after the last one no shard can hold (out of
    range). A few calls, not one per token: right after a CPU forward pass each costs 0.02-0.06 ms."""
    tail = np.ascontiguousarray(context[-n_max:], dtype=np.int64)  # n_max > 0
    return tail[_in_range_from(tail, sentinel):]


def search_shards(shards: tuple, ctx_a: np.ndarray, n_min: int, k: int, max_len: int, limit: int | None,
                  first_k: bool) -> SearchRows:
    """`Datastore.search_rows` over these shards, for a context from `search_context`."""
    lim = -1 if limit is None else max(0, limit)
    if len(shards) == 1 and _compiled_whole(shards[0]) and not first_k and k > 0 and max_len > 0:
        # the common case (a corpus, a repository in one shard): the whole search in one compiled call.
        # Right after a CPU forward pass every Python and numpy call runs from cold caches (0.05-0.1 ms
        # each), and the path below makes about twenty of them: docs/engine.md
        sh = shards[0]
        return SearchRows(*one_shard_search(*sh.kernel_view(), sh.rank_table(), ctx_a, n_min, k, max_len,
                                             float(sh.weight), lim))
    best, hits = _longest_match(shards, ctx_a, n_min)
    if best == 0:
        return SearchRows.empty(max_len=max_len)
    info = []
    total = 0
    for sh, cb, first in hits:
        c, lo, hi = sh.count(cb[-best * sh.width:], first)
        if c > 0:
            info.append((sh, c, lo, hi))
            total += c
    if k <= 0 or max_len <= 0:
        return SearchRows.empty(best, total, max_len)
    if len(info) == 1 and not first_k and _compiled_whole(info[0][0]):
        # the common case (the corpus alone holds the match): sample to ranking in one compiled call
        sh, c, lo, hi = info[0]
        quota = (hi - lo) if total <= k else max(1, round(k * c / total))
        return SearchRows(best, total, *_one_shard_ranked(*sh.kernel_view(), lo, hi, quota, best, max_len,
                                                          float(sh.weight), lim))
    rows, counts, weights = _continuations(info, total, best, k, max_len, first_k)
    return SearchRows(best, total, *_ranked(rows, counts, weights, lim))


def _compiled_whole(sh) -> bool:
    """Can one compiled call search this shard (a suffix-array shard without masked documents)?"""
    return isinstance(sh, Shard) and not sh.dead


@njit
def _in_range_from(ctx, sentinel):
    """Where the ids after the last one outside [0, sentinel) begin."""
    for i in range(ctx.shape[0] - 1, -1, -1):
        if ctx[i] < 0 or ctx[i] >= sentinel:
            return i + 1
    return 0


def _longest_match(shards, ctx_a: np.ndarray, n_min: int) -> tuple[int, list]:
    """The longest suffix of the context (at least n_min tokens) found in any shard, and the shards holding
    it with the context in each one's encoding and the first SA index of the match (`Shard.longest`):
    (length, [(shard, encoded context, first)]); (0, []) if none."""
    enc: dict = {}
    best, hits = 0, []
    for sh in shards:
        key = sh.width if sh.alpha is None else id(sh.alpha)
        cb = enc.get(key)
        if cb is None:
            cb = enc[key] = sh.encode(ctx_a)
        nl, first = sh.longest(cb, max(n_min, best), len(cb) // sh.width)
        if nl == 0:
            continue
        if nl > best:
            best, hits = nl, [(sh, cb, first)]
        else:
            hits.append((sh, cb, first))
    return best, hits


def _continuations(info: list, total: int, best: int, k: int, max_len: int, first_k: bool):
    """Up to k occurrences' continuations over the shards' match ranges `info` [(shard, count, lo, hi)],
    distinct: (rows [u, max_len] padded with -1, counts [u] int64, weights [u] float64)."""
    rows_l, cnt_l, wts_l = [], [], []
    left = k
    for sh, c, lo, hi in info:
        if first_k:
            if left <= 0:
                break
            pos = sh.first(lo, hi, left)
            left -= int(pos.size)
            uniq, counts = padded_ids(*sh.continuations(pos, best, max_len))
        else:
            quota = (hi - lo) if total <= k else max(1, round(k * c / total))
            uniq, counts = sh.id_rows(lo, hi, quota, best, max_len)
        rows_l.append(uniq)
        cnt_l.append(counts)
        wts_l.append(counts * float(sh.weight))
    if len(rows_l) == 1:  # distinct already
        return rows_l[0], cnt_l[0], wts_l[0]
    # the same continuation from several shards: one entry, counts and weights summed
    rows, inv = np.unique(np.concatenate(rows_l), axis=0, return_inverse=True)
    inv = inv.reshape(-1)
    counts = np.bincount(inv, weights=np.concatenate(cnt_l), minlength=len(rows)).astype(np.int64)
    weights = np.bincount(inv, weights=np.concatenate(wts_l), minlength=len(rows))
    return rows, counts, weights


@njit
def _ranked(rows, counts, weights, limit):
    """The continuations heaviest first, then most frequent, then by tokens: the first `limit` (-1: all) of
    (rows [u, max_len] int64, counts [u] int64, weights [u] float64)."""
    order = rank_order_kernel(rows, counts, weights)
    m = order.shape[0] if limit < 0 else min(limit, order.shape[0])
    out_rows = np.empty((m, rows.shape[1]), np.int64)
    out_counts = np.empty(m, np.int64)
    out_weights = np.empty(m, np.float64)
    for i in range(m):
        out_rows[i] = rows[order[i]]
        out_counts[i] = counts[order[i]]
        out_weights[i] = weights[order[i]]
    return out_rows, out_counts, out_weights


@njit
def _one_shard_ranked(tb, off, w, n_tok, sentinel, sa, alpha, lo, hi, quota, n, max_len, weight, limit):
    """`_ranked` of one shard's `Shard.id_rows` (no masked documents; arguments as `Shard.kernel_view`)."""
    rows, counts = id_rows_kernel(tb, off, w, n_tok, sentinel, sa, alpha, lo, hi, quota, n, max_len)
    return _ranked(rows, counts, counts * weight, limit)


@njit
def one_shard_search(tb, off, w, n_tok, sentinel, sa, alpha, ranks, ctx, n_min, k, max_len, weight, limit):
    """`search_shards` over one shard without masked documents (k > 0, max_len > 0; arguments as
    `Shard.kernel_view`, then `Shard.rank_table`): (match length, count, rows, counts, weights)."""
    cb = encode_kernel(ranks, w, ctx)
    n_hi = cb.shape[0] // w
    no_dead = np.zeros(0, np.int64)
    best, first = sa_longest(tb, sa, off, w, cb, n_min, n_hi, no_dead) if n_hi >= n_min else (0, -1)
    if best == 0:
        return 0, 0, np.full((0, max_len), -1, np.int64), np.zeros(0, np.int64), np.zeros(0, np.float64)
    lo, hi = sa_find(tb, sa, off, w, cb[cb.shape[0] - best * w:], first)
    rows, counts, weights = _one_shard_ranked(tb, off, w, n_tok, sentinel, sa, alpha, lo, hi, min(hi - lo, k), best,
                                              max_len, weight, limit)
    return best, hi - lo, rows, counts, weights
