"""The sources' compiled loops (rest_lsp/engine/kernels_sources.py) against the numpy code they replaced
(kept here as the reference): the same arrays, dtypes, row order and float weights, bit for bit."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
from hypothesis import given, settings, strategies as st

from rest_lsp.engine.sources import (ContextSource, HistorySource, RecyclingSource, continuation_rows,
                                     merge_levels, suffix_match_arrays, suffix_matches)
from rest_lsp.engine.trie import PAD


# ---- the numpy reference (sources.py before the kernels) -------------------------------------------------
def ref_suffix_match_arrays(text, query, n_max, limit, exclude_end=False):
    none = np.zeros(0, dtype=np.int64)
    if len(text) < 2 or len(query) == 0:
        return none, none
    ends = np.flatnonzero(text[:-1] == query[-1])
    if exclude_end:
        ends = ends[ends < len(text) - 1]
    if len(ends) == 0:
        return none, none
    lengths = np.ones(len(ends), dtype=np.int64)
    alive = np.arange(len(ends))
    for k in range(1, min(n_max, len(query))):
        pos = ends[alive] - k
        ok = pos >= 0
        ok[ok] = text[pos[ok]] == query[-1 - k]
        alive = alive[ok]
        if not len(alive):
            break
        lengths[alive] += 1
    order = np.lexsort((-ends, -lengths))[:limit]
    return lengths[order], ends[order]


def ref_continuation_rows(text, ends, max_len):
    idx = ends[:, None] + 1 + np.arange(max_len)[None, :]
    rows = text[np.minimum(idx, len(text) - 1)]
    cut = np.logical_or.accumulate((idx >= len(text)) | (rows < 0), axis=1)
    rows[cut] = PAD
    return rows


def ref_propose_rows(src, context, max_len):
    """_MatchingSource.propose_rows as it was: (rows, weights, last_match_len)."""
    ctx = np.asarray(context, dtype=np.int64)
    query = ctx[-src.n_max:]
    lengths, rows = [], []
    for text, is_context in src._texts(ctx):
        n, ends = ref_suffix_match_arrays(text, query, src.n_max, src.max_matches, is_context)
        if len(n):
            lengths.append(n)
            rows.append(ref_continuation_rows(text, ends, max_len))
    if not lengths:
        return np.full((0, max(0, max_len)), PAD, dtype=np.int64), np.zeros(0), 0
    n = np.concatenate(lengths) if len(lengths) > 1 else lengths[0]
    order = np.argsort(-n, kind="stable")[: src.max_matches]
    n = n[order]
    rows = (np.concatenate(rows) if len(rows) > 1 else rows[0])[order]
    keep = rows[:, 0] != PAD if max_len > 0 else np.zeros(len(n), dtype=bool)
    return rows[keep], (n[keep] * n[keep]).astype(np.float64), int(n[0])


def ref_merge_levels(levels, max_continuations, max_len):
    out_rows = out_w = None
    for n_level, res in levels:
        rows, w = res.rows[:max_continuations], res.weights[:max_continuations]
        if rows.shape[1] == 0:
            continue
        keep = rows[:, 0] != PAD
        if not keep.all():
            rows, w = rows[keep], w[keep]
        total = sum(w.tolist())
        if not total > 0:
            continue
        part = float(n_level * n_level) * w / total
        if out_rows is None:
            out_rows, out_w = rows, part
            continue
        same = (rows[:, None, :] == out_rows[None, :, :]).all(axis=2)
        seen = same.any(axis=1)
        if seen.any():
            out_w = out_w.copy()
            np.add.at(out_w, same[seen].argmax(axis=1), part[seen])
        out_rows = np.concatenate([out_rows, rows[~seen]])
        out_w = np.concatenate([out_w, part[~seen]])
    if out_rows is None:
        return np.full((0, max(0, max_len)), PAD, dtype=np.int64), np.zeros(0)
    return out_rows, out_w


def assert_same(got, want):
    """Equal arrays of the same dtype and shape, floats bit for bit."""
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape, (g.dtype, w.dtype, g.shape, w.shape)
        assert g.tobytes() == w.tobytes(), (g, w)


# ---- strategies --------------------------------------------------------------------------------------
tokens = st.lists(st.integers(0, 3), max_size=40)  # a small vocabulary: many matches, many ties
texts_with_separators = st.lists(st.sampled_from([0, 1, 2, 3, -1]), max_size=40)


# ---- suffix_match_arrays / continuation_rows ---------------------------------------------------------
@settings(max_examples=300, deadline=None)
@given(text=texts_with_separators, query=tokens, n_max=st.integers(0, 8), limit=st.integers(-3, 20),
       max_len=st.integers(-1, 6), exclude_end=st.booleans())
def test_suffix_match_arrays_and_rows_equal_numpy(text, query, n_max, limit, max_len, exclude_end):
    text, query = np.array(text, dtype=np.int64), np.array(query, dtype=np.int64)
    got = suffix_match_arrays(text, query, n_max, limit, exclude_end)
    want = ref_suffix_match_arrays(text, query, n_max, limit, exclude_end)
    assert_same(got, want)
    if len(text):
        ends = want[1]
        assert_same([continuation_rows(text, ends, max_len)], [ref_continuation_rows(text, ends, max_len)])


def test_suffix_matches_edge_cases():
    q = np.array([1, 2], dtype=np.int64)
    assert suffix_matches(np.zeros(0, np.int64), q, 8, 4, 16) == []  # empty text
    assert suffix_matches(np.array([2], np.int64), q, 8, 4, 16) == []  # one token: nothing follows
    assert suffix_matches(np.array([5, 1, 2], np.int64), q, 8, 4, 16) == []  # only at the end: no continuation
    # a query longer than the text: the match stops at the text's start
    assert suffix_matches(np.array([2, 7], np.int64), np.array([9, 9, 1, 2], np.int64), 8, 4, 16) == [(1, 0)]
    assert suffix_matches(np.array([1, 2, 7], np.int64), q, 8, 4, 16, exclude_end=True) == [(2, 1)]
    # equal lengths: latest first, and limit cuts after the order
    text = np.array([2, 5, 2, 6, 2, 7, 1, 2, 8], np.int64)
    assert suffix_matches(text, q, 8, 4, 16) == [(2, 7), (1, 4), (1, 2), (1, 0)]
    assert suffix_matches(text, q, 8, 4, 2) == [(2, 7), (1, 4)]
    assert suffix_matches(text, q, 1, 4, 16) == [(1, 7), (1, 4), (1, 2), (1, 0)]  # n_max caps the length


def test_continuation_rows_stop_at_separators_and_the_end():
    text = np.array([1, 2, 3, -1, 4, 1, 5], np.int64)
    rows = continuation_rows(text, np.array([0, 4, 5], np.int64), 4)
    assert rows.tolist() == [[2, 3, PAD, PAD], [1, 5, PAD, PAD], [5, PAD, PAD, PAD]]


# ---- the matching sources ----------------------------------------------------------------------------
@settings(max_examples=200, deadline=None)
@given(context=tokens, buffers=st.lists(texts_with_separators, max_size=4), n_max=st.integers(1, 8),
       max_matches=st.integers(1, 6), max_len=st.integers(-1, 6))
def test_context_source_rows_equal_numpy(context, buffers, n_max, max_matches, max_len):
    src = ContextSource(n_max=n_max, max_matches=max_matches)
    for i, b in enumerate(buffers):
        src.set_buffer(f"b{i}", b)
    rows, weights, n = ref_propose_rows(src, context, max_len)
    assert_same(src.propose_rows(context, max_len), (rows, weights))
    assert src.last_match_len == n


@settings(max_examples=200, deadline=None)
@given(generations=st.lists(tokens, max_size=5), context=tokens, n_max=st.integers(1, 8),
       max_matches=st.integers(1, 6), max_len=st.integers(0, 6), capacity=st.integers(1, 50))
def test_history_source_rows_equal_numpy(generations, context, n_max, max_matches, max_len, capacity):
    src = HistorySource(n_max=n_max, max_matches=max_matches, capacity=capacity)
    for g in generations:  # separators between generations, the ring buffer halved when full
        src.begin(())
        src.observe(g)
    rows, weights, n = ref_propose_rows(src, context, max_len)
    assert_same(src.propose_rows(context, max_len), (rows, weights))
    assert src.last_match_len == n


def test_context_source_follows_buffer_changes():
    src = ContextSource(n_max=4)
    ctx = [7, 1, 2]
    src.set_buffer("a", [1, 2, 30, 31])
    assert src.propose(ctx, 2) == [((30, 31), 4.0)]
    src.set_buffer("a", [1, 2, 40])  # replaced: the joined buffers are rebuilt
    src.set_buffer("b", [2, 50])
    assert src.propose(ctx, 2) == [((40,), 4.0), ((50,), 1.0)]
    src.drop_buffer("a")
    assert src.propose(ctx, 2) == [((50,), 1.0)]
    src.buffers = {}  # as the benchmarks reset it
    assert src.propose(ctx, 2) == []


def test_matches_never_run_across_buffers():
    # joined, "1 2" would span buffers a and b and "2 9" would continue into c
    src = ContextSource(n_max=4)
    src.set_buffer("a", [5, 1])
    src.set_buffer("b", [2, 9])
    src.set_buffer("c", [8, 8])
    assert src.propose([1, 2], 3) == [((9,), 1.0)]
    assert src.last_match_len == 1


# ---- merge_levels ------------------------------------------------------------------------------------
@st.composite
def levels(draw):
    width = draw(st.integers(0, 3))
    out = []
    for _ in range(draw(st.integers(0, 3))):
        n = draw(st.integers(1, 16))
        # distinct rows per level, as a search gives; a row may start with PAD (an empty continuation)
        cells = st.tuples(*[st.integers(-1, 2)] * width)
        rows = draw(st.lists(cells, unique=True, max_size=8))
        w = draw(st.lists(st.sampled_from([0.0, 0.1, 0.3, 1.0 / 3.0, 2.5, 7.0]), min_size=len(rows),
                          max_size=len(rows)))
        r = np.array(rows, dtype=np.int64).reshape(len(rows), width)
        weights = np.array(w, dtype=np.float64)
        r.flags.writeable = weights.flags.writeable = False  # as indexer.types.SearchRows holds them
        out.append((n, SimpleNamespace(rows=r, weights=weights)))
    return out


@settings(max_examples=400, deadline=None)
@given(levels=levels(), max_continuations=st.integers(-2, 8), max_len=st.integers(-1, 4))
def test_merge_levels_equals_numpy(levels, max_continuations, max_len):
    assert_same(merge_levels(levels, max_continuations, max_len),
                ref_merge_levels(levels, max_continuations, max_len))


def test_merge_levels_sums_a_row_found_at_two_levels():
    a = SimpleNamespace(rows=np.array([[1, 2], [3, PAD]], np.int64), weights=np.array([3.0, 1.0]))
    b = SimpleNamespace(rows=np.array([[4, 4], [1, 2]], np.int64), weights=np.array([1.0, 1.0]))
    rows, w = merge_levels([(3, a), (2, b)], 32, 2)
    assert rows.tolist() == [[1, 2], [3, PAD], [4, 4]]
    assert w.tolist() == [9 * 0.75 + 4 * 0.5, 9 * 0.25, 4 * 0.5]


# ---- RecyclingSource: lookups on a carried tuple tail, as the list-building lookups did --------------
def ref_recycling_propose(src, context, max_len):
    """RecyclingSource.propose as it was: the lookup key rebuilt from context + path at every node."""
    if not context:
        return []
    out = []
    base = [int(t) for t in context[-src.order:]]
    last = min(src.depth, max_len)

    def lookup(tail):
        for n in range(min(src.order, len(tail)), 0, -1):
            hit = src.table.get(tuple(tail[-n:]))
            if hit:
                return hit
        return ()

    def expand(path, weight, level):
        nxt = lookup(base + list(path)) if level < last else ()
        width = src.branching[level] if level < len(src.branching) else 1
        if not nxt:
            if path:
                out.append((path, weight))
            return
        for rank, tok in enumerate(nxt[:width]):
            expand(path + (tok,), weight / (rank + 1), level + 1)

    expand((), 1.0, 0)
    return out


@settings(max_examples=200, deadline=None)
@given(forwards=st.lists(st.tuples(st.lists(st.integers(0, 4), min_size=1, max_size=6), st.integers(0, 9)),
                         max_size=6),
       context=st.lists(st.integers(0, 4), max_size=6), order=st.integers(1, 4), depth=st.integers(0, 5),
       max_len=st.integers(0, 6))
def test_recycling_propose_equals_the_list_lookups(forwards, context, order, depth, max_len):
    src = RecyclingSource(k=3, depth=depth, order=order)
    for tokens, seed in forwards:  # chains of verified rows, each with the model's top 3 (an empty one too)
        src.observe(tokens[:1])
        topk = np.random.default_rng(seed).integers(0, 5, (len(tokens), 3)).tolist()
        if seed == 0:
            topk[-1] = []
        src.observe_forward(tokens, topk)
    want = ref_recycling_propose(src, context, max_len)
    assert src.propose(context, max_len) == want
    assert_same(src.propose_rows(context, max_len), padded(want))


def test_recycling_follows_the_longest_key_down_the_tree():
    src = RecyclingSource(k=2, depth=3, branching=(2, 1), order=2)
    src.begin([1])
    src.observe_forward([1, 2], [[2, 3], [4, 5]])  # after "1": 2 or 3; after "1 2" and "2": 4 or 5
    src.begin([5, 2])
    src.observe_forward([2], [[9]])  # after "5 2" and "2": 9
    assert src.table[(2,)] == (9,) and src.table[(1, 2)] == (4, 5)
    props = src.propose([1], 3)
    assert props == ref_recycling_propose(src, [1], 3)
    assert props == [((2, 4), 1.0), ((3,), 0.5)]  # after "1 2" the longer key's 4, not "2"'s 9


def padded(conts):
    """RecyclingSource.propose_rows' arrays for these continuations."""
    if not conts:
        return np.zeros((0, 0), dtype=np.int64), np.zeros(0)
    width = max(len(t) for t, _ in conts)
    return (np.array([t + (PAD,) * (width - len(t)) for t, _ in conts], dtype=np.int64),
            np.array([w for _, w in conts], dtype=np.float64))
