"""Compiled loops of the draft sources (rest_lsp/engine/sources.py): suffix matching with the continuation
rows, and the datastore's level merge.

Each drafting step asks the context, history and datastore sources for rows; in numpy each answer was a few
dozen small calls (masks, gathers, a lexsort, concatenations) whose dispatch cost far more than the few
hundred tokens they touch. These loops give the same arrays, row order and float weights in one call.

A text is a span text[lo:hi] of a token array: the context source keeps its open buffers joined in one
array with bounds, so a step passes two arrays however many buffers are open.
"""
from __future__ import annotations

import numpy as np

from restbase.jit import njit

from .trie import PAD  # a global int: numba compiles it in as a constant


@njit
def slice_len(n, limit):
    """len(range(n)[:limit]): how many of n items a Python slice [:limit] keeps (negative limits too)."""
    if limit < 0:
        return max(n + limit, 0)
    return min(n, limit)


@njit
def _scan(text, lo, hi, query, cap, lengths, ends):
    """Matches of a suffix of query (len >= 1) in text[lo:hi], latest first, written to lengths/ends [>= hi-lo].

    A match ends at `end` (text[end] == query[-1]) with a following token inside the span; its length n
    counts the tokens matched backwards, at most cap, never before lo. Returns how many were written."""
    q = len(query)
    last = query[q - 1]
    m = 0
    for end in range(hi - 2, lo - 1, -1):
        if text[end] != last:
            continue
        n = 1
        while n < cap and end - n >= lo and text[end - n] == query[q - 1 - n]:
            n += 1
        lengths[m] = n
        ends[m] = end
        m += 1
    return m


@njit
def _longest_first(lengths, top, limit):
    """Indices into lengths [m] (each in 1..top) longest first, equal lengths in their given order, cut to
    a Python slice's [:limit]. A counting sort: lengths are short (at most the query), matches many."""
    starts = np.zeros(top + 2, np.int64)
    for n in lengths:
        starts[n] += 1
    acc = 0
    for n in range(top, 0, -1):
        c = starts[n]
        starts[n] = acc
        acc += c
    keep = slice_len(len(lengths), limit)
    order = np.empty(keep, np.int64)
    for i in range(len(lengths)):
        p = starts[lengths[i]]
        starts[lengths[i]] = p + 1
        if p < keep:
            order[p] = i
    return order


@njit
def _fill_row(text, end, hi, max_len, out, r):
    """out[r] = the tokens after text[end], PAD from the span's end (hi) or a negative token (a separator) on."""
    j = 0
    while j < max_len:
        p = end + 1 + j
        if p >= hi or text[p] < 0:
            break
        out[r, j] = text[p]
        j += 1
    while j < max_len:
        out[r, j] = PAD
        j += 1


@njit
def suffix_match_arrays(text, query, n_max, limit):
    """(lengths [m], ends [m]) int64 of suffix matches of query in text, longest then latest first, the first
    `limit` (sources.suffix_match_arrays)."""
    lengths = np.empty(len(text), np.int64)
    ends = np.empty(len(text), np.int64)
    if len(query) == 0:
        return lengths[:0], ends[:0]
    cap = min(n_max, len(query))
    m = _scan(text, 0, len(text), query, cap, lengths, ends)
    order = _longest_first(lengths[:m], max(cap, 1), limit)
    return lengths[order], ends[order]


@njit
def continuation_rows(text, ends, max_len):
    """[m, max(0, max_len)] the tokens after each end in text (sources.continuation_rows)."""
    width = max(0, max_len)
    rows = np.empty((len(ends), width), text.dtype)
    for r in range(len(ends)):
        _fill_row(text, ends[r], len(text), width, rows, r)
    return rows


@njit
def _text_matches(text, lo, hi, query, cap, top, limit, t, lengths, ends, texts, count):
    """Append text t's (= text[lo:hi]) first `limit` matches, longest then latest first, at [count:];
    returns the new count."""
    m = _scan(text, lo, hi, query, cap, lengths[count:], ends[count:])
    order = _longest_first(lengths[count:count + m], top, limit)
    k = len(order)
    kept_lengths = lengths[count:count + m][order]
    kept_ends = ends[count:count + m][order]
    lengths[count:count + k] = kept_lengths
    ends[count:count + k] = kept_ends
    texts[count:count + k] = t
    return count + k


