"""Which draft nodes the model will accept: an estimate learned online from the engine's own steps.

The trie's mass (each source's normalised weights times its share) ranks nodes well once a match is under
way and poorly at the first token, where every source guesses. Replayed on HumanEval, the full trie held
the true continuation for 3.2 tokens per step while a 4-node draft took 1.9 of them (docs/engine.md): the
ranking, not the sources, was the loss. So the estimate of P(node accepted | parent accepted) is a logistic
model over what the trie knows about the node (per source: the share of the source's weight at the parent
that goes to this child, that times the source's match strength, whether the source proposed it; the depth;
whether two sources agree; the trie's own conditional mass), trained by one gradient step per decoding step
on the nodes whose fate the output has since decided. It starts as the trie's own estimate (only the last
weight is non-zero), so a fresh engine ranks exactly as the mass does, and it never touches exactness:
it only orders the candidates the model then verifies.
"""
from __future__ import annotations

from collections import deque
from typing import Sequence

import numpy as np

from restbase.jit import njit

from .trie import TokenTrie, path_product_arrays

DEFAULT_LR = 0.02  # best of 0.005-0.1 in the 20-prompt HumanEval replay (docs/engine.md)
EPS = 1e-4  # the trie conditional is clipped to [EPS, 1 - EPS] before its log-odds
_MAX_WEIGHT = 20.0  # far beyond what the replays learn (|w| < 4); keeps one odd step from saturating


def features(trie: TokenTrie) -> np.ndarray:
    """[N, 3 * sources + 6] per node (row 0, the root, is unused)."""
    return _features(trie.parents, trie.depths, trie.mass, trie.smass,
                     np.asarray(trie.strengths, dtype=np.float64), int(trie.n_children[0]), EPS)


@njit
def _features(parents, depths, mass, smass, strength, n_first, eps):
    """x [N, 3S + 6]: per source, the share of the parent's source mass that goes to the node, that times the
    source's strength, whether it proposed the node at all; the depth (1, 2, >= 4); whether two sources agree;
    the log-odds of the trie's conditional estimate, which under the root is the absolute mass (unclaimed
    shares stay doubt): ids go depth by depth, so the root's children are ids 1..n_first."""
    n, n_src = smass.shape
    x = np.empty((n, 3 * n_src + 6))
    for i in range(n):
        p = parents[i] if i > 0 else 0
        agree = 0
        for s in range(n_src):
            above = smass[p, s]
            frac = smass[i, s] / above if above > 0 else 0.0
            x[i, s] = frac
            x[i, n_src + s] = frac * strength[s]
            x[i, 2 * n_src + s] = 1.0 if frac > 0 else 0.0
            agree += frac > 0
        x[i, 3 * n_src] = 1.0
        x[i, 3 * n_src + 1] = depths[i] == 1
        x[i, 3 * n_src + 2] = depths[i] == 2
        x[i, 3 * n_src + 3] = depths[i] >= 4
        x[i, 3 * n_src + 4] = agree >= 2
        below = 1.0 if i <= n_first else max(mass[p], 1e-12)
        cond = min(max(mass[i] / below, eps), 1 - eps)
        x[i, 3 * n_src + 5] = np.log(cond / (1 - cond))
    return x


@njit
def estimate_arrays(parents, depths, mass, smass, strength, n_first, eps, weights):
    """(x [N, F] the features, est [N] each node's chance of acceptance: the product down its path of the
    conditionals sigmoid(x @ weights), the root's 1). One compiled pass: the drafter calls it inside its
    step (rest_lsp/engine/drafter.py), `AcceptanceModel.estimate` for a trie on its own."""
    x = _features(parents, depths, mass, smass, strength, n_first, eps)
    n, f = x.shape
    cond = np.empty(n)
    for i in range(n):
        z = 0.0
        for j in range(f):
            z += x[i, j] * weights[j]
        cond[i] = 1.0 / (1.0 + np.exp(-z))
    if n:
        cond[0] = 1.0
    return x, path_product_arrays(parents, cond)


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-z))


class AcceptanceModel:
    """Estimates each trie node's chance of acceptance; learns from every step once its outcome is known.

    Call `begin()` when a generation starts, `estimate(trie)` for each draft (the trie's root is the last
    token observed), `observe(tokens)` with every token appended to the output, `finish()` at the end.
    lr = 0: never learns (the trie's mass ranking).
    """

    def __init__(self, lr: float = DEFAULT_LR, l2: float = 1e-4):
        self.lr, self.l2 = lr, l2
        self.weights: np.ndarray | None = None
        self.sources: tuple[str, ...] = ()
        self._output: list[int] = []
        self._pending: deque[tuple[int, TokenTrie, np.ndarray]] = deque()  # (root's index in output, trie, X)

    def begin(self) -> None:
        self._output = []
        self._pending.clear()

    def estimate(self, trie: TokenTrie) -> np.ndarray:
        """[N] estimated chance that each node is accepted (its whole path; root 1)."""
        weights = self.weights_for(trie.names)
        x, est = estimate_arrays(trie.parents, trie.depths, trie.mass, trie.smass,
                                 np.asarray(trie.strengths, dtype=np.float64), int(trie.n_children[0]), EPS,
                                 weights)
        self.remember(trie, x)
        return est

    def weights_for(self, names: Sequence[str]) -> np.ndarray:
        """The weights [3 * sources + 6] for tries of these sources (a new set of sources starts over, as the
        trie's own estimate: only the last weight set)."""
        if self.weights is None or tuple(names) != self.sources:
            self.sources = tuple(names)
            self.weights = np.zeros(3 * len(self.sources) + 6)
            self.weights[-1] = 1.0
        return self.weights

    def remember(self, trie: TokenTrie, x: np.ndarray) -> None:
        """A drafted trie and its features: learned from once the output has decided its nodes."""
        if self.lr > 0 and self._output:
            self._pending.append((len(self._output) - 1, trie, x))

    def observe(self, tokens: Sequence[int]) -> None:
        self._output.extend(int(t) for t in tokens)
        while self._pending:
            pos, trie, _ = self._pending[0]
            if len(self._output) - 1 - pos < max(trie.depths):
                break  # the output does not reach this step's deepest node yet
            self._learn(*self._pending.popleft())

    def finish(self) -> None:
        """The generation ended: learn from what its output decided."""
        while self._pending:
            self._learn(*self._pending.popleft())
        self._output = []

    def _learn(self, pos: int, trie: TokenTrie, x: np.ndarray) -> None:
        rows, labels, node = [], [], 0
        for tok in self._output[pos + 1:]:
            kids = trie.kids(node)
            if not kids:
                break
            rows += kids
            labels += (trie.tokens[kids.start:kids.stop] == tok).tolist()
            node = trie.child(node, tok)
            if node < 0:
                break
        if rows and self.weights is not None and x.shape[1] == len(self.weights):
            xr, y = x[rows], np.asarray(labels, dtype=np.float64)
            p = _sigmoid(xr @ self.weights)
            new = self.weights - self.lr * (xr.T @ (p - y) + self.l2 * self.weights)
            if np.all(np.isfinite(new)):  # a long-running daemon must never rank by NaN
                self.weights = np.clip(new, -_MAX_WEIGHT, _MAX_WEIGHT)
