"""The compiled trie, estimate features and ranking (rest_lsp/engine/trie.py, acceptance.py, tree.py) against
plain Python references written from their definitions: the same nodes, and the same floats to the last bit."""
from __future__ import annotations

import numpy as np
import pytest

from rest_lsp.engine.acceptance import EPS, features
from rest_lsp.engine.trie import PAD, _pairwise_sum, mix_rows, path_products
from rest_lsp.engine.tree import rank_nodes


def _proposals(rng, n_src: int, vocab: int = 4):
    """Random per-source rows: short tokens from a small vocabulary (many shared prefixes and equal rows),
    some rows empty or without a positive weight, some sources empty or switched off."""
    props = []
    for s in range(n_src):
        n, width = int(rng.integers(0, 12)), int(rng.integers(0, 7))
        rows = np.full((n, width), PAD, dtype=np.int64)
        for r in range(n):
            length = int(rng.integers(0, width + 1))
            rows[r, :length] = rng.integers(0, vocab, length)
        w = rng.choice([0.0, -1.0, 0.25, 1.0, 3.0], n) if rng.random() < 0.3 else rng.random(n) * 10
        share = float(rng.choice([0.0, 0.2, 0.5])) if rng.random() < 0.2 else float(rng.random())
        strength = 0.0 if rng.random() < 0.1 else float(rng.random())
        props.append((f"s{s}", share, strength, rows, w))
    return props


def _reference_trie(root: int, props):
    """The trie by its definition: each source's kept rows (a first token, a positive weight) scaled to
    share * strength; nodes are the distinct prefixes, numbered depth by depth in the order their first row
    comes when rows are sorted; a node's mass adds its rows' weights in that order; its source is its
    heaviest row's, ties to the row given first."""
    rows = []  # (tokens, weight, source, given order)
    for s, (_, share, strength, r, w) in enumerate(props):
        if not (share > 0 and strength > 0 and len(w)):
            continue
        kept = [(tuple(t for t in row if t != PAD), float(x)) for row, x in zip(r.tolist(), w.tolist())
                if x > 0 and row and row[0] != PAD]
        total = np.array([x for _, x in kept]).sum() if kept else 0.0
        if kept and not total <= 0:
            rows += [(t, x * (share * strength / total), s) for t, x in kept]
    given = {id(r): i for i, r in enumerate(rows)}
    ordered = sorted(rows, key=lambda r: r[0])  # stable: equal rows keep their order
    n_src = len(props)
    depth_of = max((len(t) for t, _, _ in rows), default=0)
    ids = {(): 0}
    for d in range(1, depth_of + 1):
        for t, _, _ in ordered:
            if len(t) >= d and t[:d] not in ids:
                ids[t[:d]] = len(ids)
    n = len(ids)
    tokens, parents, depths = np.zeros(n, np.int64), np.zeros(n, np.int64), np.zeros(n, np.int64)
    mass, smass = np.zeros(n), np.zeros((n, n_src))
    source, best = np.full(n, -1), {}
    tokens[0], parents[0] = root, -1
    for prefix, i in ids.items():
        if prefix:
            tokens[i], parents[i], depths[i] = prefix[-1], ids[prefix[:-1]], len(prefix)
    for r in ordered:
        t, x, s = r
        for d in range(1, len(t) + 1):
            i = ids[t[:d]]
            mass[i] += x
            smass[i, s] += x
            key = (-x, given[id(r)])
            if i not in best or key < best[i]:
                best[i], source[i] = key, s
        smass[0, s] += x
    mass[0] = np.array([x for _, x, _ in ordered]).sum() if ordered else 0.0
    return tokens, parents, depths, mass, smass, source


@pytest.mark.parametrize("seed", range(40))
def test_mixed_trie_equals_the_definition(seed):
    rng = np.random.default_rng(seed)
    props = _proposals(rng, int(rng.integers(1, 5)))
    trie = mix_rows(7, props)
    tokens, parents, depths, mass, smass, source = _reference_trie(7, props)
    assert trie.tokens.tolist() == tokens.tolist()
    assert trie.parents.tolist() == parents.tolist()
    assert trie.depths.tolist() == depths.tolist()
    assert trie.mass.tolist() == mass.tolist()  # exact: the same additions in the same order
    assert trie.smass.tolist() == smass.tolist()
    assert trie.source_index.tolist() == source.tolist()
    for node in range(len(trie)):
        kids = [i for i in range(len(trie)) if parents[i] == node]
        assert list(trie.kids(node)) == kids
        assert [trie.tokens[k] for k in kids] == sorted(trie.tokens[k] for k in kids)


def test_sources_with_nothing_to_say_leave_a_bare_root():
    trie = mix_rows(3, [("a", 0.5, 1.0, np.full((2, 3), PAD, dtype=np.int64), np.ones(2)),
                        ("b", 0.5, 1.0, np.array([[1, 2]]), np.zeros(1))])
    assert len(trie) == 1 and trie.tokens.tolist() == [3] and trie.mass.tolist() == [0.0]
    assert trie.n_children.tolist() == [0] and trie.smass.shape == (1, 2)


def test_pairwise_sum_is_numpys_sum_to_the_bit():
    rng = np.random.default_rng(0)
    for n in list(range(0, 260)) + [1000, 4099]:
        a = rng.random(n) * 10.0 ** rng.uniform(-6, 6, n)
        assert _pairwise_sum(a, 0, n) == a.sum()
        assert _pairwise_sum(a, 3, max(0, n - 5)) == a[3:3 + max(0, n - 5)].sum()


def _reference_features(trie) -> np.ndarray:
    parents = trie.parents.copy()
    parents[0] = 0
    above = trie.smass[parents]
    frac = np.divide(trie.smass, above, out=np.zeros_like(trie.smass), where=above > 0)
    below = np.maximum(trie.mass[parents], 1e-12)
    below[parents == 0] = 1.0
    cond = np.clip(trie.mass / below, EPS, 1 - EPS)
    d = trie.depths
    return np.column_stack([frac, frac * np.asarray(trie.strengths)[None, :], frac > 0, np.ones(len(d)),
                            d == 1, d == 2, d >= 4, (frac > 0).sum(axis=1) >= 2, np.log(cond / (1 - cond))])


@pytest.mark.parametrize("seed", range(20))
def test_features_rank_and_products_equal_their_definitions(seed):
    rng = np.random.default_rng(100 + seed)
    trie = mix_rows(1, _proposals(rng, 3))
    got, ref = features(trie), _reference_features(trie)
    assert np.array_equal(got[:, :-1], ref[:, :-1])
    # the logit: numpy's log on an AVX-512 CPU is its own vectorized one, which can differ from the C library's
    # (the compiled loop's) by one unit in the last place (seed 5 did on an Ice Lake Xeon)
    np.testing.assert_array_max_ulp(got[:, -1], ref[:, -1], maxulp=1)
    cond = rng.random(len(trie))
    expect = cond.copy()
    for i in range(1, len(trie)):
        if trie.parents[i] > 0:
            expect[i] = expect[trie.parents[i]] * cond[i]
    assert np.array_equal(path_products(trie, cond), expect)
    score = rng.choice([0.1, 0.5, 0.9], len(trie))  # many ties: lower ids first
    clamped = score.copy()
    for i in range(1, len(trie)):
        if trie.parents[i] > 0:
            clamped[i] = min(clamped[trie.parents[i]], score[i])
    best = sorted(range(1, len(trie)), key=lambda i: (-clamped[i], i))
    for limit in (1, 5, len(trie) + 3):
        assert rank_nodes(trie, limit, score) == best[:limit]
