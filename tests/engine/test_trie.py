"""The array-built trie against a per-token reference (a dict per node, as the trie was built before), and the
vectorised ranking against best-first expansion with a heap."""
import heapq

import numpy as np
import pytest

from rest_lsp.engine.acceptance import AcceptanceModel
from rest_lsp.engine.tree import flatten, rank_nodes
from rest_lsp.engine.trie import TokenTrie, mix, padded_rows


def reference(proposals):
    """{path: (mass, {source: mass}, source of the heaviest continuation)} by adding token by token."""
    nodes: dict[tuple, list] = {(): [0.0, {}, "", -1.0]}
    for name, share, strength, conts in proposals:
        conts = [(tuple(t), w) for t, w in conts if len(t) and w > 0]
        total = sum(w for _, w in conts)
        if total <= 0 or share <= 0 or strength <= 0:
            continue
        for toks, w in conts:
            w = w * share * strength / total
            for d in range(len(toks) + 1):
                node = nodes.setdefault(toks[:d], [0.0, {}, name, w])
                node[0] += w
                node[1][name] = node[1].get(name, 0.0) + w
                if w > node[3]:  # the first continuation with the largest weight names the node
                    node[2], node[3] = name, w
    return {p: (m, s, src) for p, (m, s, src, _) in nodes.items()}


def paths(trie: TokenTrie) -> dict[tuple, int]:
    out = {(): 0}
    for n in range(1, len(trie)):
        out[next(p for p, i in out.items() if i == trie.parents[n]) + (int(trie.tokens[n]),)] = n
    return out


def random_proposals(rng, n_sources=3, vocab=6):
    props = []
    for s in range(n_sources):
        conts = [(tuple(int(t) for t in rng.integers(0, vocab, rng.integers(0, 7))), float(rng.random()))
                 for _ in range(rng.integers(0, 15))]
        conts += conts[: rng.integers(0, 3)]  # the same continuation twice within a source
        props.append((f"s{s}", float(rng.random()), float(rng.choice([0.0, 0.5, 1.0])), conts))
    return props


@pytest.mark.parametrize("seed", range(40))
def test_the_trie_equals_a_token_by_token_build(seed):
    rng = np.random.default_rng(seed)
    props = random_proposals(rng)
    trie = mix(99, props)
    ref = reference(props)
    by_path = paths(trie)
    assert set(by_path) == set(ref)
    assert trie.tokens[0] == 99 and trie.parents[0] == -1
    names = [p[0] for p in props]
    for path, n in by_path.items():
        mass, smass, src = ref[path]
        assert trie.mass[n] == pytest.approx(mass, abs=1e-12)
        assert trie.depths[n] == len(path)
        for s, name in enumerate(names):
            assert trie.smass[n, s] == pytest.approx(smass.get(name, 0.0), abs=1e-12)
        if n:
            assert trie.source[n] == src
    # parents first; the children of a node are one run of ids with ascending tokens, found by `child`
    assert np.all(trie.parents[1:] < np.arange(1, len(trie)))
    for n in range(len(trie)):
        kids = trie.kids(n)
        assert [c for c in range(1, len(trie)) if trie.parents[c] == n] == list(kids)
        assert list(trie.tokens[kids.start:kids.stop]) == sorted(trie.tokens[kids.start:kids.stop])
        assert trie.children[n] == {int(trie.tokens[c]): c for c in kids}
        for tok in range(-1, 7):
            assert trie.child(n, tok) == trie.children[n].get(tok, -1)


def heap_ranking(trie, max_nodes, score):
    """Best-first expansion from the root (how nodes were ranked before)."""
    order, heap = [], [(-score[c], c) for c in trie.children[0].values()]
    heapq.heapify(heap)
    while heap and len(order) < max_nodes:
        _, n = heapq.heappop(heap)
        order.append(n)
        for c in trie.children[n].values():
            heapq.heappush(heap, (-score[c], c))
    return order


@pytest.mark.parametrize("seed", range(40))
def test_ranking_is_best_first_expansion(seed):
    rng = np.random.default_rng(100 + seed)
    trie = mix(0, random_proposals(rng, vocab=4))
    est = AcceptanceModel().estimate(trie)
    for score in (None, est):
        s = trie.mass if score is None else score
        for k in (1, 4, 16, 64):
            assert rank_nodes(trie, k, score) == heap_ranking(trie, k, s)
    tree = flatten(trie, rank_nodes(trie, 64, est), est)
    assert len(tree) == len(trie)
    for i in range(1, len(tree)):
        assert tree.parents[i] < i and tree.depths[i] == tree.depths[tree.parents[i]] + 1


def test_ranking_keeps_parents_first_when_rounding_lifts_a_child_above_its_parent():
    trie = mix(0, [("s", 1.0, 1.0, [((1, 2), 1.0), ((3,), 1.0)])])
    score = trie.mass.copy()
    two = trie.child(trie.child(0, 1), 2)
    score[two] = score[trie.child(0, 1)] + 1e-12
    order = rank_nodes(trie, 3, score)
    assert order.index(trie.child(0, 1)) < order.index(two)
    with pytest.raises(ValueError):
        flatten(trie, [two])  # a node without its parent would be verified at the wrong position


def test_padded_rows_and_empty_proposals():
    rows, w = padded_rows([((1, 2, 3), 0.5), ((), 1.0), ((4,), 2.0)])
    assert rows.tolist() == [[1, 2, 3], [-1, -1, -1], [4, -1, -1]] and w.tolist() == [0.5, 1.0, 2.0]
    empty = mix(7, [("a", 1.0, 1.0, []), ("b", 1.0, 1.0, [((), 1.0)]), ("c", 0.0, 1.0, [((1,), 1.0)])])
    assert len(empty) == 1 and rank_nodes(empty, 4) == [] and flatten(empty, []).tokens == [7]