@njit
def match_rows(first, rest, bounds, query, n_max, limit, max_len):
    """The continuations after suffix matches of query in several texts (sources._MatchingSource).

    first [a]: text 0; rest [b] with bounds [T+1] (bounds[0] == 0): text t is rest[bounds[t-1]:bounds[t]].
    Each text's first `limit` matches (longest then latest), then over all texts the first `limit` longest
    (texts in order among equals); the rows not starting with a token (max_len <= 0, a separator) are dropped.
    Returns (rows [k, max(0, max_len)] int64 PAD-padded, weights [k] float64 n^2, the first match's length n
    or 0 when there is none)."""
    width = max(0, max_len)
    size = len(first) + len(rest)
    lengths = np.empty(size, np.int64)
    ends = np.empty(size, np.int64)
    texts = np.empty(size, np.int64)
    count = 0
    cap = min(n_max, len(query))
    top = max(cap, 1)
    if len(query) > 0:
        count = _text_matches(first, 0, len(first), query, cap, top, limit, 0, lengths, ends, texts, count)
        for t in range(1, len(bounds)):
            count = _text_matches(rest, bounds[t - 1], bounds[t], query, cap, top, limit, t, lengths, ends,
                                  texts, count)
    order = _longest_first(lengths[:count], top, limit)
    match_len = lengths[order[0]] if len(order) else 0
    rows = np.empty((len(order), width), np.int64)
    weights = np.empty(len(order), np.float64)
    k = 0
    for i in order:
        t = texts[i]
        if t == 0:
            _fill_row(first, ends[i], len(first), width, rows, k)
        else:
            _fill_row(rest, ends[i], bounds[t], width, rows, k)
        if width > 0 and rows[k, 0] != PAD:
            weights[k] = float(lengths[i] * lengths[i])  # sources.weight_for_match
            k += 1
    return rows[:k], weights[:k], match_len


@njit
def _same_row(a, i, b, j):
    for c in range(a.shape[1]):
        if a[i, c] != b[j, c]:
            return False
    return True


@njit
def add_level(out_rows, out_w, rows, weights, n_level, limit):
    """One match level merged into the rows so far (sources.merge_levels).

    out_rows [u, L] int64, out_w [u] float64: the distinct rows so far (u == 0: any L); rows [c, L],
    weights [c]: the level's, heaviest first. Of its first `limit` rows, those starting with a token are
    weighted n_level^2 * w / total (total: their weights summed in order, the float a Python sum gives) and
    added: a row seen before adds its part to that row's weight, a new one is appended. A level with no
    positive total leaves the rows as they were.
    Returns new (rows [u', L], weights [u'])."""
    c = slice_len(len(rows), limit)
    total = 0.0
    for i in range(c):
        if rows[i, 0] != PAD:
            total += weights[i]
    if not total > 0:
        return out_rows, out_w
    u = len(out_rows)
    if u and rows.shape[1] != out_rows.shape[1]:
        raise ValueError("match levels with different row widths")
    scale = float(n_level * n_level)  # sources.weight_for_match
    new_rows = np.empty((u + c, rows.shape[1]), np.int64)
    new_w = np.empty(u + c, np.float64)
    if u:
        new_rows[:u] = out_rows
        new_w[:u] = out_w
    k = u
    for i in range(c):
        if rows[i, 0] == PAD:
            continue
        part = scale * weights[i] / total
        seen = False
        for j in range(u):  # a level's rows are distinct: a row equals at most one row found before
            if _same_row(rows, i, out_rows, j):
                new_w[j] += part
                seen = True
                break
        if not seen:
            new_rows[k] = rows[i]
            new_w[k] = part
            k += 1
    return new_rows[:k], new_w[:k]
