"""The online acceptance model: starts as the trie's mass, learns which sources the model agrees with."""
import numpy as np
import pytest

from rest_lsp.engine.acceptance import AcceptanceModel, features
from rest_lsp.engine.tree import rank_nodes
from rest_lsp.engine.trie import mix


def _trie(right_first: bool = False):
    # "wrong" holds most of the share and proposes 7 8 9; "right" proposes 1 2 3 (what the model will say)
    right = ("right", 0.3, 1.0, [((1, 2, 3), 1.0)])
    wrong = ("wrong", 0.7, 1.0, [((7, 8, 9), 3.0), ((7, 5), 1.0)])
    return mix(0, [right, wrong] if right_first else [wrong, right])


def test_a_fresh_model_ranks_as_the_mass():
    rng = np.random.default_rng(0)
    conts = [[(tuple(rng.integers(0, 6, rng.integers(1, 6))), float(rng.random())) for _ in range(12)]
             for _ in range(3)]
    trie = mix(9, [("a", 0.5, 0.9, conts[0]), ("b", 0.3, 0.5, conts[1]), ("c", 0.2, 1.0, conts[2])])
    est = AcceptanceModel().estimate(trie)
    assert est[0] == 1.0 and np.all(est[1:] <= 1.0)
    assert est[1:] == pytest.approx(np.clip(trie.mass[1:], 1e-4, 1 - 1e-4), rel=1e-3)
    assert rank_nodes(trie, 15, est) == rank_nodes(trie, 15)
    x = features(trie)
    assert x.shape == (len(trie), 3 * 3 + 6)


def test_it_learns_which_source_the_model_follows():
    model = AcceptanceModel(lr=0.1)
    first = _trie()
    assert rank_nodes(first, 1, model.estimate(first)) == [first.children[0][7]]  # the mass's choice
    model.begin()
    for _ in range(30):  # each step: draft after the root, then the model's output is 1 2 3 (+1 more)
        model.observe([0])
        model.estimate(_trie())
        model.observe([1, 2, 3, 4])
    model.finish()
    trie = _trie()
    est = model.estimate(trie)
    assert rank_nodes(trie, 3, est) == [trie.children[0][1], trie.children[trie.children[0][1]][2],
                                        trie.children[trie.children[trie.children[0][1]][2]][3]]
    assert est[trie.children[0][1]] > 0.5 > est[trie.children[0][7]]
    # the weights belong to the sources by name: the same sources in another order start afresh
    swapped = _trie(right_first=True)
    assert rank_nodes(swapped, 1, model.estimate(swapped)) == [swapped.children[0][7]]


def test_a_step_is_learned_once_the_output_reaches_its_deepest_node():
    model = AcceptanceModel(lr=0.1)
    model.begin()
    model.observe([0])
    model.estimate(_trie())
    w0 = model.weights.copy()
    model.observe([1, 2])  # depth 3 not decided yet
    assert np.array_equal(model.weights, w0) and len(model._pending) == 1
    model.observe([3])
    assert not np.array_equal(model.weights, w0) and not model._pending
    model.observe([0])
    model.estimate(_trie())
    w1 = model.weights.copy()
    model.finish()  # the generation ended after the root: nothing decided, nothing learned, nothing kept
    assert np.array_equal(model.weights, w1) and not model._pending
    frozen = AcceptanceModel(lr=0)
    frozen.begin()
    frozen.observe([0])
    frozen.estimate(_trie())
    frozen.observe([1, 2, 3, 4])
    frozen.finish()
    assert frozen.weights[-1] == 1.0 and not frozen.weights[:-1].any()
