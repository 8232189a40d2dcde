"""Search equals a naive scan (hypothesis), across shard kinds, masks, weights and token widths."""
from __future__ import annotations

import numpy as np
import pytest
from idx_helpers import naive_search
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from indexer.scan import ScanShard
from indexer.shard import Shard
from indexer.sorting import join_documents
from indexer.store import Datastore
from indexer.types import TokenOutOfRange

docs_st = st.lists(st.lists(st.integers(0, 3), max_size=40), min_size=1, max_size=6)
ctx_st = st.lists(st.integers(0, 3), max_size=20)


def _store(width_vocab=400):
    return Datastore.memory(vocab_size=width_vocab)


def _with_shards(ds, shards):
    ds._shards = list(shards)
    ds._rebuild_snapshot()
    return ds


def _as_counter(r):
    return {c.tokens: c.count for c in r.continuations}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(docs=docs_st, ctx=ctx_st, dead_mask=st.lists(st.booleans(), min_size=6, max_size=6),
       n_min=st.integers(1, 3), n_max=st.integers(1, 16), max_len=st.integers(1, 6), offset=st.sampled_from([0, 70000]),
       compact=st.booleans(), foreign=st.booleans())
def test_suffix_array_shard_equals_naive_scan(docs, ctx, dead_mask, n_min, n_max, max_len, offset, compact, foreign):
    # offset 70000: ids above 65,535 in a uint32 store, stored raw or as 2-byte ranks into the shard's
    # alphabet (compact); foreign: the context holds an id that no document has
    vocab = 400 if offset == 0 else 80000
    docs = [[t + offset for t in d] for d in docs]
    ctx = [t + offset for t in ctx]
    if foreign and ctx:
        ctx[len(ctx) // 2] = offset + 7
    width = 2 if offset == 0 else 4
    arr, spans = join_documents(docs, width)
    dead = [s for s, m in zip(spans, dead_mask) if m]
    sh = Shard.from_tokens("s", "repository", arr, width, compact=compact)
    assert (sh.alpha is not None) == (compact and width == 4)
    sh.set_dead(dead)
    alive = [d for d, m in zip(docs, dead_mask + [False] * len(docs)) if not m]
    ds = _with_shards(_store(vocab), [sh])
    r = ds.search(ctx, n_max=n_max, n_min=n_min, max_len=max_len, k=10**6)
    n, total, counts, _ = naive_search(alive, ctx, n_max=n_max, n_min=n_min, max_len=max_len) if n_max >= n_min else (0, 0, {}, {})
    assert (r.match_len, r.count) == (n, total)
    assert _as_counter(r) == dict(counts)
    assert all(len(c.tokens) <= max_len for c in r.continuations)


@settings(max_examples=100, deadline=None)
@given(docs=docs_st, ctx=ctx_st, kinds=st.lists(st.sampled_from(["sa", "live"]), min_size=6, max_size=6),
       wts=st.lists(st.sampled_from([1.0, 2.0, 4.0]), min_size=6, max_size=6))
def test_shards_merge_with_weights(docs, ctx, kinds, wts):
    shards = []
    for i, d in enumerate(docs):
        if kinds[i] == "sa":
            shards.append(Shard.from_tokens(f"s{i}", "repository", d, 2, weight=wts[i]))
        else:
            shards.append(ScanShard(f"l{i}", "live", d, 2, weight=wts[i]))
    ds = _with_shards(_store(), shards)
    r = ds.search(ctx, k=10**6)
    n, total, counts, wsum = naive_search(docs, ctx, weights=wts[:len(docs)])
    assert (r.match_len, r.count) == (n, total)
    assert _as_counter(r) == dict(counts)
    for c in r.continuations:
        assert c.weight == pytest.approx(wsum[c.tokens])
    keys = [(-c.weight, -c.count, c.tokens) for c in r.continuations]
    assert keys == sorted(keys)  # heaviest first, then most frequent, then by tokens
    assert ds.search(ctx, k=10**6, limit=3).continuations == r.continuations[:3]


@settings(max_examples=60, deadline=None)
@given(docs=docs_st, ctx=ctx_st, k=st.integers(1, 8))
def test_sampled_results_are_a_subset_with_exact_match_and_count(docs, ctx, k):
    arr, _ = join_documents(docs, 2)
    ds = _with_shards(_store(), [Shard.from_tokens("s", "repository", arr, 2)])
    r = ds.search(ctx, k=k)
    n, total, counts, _ = naive_search(docs, ctx)
    assert (r.match_len, r.count) == (n, total)  # match length and count are never sampled
    assert sum(c.count for c in r.continuations) <= max(k, 1)
    for c in r.continuations:
        assert c.count <= counts[c.tokens]


def test_sampling_is_spread_over_the_whole_match_range():
    # "a b" is followed by x 5,000 times, then by y 5,000 times: in suffix-array order all the x's come
    # first, so keeping the first k (the reference's choice) would report only x.
    a, b, x, y = 1, 2, 3, 4
    doc = [a, b, x] * 5000 + [a, b, y] * 5000
    ds = _with_shards(_store(), [Shard.from_tokens("s", "repository", doc, 2)])
    r = ds.search([a, b], k=100, max_len=1)
    assert r.count == 10000 and r.match_len == 2
    got = _as_counter(r)
    assert set(got) == {(x,), (y,)}
    assert abs(got[(x,)] - got[(y,)]) <= 2 and sum(got.values()) == 100


def test_sampling_budget_is_shared_across_shards_by_their_counts():
    a, b, x, y = 1, 2, 3, 4
    big = Shard.from_tokens("big", "corpus", [a, b, x] * 900, 2, weight=1.0)
    small = Shard.from_tokens("small", "repository", [a, b, y] * 100, 2, weight=2.0)
    ds = _with_shards(_store(), [big, small])
    r = ds.search([a, b], k=100, max_len=1)
    got = {c.tokens: (c.count, c.weight) for c in r.continuations}
    assert r.count == 1000
    assert got[(x,)] == (90, 90.0) and got[(y,)] == (10, 20.0)


def test_continuations_never_cross_documents():
    docs = [[1, 2, 3], [4, 5, 6]]
    arr, _ = join_documents(docs, 2)
    ds = _with_shards(_store(), [Shard.from_tokens("s", "repository", arr, 2)])
    r = ds.search([2, 3])
    assert r.match_len == 2 and r.count == 1 and r.continuations == []  # at the end of doc 1: nothing follows
    r = ds.search([3, 4])
    assert r.match_len == 0  # the pair only exists across the boundary


def test_ids_are_never_wrapped():
    ds16 = _store(400)
    with pytest.raises(TokenOutOfRange):
        ds16.set_live("x", [1, 65535 + 4464, 3])  # 70000 would wrap to 4464 in a uint16 store
    with pytest.raises(TokenOutOfRange):
        join_documents([[1, 70000]], 2)
    ds32 = _store(151936)
    assert ds32.width == 4
    ds32.set_live("x", [151935, 70000, 4464, 70000, 9])
    r = ds32.search([151935, 70000])
    assert r.match_len == 2 and r.continuations[0].tokens == (4464, 70000, 9)
    assert ds32.search([4464, 70000 - 65536]).match_len == 0


def test_context_ids_outside_the_vocabulary_cut_the_context():
    ds = _store(400)
    ds.set_live("x", [5, 6, 7, 8])
    assert ds.search([5, 6, 7]).match_len == 3
    assert ds.search([5, -1, 6, 7]).match_len == 2
    assert ds.search([5, 6, 70000, 7]).match_len == 0  # one token left: below n_min
    assert ds.search([]).match_len == 0
    assert ds.search(np.array([6, 7], dtype=np.int64)).continuations[0].tokens == (8,)


def test_live_shards_replace_and_drop():
    ds = _store(400)
    ds.set_live("buf", [1, 2, 3, 4])
    assert ds.search([1, 2]).continuations[0].tokens == (3, 4)
    ds.set_live("buf", [1, 2, 9])
    assert [c.tokens for c in ds.search([1, 2]).continuations] == [(9,)]
    ds.set_live("gen", [1, 2, 7])
    assert sorted(ds.live_names()) == ["buf", "gen"]
    ds.drop_live("buf")
    assert [c.tokens for c in ds.search([1, 2]).continuations] == [(7,)]
    ds.drop_live("gen")
    ds.drop_live("never-there")
    assert ds.search([1, 2]).match_len == 0


def test_search_cache_answers_repeats_and_forgets_on_every_change(monkeypatch):
    """Datastore.search remembers answers per snapshot of its shards: a repeat is not searched again, other
    parameters are other entries, and any change of the shards (a live buffer set or dropped) forgets them."""
    import indexer.store as store

    ds = _store(400)
    ds.set_live("buf", [1, 2, 3, 4, 1, 2, 5])
    calls = []
    real = store.search_shards
    monkeypatch.setattr(store, "search_shards", lambda *a: calls.append(a) or real(*a))
    first = ds.search([9, 1, 2], max_len=2)
    assert ds.search([9, 1, 2], max_len=2) == first and len(calls) == 1
    assert ds.search([8, 9, 1, 2], n_max=3, max_len=2) == first and len(calls) == 1  # the same tokens searched
    assert ds.search([9, 1, 2], max_len=1) != first and len(calls) == 2
    ds.search([9, 1, 2], max_len=2, limit=1)
    ds.search([9, 1, 2], max_len=2, first_k=True)
    ds.search([9, 1, 2], max_len=2, k=1)
    assert len(calls) == 5
    ds.set_live("buf", [1, 2, 7])
    assert [c.tokens for c in ds.search([9, 1, 2], max_len=2).continuations] == [(7,)] and len(calls) == 6
    ds.drop_live("buf")
    assert ds.search([9, 1, 2], max_len=2).match_len == 0


def test_search_cache_evicts_the_least_recently_used(monkeypatch):
    import indexer.store as store

    monkeypatch.setattr(store, "SEARCH_CACHE_SIZE", 2)
    ds = _store(400)
    ds.set_live("buf", [1, 2, 3, 4, 5, 6])
    calls = []
    real = store.search_shards
    monkeypatch.setattr(store, "search_shards", lambda *a: calls.append(a[1].tolist()) or real(*a))
    ds.search([1, 2])
    ds.search([2, 3])
    ds.search([1, 2])  # used again: [2, 3] is now the oldest
    ds.search([3, 4])  # evicts [2, 3]
    ds.search([1, 2])
    ds.search([2, 3])
    assert calls == [[1, 2], [2, 3], [3, 4], [2, 3]]
    monkeypatch.setattr(store, "SEARCH_CACHE_SIZE", 0)  # no cache at all
    ds.search([1, 2])
    ds.search([1, 2])
    assert calls[-2:] == [[1, 2], [1, 2]]


def test_prefault_maps_an_on_disk_shard_and_changes_no_answer(tmp_path):
    """Datastore.prefault / Shard.prefault: a hint that maps the shard's pages; searches answer the same."""
    from indexer.shardfile import mapping_of
    from indexer.sorting import write_shard

    arr, _ = join_documents([[1, 2, 3, 4, 1, 2, 5], [2, 3, 9]], 2)
    meta, _ = write_shard(tmp_path, "s1", "corpus", arr, 2)
    sh = Shard.load(tmp_path, meta, 2)
    assert mapping_of(sh.tb) is not None and mapping_of(sh.sa) is not None  # both files are mmaps
    before = [sh.find(sh.encode(np.array(p))) for p in ([1, 2], [2, 3], [7])]
    sh.prefault()
    assert [sh.find(sh.encode(np.array(p))) for p in ([1, 2], [2, 3], [7])] == before
    ds = _with_shards(_store(), [sh])
    assert ds.prefault() >= 0 and ds.search([1, 2]).match_len == 2
    assert _store().prefault() >= 0  # live shards only: nothing to map


@pytest.mark.parametrize("with_sa", [False, True])
def test_a_live_shard_without_the_last_context_token_matches_nothing(with_sa):
    """A one-token search (n_min 1) whose last token no shard holds: no match, not a match of length 1 that
    no shard can count (which crashed the continuations)."""
    shards = [ScanShard("l1", "live", [5, 6, 7], 4)]
    if with_sa:
        shards.insert(0, Shard.from_tokens("s0", "repository", join_documents([[], []], 4)[0], 4))
    ds = _with_shards(Datastore.memory(vocab_size=80000), shards)
    for ctx in ([9], [70001], [5, 9]):
        rows = ds.search_rows(ctx, n_max=1, n_min=1, k=3, max_len=4, limit=5)
        assert rows.match_len == 0 and rows.count == 0 and rows.rows.shape[0] == 0
    rows = ds.search_rows([9, 6], n_max=2, n_min=1, k=3, max_len=4, limit=5)
    assert rows.match_len == 1 and rows.count == 1 and rows.rows[0, 0] == 7  # the one it holds still matches
