"""Drafting as arrays (sources' `propose_rows`, `Datastore.search_rows`, `mix_rows`, `rank_nodes`) against the
tuple path it replaced: the same continuations, weights and order, hence the same tries and the same trees."""
from __future__ import annotations

import numpy as np
import pytest

from indexer.store import Datastore
from rest_lsp.engine.acceptance import AcceptanceModel
from rest_lsp.engine.drafter import Drafter
from rest_lsp.engine.sources import ContextSource, DatastoreSource, HistorySource, weight_for_match
from rest_lsp.engine.tree import flatten, rank_nodes
from rest_lsp.engine.trie import mix, padded_rows, path_products, row_tuples


def _store(rng, n_tokens=3000, vocab=12):
    ds = Datastore.memory(vocab_size=400)
    ds.set_live("corpus", rng.integers(0, vocab, n_tokens).tolist())
    ds.set_live("other", rng.integers(0, vocab, n_tokens // 3).tolist())
    return ds


def tuple_datastore_proposals(src: DatastoreSource, context, max_len):
    """DatastoreSource.propose as it was: Continuation objects merged level by level in a dict."""
    max_len = min(max_len, src.max_len) if src.max_len else max_len
    kw = dict(k=src.k, max_len=max_len, limit=src.max_continuations)
    result = src.datastore.search(context, n_max=src.n_max, n_min=src.n_min, **kw)
    n = result.match_len
    levels = [(n, result)] + [(b, src.datastore.search(context, n_max=b, n_min=b, **kw))
                              for b in src.backoff if src.n_min <= b < n]
    merged: dict[tuple[int, ...], float] = {}
    for n_level, res in levels:
        conts = [c for c in res.continuations[: src.max_continuations] if len(c.tokens)]
        total = sum(float(c.weight) for c in conts)
        for c in conts if total > 0 else ():
            key = tuple(int(t) for t in c.tokens)
            merged[key] = merged.get(key, 0.0) + weight_for_match(n_level) * float(c.weight) / total
    return list(merged.items())


def tuple_matching_proposals(src, context, max_len):
    """_MatchingSource.propose as it was: a tuple per match, cut at a separator."""
    from rest_lsp.engine.sources import suffix_matches

    query = np.asarray(context[-src.n_max:], dtype=np.int64)
    found = []
    for text, is_context in src._texts(np.asarray(context, dtype=np.int64)):
        for n, end in suffix_matches(text, query, src.n_max, max_len, src.max_matches, is_context):
            cont = text[end + 1: end + 1 + max_len]
            stop = np.flatnonzero(cont < 0)
            found.append((n, tuple(int(t) for t in cont[: stop[0] if len(stop) else len(cont)])))
    found.sort(key=lambda f: -f[0])
    found = found[: src.max_matches]
    return [(cont, weight_for_match(n)) for n, cont in found if cont]


@pytest.mark.parametrize("seed", range(6))
def test_datastore_rows_equal_the_dict_merge_of_continuations(seed):
    rng = np.random.default_rng(seed)
    ds = _store(rng)
    for max_len, cap in ((10, None), (10, 6), (3, None)):
        src = DatastoreSource(ds, max_len=cap, max_continuations=8)
        for _ in range(15):
            ctx = rng.integers(0, 12, rng.integers(1, 20)).tolist()
            rows, weights = src.propose_rows(ctx, max_len)
            assert row_tuples(rows, weights) == tuple_datastore_proposals(src, ctx, max_len)  # order too
            assert rows.dtype == np.int64 and weights.dtype == np.float64


@pytest.mark.parametrize("seed", range(6))
def test_context_and_history_rows_equal_their_tuple_proposals(seed):
    rng = np.random.default_rng(seed)
    ctx_src = ContextSource(max_matches=5)
    ctx_src.set_buffer("a", rng.integers(0, 6, 200).tolist())
    ctx_src.set_buffer("b", rng.integers(0, 6, 50).tolist())
    hist = HistorySource(max_matches=7)
    for _ in range(5):
        hist.extend(rng.integers(0, 6, rng.integers(0, 40)).tolist())  # separated generations
    for _ in range(20):
        context = rng.integers(0, 6, rng.integers(1, 60)).tolist()
        for src in (ctx_src, hist):
            rows, weights = src.propose_rows(context, 10)
            assert row_tuples(rows, weights) == tuple_matching_proposals(src, context, 10)
            assert not (rows < -1).any()  # the history's separators never come through


def test_search_rows_are_search_cached_read_only_and_forgotten_when_the_store_changes():
    ds = Datastore.memory(vocab_size=400)
    ds.set_live("buf", [1, 2, 3, 4, 1, 2, 5, 6])
    found = ds.search_rows([9, 1, 2], max_len=3)
    assert ds.search_rows([9, 1, 2], max_len=3) is found  # remembered for this snapshot of the shards
    assert row_tuples(found.rows, found.weights) == [(c.tokens, c.weight) for c in ds.search([9, 1, 2], max_len=3).continuations]
    with pytest.raises(ValueError):
        found.rows[0, 0] = 7  # one answer serves every caller
    ds.set_live("buf", [1, 2, 7])
    again = ds.search_rows([9, 1, 2], max_len=3)
    assert again is not found and again.rows.tolist() == [[7, -1, -1]]
    ds.drop_live("buf")
    assert ds.search_rows([9, 1, 2], max_len=3).match_len == 0


def test_drafter_trees_equal_the_tuple_path():
    """The drafter's trie from rows equals `mix` over the old tuple proposals, and so do its estimate, ranking
    and tree (the acceptance model's weights perturbed, so that the ranking is not the mass's alone)."""
    rng = np.random.default_rng(3)
    ds = _store(rng)
    context_src, hist = ContextSource(), HistorySource()
    hist.extend(rng.integers(0, 12, 300).tolist())
    corpus = DatastoreSource(ds, max_len=6)
    drafter = Drafter([(context_src, 0.5), (hist, 0.2), (corpus, 0.3)], vocab_size=10)
    model = AcceptanceModel()
    for _ in range(10):
        context = rng.integers(0, 12, 80).tolist()
        trie = drafter.trie(context)
        old = [(src.name, share, 1.0 - 0.5 ** src.last_match_len if src.last_match_len else 0.0,
                [(tuple(t for t in toks if t < 10)[: next((i for i, t in enumerate(toks) if t >= 10), len(toks))], w)
                 for toks, w in (tuple_datastore_proposals(src, context, 10) if src is corpus
                                 else tuple_matching_proposals(src, context, 10))])
               for src, share in drafter.sources]
        ref = mix(context[-1], old)
        for a in ("tokens", "parents", "depths", "mass", "smass", "source_index"):
            assert np.array_equal(getattr(trie, a), getattr(ref, a)), a
        est = model.estimate(trie)
        model.weights = rng.normal(size=len(model.weights))
        order = rank_nodes(trie, 16, est)
        clamped = _clamped_by_depth(trie, est)
        assert order == (np.argsort(-clamped[1:], kind="stable")[:16] + 1).tolist()
        assert flatten(trie, order, est) == flatten(ref, rank_nodes(ref, 16, est), est)


@pytest.mark.parametrize("seed", range(4))
def test_the_compiled_step_equals_its_parts(seed):
    """`Drafter.draft` (one compiled call after the sources: `draft_arrays`) against its definition step by step:
    each source's rows cut to the vocabulary (`clip_rows`), mixed (`mix_rows`), estimated (the features' logistic
    conditionals multiplied down each path, in numpy), ranked (`rank_nodes`), cut by c(q) (`best_size`) and
    flattened (`flatten`); ids past the vocabulary, a source without a match and learned weights included."""
    from rest_lsp.engine.acceptance import features
    from rest_lsp.engine.cost import Calibration, CostModel, best_size
    from rest_lsp.engine.trie import match_strength, mix_rows
    from rest_lsp.engine.vocab import clip_rows

    rng = np.random.default_rng(40 + seed)
    ds = _store(rng)
    context_src, hist = ContextSource(), HistorySource()
    hist.extend(rng.integers(0, 12, 300).tolist())
    silent = HistorySource()  # nothing to match: strength 0, left out of the trie
    silent.name = "silent"
    drafter = Drafter([(context_src, 0.4), (hist, 0.2), (DatastoreSource(ds, max_len=6), 0.3), (silent, 0.1)],
                      vocab_size=10)
    cost = CostModel([1, 4, 8, 16], [10.0, 12.0, 19.0, 40.0])
    drafter.calibration = Calibration(predicted=3.0, actual=2.0)
    drafter.acceptance.weights = rng.normal(size=3 * 4 + 6)
    drafter.acceptance.sources = tuple(drafter.names)
    for _ in range(8):
        context = rng.integers(0, 12, 60).tolist()
        for budget in (4, 16, None):
            tree = drafter.draft(context, budget, cost)
            proposals = []
            for src, share in drafter.sources:
                rows, w = clip_rows(*src.propose_rows(context, drafter.draft_len), 10)
                proposals.append((src.name, share, match_strength(src.last_match_len), rows, w))
            trie = mix_rows(context[-1], proposals)
            for a in ("tokens", "parents", "depths", "mass", "smass", "source_index"):
                assert np.array_equal(getattr(drafter.last_trie, a), getattr(trie, a)), a
            cond = 1 / (1 + np.exp(-(features(trie) @ drafter.acceptance.weights)))
            cond[0] = 1.0
            est = drafter.acceptance.estimate(trie)  # the compiled estimate, against its definition:
            np.testing.assert_allclose(est, path_products(trie, cond), rtol=1e-12)
            order = rank_nodes(trie, drafter.max_draft_nodes if budget is None else budget, est)
            if budget is None:
                order = order[:best_size(np.minimum(1.0, est[order] * drafter.calibration.scale()).tolist(), cost)]
            ref = flatten(trie, order, est)
            assert (tree.tokens, tree.parents, tree.depths, tree.sources) == \
                   (ref.tokens, ref.parents, ref.depths, ref.sources)
            np.testing.assert_allclose(tree.probs, ref.probs, rtol=1e-12)
            assert max(tree.tokens[1:], default=0) < 10 and "silent" not in tree.sources


def _clamped_by_depth(trie, score):
    """rank_nodes' clamp as it was: depth by depth, each node to its parent's score."""
    s = np.array(score, dtype=np.float64)
    for d in range(2, int(trie.depths[-1]) + 1):
        lo, hi = np.searchsorted(trie.depths, d), np.searchsorted(trie.depths, d, side="right")
        np.minimum(s[lo:hi], s[trie.parents[lo:hi]], out=s[lo:hi])
    return s


@pytest.mark.parametrize("seed", range(10))
def test_path_products_equal_the_depth_by_depth_products(seed):
    rng = np.random.default_rng(seed)
    conts = [(tuple(rng.integers(0, 4, rng.integers(1, 8)).tolist()), float(rng.random())) for _ in range(30)]
    trie = mix(0, [("s", 1.0, 1.0, conts)])
    cond = rng.random(len(trie))
    cond[0] = 1.0
    est = np.ones(len(trie))
    for n in range(1, len(trie)):  # parents come first
        est[n] = est[trie.parents[n]] * cond[n]
    assert np.array_equal(path_products(trie, cond), est)


def test_padded_rows_width_and_round_trip():
    rows, w = padded_rows([((1, 2), 0.5), ((3,), 1.0)], width=4)
    assert rows.tolist() == [[1, 2, -1, -1], [3, -1, -1, -1]] and w.tolist() == [0.5, 1.0]
    assert row_tuples(rows, w) == [((1, 2), 0.5), ((3,), 1.0)]


def test_recycling_rows_equal_its_padded_proposals():
    from rest_lsp.engine.sources import RecyclingSource

    src = RecyclingSource()
    assert [a.tolist() for a in src.propose_rows([1, 2], 10)] == [[], []]
    src.begin([5, 1, 2])
    src.observe_forward([2, 3, 4], [[3, 7, 8, 9], [4, 1, 2, 3], [6, 5, 4, 3]])
    rows, weights = src.propose_rows([5, 1, 2], 10)
    ref_rows, ref_weights = padded_rows(src.propose([5, 1, 2], 10))
    assert rows.tolist() == ref_rows.tolist() and weights.tolist() == ref_weights.tolist() and len(rows) > 1


def test_the_workspace_set_answers_rows_as_its_search():
    """The daemon's repository source searches a DatastoreSet of workspace stores: its rows equal its search."""
    from rest_lsp.service.datastores import DatastoreSet

    stores = DatastoreSet()
    rng = np.random.default_rng(1)
    for key in ("a", "b"):
        ds = Datastore.memory(vocab_size=400)
        ds.set_live("x", rng.integers(0, 5, 400).tolist())
        stores.set(key, ds)
    for _ in range(20):
        ctx = rng.integers(0, 5, 6).tolist()
        for kw in (dict(max_len=4), dict(max_len=10, limit=8, k=50)):
            found, ref = stores.search_rows(ctx, **kw), stores.search(ctx, **kw)
            assert found.match_len == ref.match_len
            assert row_tuples(found.rows, found.weights) == [(c.tokens, c.weight) for c in ref.continuations]
    assert stores.search_rows([99, 98], max_len=3).match_len == 0


def test_an_explicit_budget_never_draws_more_than_max_draft_nodes():
    """The engine reserves cache room for max_draft_nodes, and int8w verifies exactly only up to it."""
    context = ContextSource()
    text = list(range(40, 60)) * 6
    context.set_buffer("open", text)
    prompt = text[:25]
    wide = Drafter([(context, 1.0)], max_draft_nodes=64)
    narrow = Drafter([(context, 1.0)], max_draft_nodes=3)
    for d in (wide, narrow):
        d.begin(prompt)
    assert len(wide.draft(prompt, 10)) == 11  # root + 10: the context holds enough continuations
    assert len(narrow.draft(prompt, 10)) == 4
