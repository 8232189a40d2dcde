"""Draft trees: choose nodes from a trie, flatten them for one forward, accept the model's path.

A flattened tree lists nodes parents-first; node 0 is the root, the token already decided by the previous
step (not yet in the KV cache). Its logits give the model's next token; a child whose token equals it is
accepted, and so on down the tree. The accepted path plus the model's next token after it are emitted.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import torch

from restbase.jit import njit

from .trie import TokenTrie


@dataclass
class DraftTree:
    tokens: list[int]  # [q] node tokens, tokens[0] is the root
    parents: list[int]  # [q] parent index, -1 for the root; parents[i] < i
    depths: list[int]  # [q] root = 0
    probs: list[float]  # [q] estimated chance that the node is accepted (root: 1)
    sources: list[str]  # [q] the source that contributed most to each node ("" for the root)

    def __len__(self) -> int:
        return len(self.tokens)

    @classmethod
    def single(cls, token: int) -> "DraftTree":
        """No draft: one plain decoding step."""
        return cls([token], [-1], [0], [1.0], [""])

    def children(self) -> list[dict[int, int]]:
        """Per node, token -> child index."""
        kids: list[dict[int, int]] = [{} for _ in self.tokens]
        for i, p in enumerate(self.parents):
            if p >= 0:
                kids[p][self.tokens[i]] = i
        return kids

    def tensors(self, device: torch.device | str | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """tokens [q] int64, depths [q] int64, tree mask [q, q] bool (row i sees its ancestors and itself)."""
        q = len(self.tokens)
        rows: list[list[bool]] = []
        for i, p in enumerate(self.parents):
            row = list(rows[p]) if p >= 0 else [False] * q  # parents come first: the parent's row is complete
            row[i] = True
            rows.append(row)
        return (
            torch.tensor(self.tokens, dtype=torch.long, device=device),
            torch.tensor(self.depths, dtype=torch.long, device=device),
            torch.tensor(rows, dtype=torch.bool, device=device),
        )


def rank_nodes(trie: TokenTrie, max_nodes: int, score: Sequence[float] | np.ndarray | None = None) -> list[int]:
    """Up to max_nodes trie nodes, best first by estimated acceptance (`score`, default the node's mass).

    A score never grows down a path (it is clamped to the parent's, against rounding), so the best nodes
    overall, ties to the lower id (parents have lower ids), are what best-first expansion from the root
    picks, and every prefix of the ranking is a connected tree (each node comes after its parent).
    """
    if len(trie) <= 1 or max_nodes <= 0:
        return []
    score = trie.mass if score is None else np.asarray(score, dtype=np.float64)
    return best_node_arrays(trie.parents, score, max_nodes).tolist()


@njit
def best_node_arrays(parents, score, limit):
    """The ids of the `limit` best nodes by score clamped to every ancestor's, ties to the lower id."""
    clamped = score.copy()
    for i in range(1, len(parents)):  # parents come first: the parent's clamped score is final
        p = parents[i]
        if p > 0:
            clamped[i] = min(clamped[p], score[i])
    return np.argsort(-clamped[1:], kind="mergesort")[:limit] + 1  # mergesort: stable


def flatten(trie: TokenTrie, order: Sequence[int], probs: Sequence[float] | np.ndarray | None = None) -> DraftTree:
    """The root plus the chosen nodes (parents before children) as a DraftTree; probs: each node's
    estimated acceptance (default its mass)."""
    probs = trie.mass if probs is None else probs
    arrays = flatten_arrays(trie.tokens, trie.parents, trie.depths, trie.source_index,
                            np.asarray(order, dtype=np.int64), np.asarray(probs, dtype=np.float64))
    return draft_tree(arrays, trie.names)


def draft_tree(arrays: tuple, names: Sequence[str]) -> DraftTree:
    """The DraftTree of `flatten_arrays`' answer, source indices named by `names`."""
    tokens, parents, depths, probs, source_index = arrays
    named = list(names) + [""]  # the root's source index, -1, names it ""
    return DraftTree(tokens.tolist(), parents.tolist(), depths.tolist(), probs.tolist(),
                     [named[i] for i in source_index.tolist()])


@njit
def flatten_arrays(tokens, parents, depths, source_index, order, probs):
    """The tree's (tokens, parents, depths, probs, source indices) [q]: the root (trie node 0) then the trie
    nodes `order`, a node's parent its position in the tree; probs capped at 1 (the root's is 1)."""
    q = len(order) + 1
    pos = np.zeros(len(tokens), np.int64)  # a chosen node's index in the tree (the root's is 0)
    t_tokens, t_parents, t_depths = np.empty(q, np.int64), np.empty(q, np.int64), np.empty(q, np.int64)
    t_probs, t_source = np.empty(q), np.empty(q, np.int64)
    t_tokens[0], t_parents[0], t_depths[0], t_probs[0], t_source[0] = tokens[0], -1, 0, 1.0, -1
    for k in range(1, q):
        node = order[k - 1]
        p = parents[node]
        if p != 0 and pos[p] == 0:  # a node's depth and position id come from its path
            raise ValueError("flatten: a chosen node's parent is not chosen before it")
        pos[node] = k
        t_tokens[k], t_parents[k], t_depths[k] = tokens[node], pos[p], depths[node]
        t_probs[k], t_source[k] = min(1.0, probs[node]), source_index[node]
    return t_tokens, t_parents, t_depths, t_probs, t_source


def accept_greedy(tree: DraftTree, next_tokens: list[int]) -> tuple[list[int], int]:
    """Longest path from the root whose tokens equal the model's argmax; returns (path indices, next token).

    next_tokens[i] is the model's argmax after node i. The path starts at the root (index 0).
    """
    kids = tree.children()
    path = [0]
    while (child := kids[path[-1]].get(next_tokens[path[-1]])) is not None:
        path.append(child)
    return path, next_tokens[path[-1]]


def accept_sampled(
    tree: DraftTree, probs_of: Callable[[int], torch.Tensor], generator: torch.Generator | None = None
) -> tuple[list[int], int]:
    """Speculative sampling over a tree of deterministic drafts, exact in distribution.

    At each node with model distribution p, try the children one by one: accept child x with probability
    r(x) / sum(r), where r is p with the already rejected children zeroed (recursive rejection: for a point-mass
    draft the residual max(r - q, 0) removes exactly the rejected token). If all are rejected, sample the
    residual. Summed over the branches, each token x comes out with probability p(x), so the emitted sequence
    is distributed as the model's. probs_of(i) gives p after node i ([V], on any device).
    """
    kids = tree.children()
    path = [0]
    while True:
        p = probs_of(path[-1]).double()  # [V]
        residual = p.clone()
        chosen = None
        for token, child in kids[path[-1]].items():
            mass = float(residual.sum())
            if mass <= 0:
                break
            if float(torch.rand((), generator=generator, dtype=torch.float64)) * mass < float(residual[token]):
                chosen = child
                break
            residual[token] = 0.0
        if chosen is None:
            token = int(torch.multinomial(residual / residual.sum(), 1, generator=generator))
            return path, token
        path.append(chosen)


def sampling_probs(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """Probabilities [..., V] after temperature and nucleus (top-p) filtering, as in HF's warpers."""
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    if top_p >= 1.0:
        return probs
    sorted_p, sorted_i = probs.sort(dim=-1, descending=False)
    # drop the low tail whose cumulative mass stays within 1 - top_p; always keep the most likely token
    drop = sorted_p.cumsum(dim=-1) <= (1.0 - top_p)
    drop[..., -1] = False
    sorted_p = sorted_p.masked_fill(drop, 0.0)
    filtered = torch.zeros_like(probs).scatter(-1, sorted_i, sorted_p)
    return filtered / filtered.sum(dim=-1, keepdim=True)
