"""A token trie of weighted continuations, mixed from several draft sources by a share per source.

Each source's weights are normalised within the source and scaled by its share (times a strength that
grows with the source's suffix-match length), so a source that returns thousands of raw corpus counts
cannot drown one that returns a single long context match. A node's mass is then the estimated chance
that the model's greedy continuation passes through it: the product of the conditional fractions along
its path times the mass at the root.

The trie is built with array operations, not per token: the continuations of all sources (a few hundred,
up to 10 tokens each) go into one padded matrix, sorted lexicographically; a node is a distinct prefix, so
it starts where a row first differs from the row above. Nodes are numbered depth by depth, in row order,
which puts every parent before its children and the children of a node in one run of ids, tokens ascending.
The trie keeps each row's path (`paths`: the node at every depth of every row), so what accumulates along
paths (the acceptance estimate, the ranking's clamp) is one cumulative operation over it, not a loop.
"""
from __future__ import annotations

from bisect import bisect_left
from itertools import chain
from typing import Iterable, Sequence

import numpy as np

PAD = -1  # after a continuation's last token in a padded row


class TokenTrie:
    """Continuations after a fixed root token; node 0 is the root (depth 0: the token already decided).

    Per node (arrays of N): `tokens`, `parents` (-1 for the root), `depths`, `mass` (the estimate), `smass`
    ([N, sources]: each source's part of the mass), `source_index` (the source of the heaviest continuation
    through the node; -1 for the root), `first_child` / `n_children` (the children are ids first_child ..
    first_child + n_children - 1, tokens ascending), `paths` ([L, C]: the node at depth d + 1 of sorted row c,
    0 past the row's end)."""

    def __init__(self, root_token: int, names: Sequence[str] = (), strengths: Sequence[float] = ()):
        self._name(names, strengths)
        self._set(np.array([root_token], dtype=np.int64), np.array([-1], dtype=np.int64),
                  np.zeros(1, dtype=np.int64), np.zeros(1), np.zeros((1, len(self.names))),
                  np.array([-1], dtype=np.int64), np.zeros((0, 0), dtype=np.int64))

    def _name(self, names: Sequence[str], strengths: Sequence[float]) -> None:
        self.names = list(names)  # the sources, in the order of `smass`'s columns
        self.strengths = list(strengths) or [1.0] * len(self.names)

    def _set(self, tokens, parents, depths, mass, smass, source_index, paths) -> None:
        self.tokens, self.parents, self.depths = tokens, parents, depths
        self.mass, self.smass, self.source_index = mass, smass, source_index
        self.paths = paths
        # parents are non-decreasing in id order (depth by depth, rows in order): children are one run of
        # ids, the runs in parent order, so a node's first child comes after all children of lower ids
        self.n_children = np.bincount(parents[1:], minlength=len(tokens))
        self.first_child = np.cumsum(self.n_children) - self.n_children + 1
        self._token_list: list[int] | None = None
        self._children: list[dict[int, int]] | None = None

    def __len__(self) -> int:
        return len(self.tokens)

    def child(self, node: int, token: int) -> int:
        """The child of `node` holding `token`, or -1."""
        if self._token_list is None:
            self._token_list = self.tokens.tolist()
        lo = int(self.first_child[node])
        hi = lo + int(self.n_children[node])
        i = bisect_left(self._token_list, token, lo, hi)
        return i if i < hi and self._token_list[i] == token else -1

    def kids(self, node: int) -> range:
        """The ids of the children of `node`."""
        lo = int(self.first_child[node])
        return range(lo, lo + int(self.n_children[node]))

    @property
    def children(self) -> list[dict[int, int]]:
        """Per node, token -> child id (built on first use; the drafting path uses `child` and `kids`)."""
        if self._children is None:
            toks = self.tokens.tolist()
            self._children = [{toks[c]: c for c in self.kids(n)} for n in range(len(self))]
        return self._children

    @property
    def source(self) -> list[str]:
        """Per node, the name of the source of the heaviest continuation through it ("" for the root)."""
        return [self.names[i] if i >= 0 else "" for i in self.source_index.tolist()]

    @classmethod
    def build(cls, root_token: int, names: Sequence[str], strengths: Sequence[float], rows: np.ndarray,
              weights: np.ndarray, sources: np.ndarray) -> "TokenTrie":
        """The trie of continuations `rows` ([C, L] ids, padded with -1 after each row's end, every row at
        least one token long), each adding `weights[c]` to every node on its path, from source `sources[c]`
        (an index into `names`). Rows that share a prefix share its nodes."""
        n_rows = len(rows)
        if n_rows == 0:
            return cls(root_token, names, strengths)
        trie = cls.__new__(cls)  # not through __init__: its root-only arrays would be replaced at once
        trie._name(names, strengths)
        n_src = len(trie.names)
        weights = np.asarray(weights, dtype=np.float64)
        sources = np.asarray(sources, dtype=np.int64)
        order = np.lexsort(rows.T[::-1])  # lexicographic; stable, so equal rows keep their order
        rows = rows[order]
        width = rows.shape[1]
        # first column where each row differs from the one above (the first row differs everywhere; a row
        # equal to the one above "differs" at `width`, the always-true column after its last)
        neq = np.ones((n_rows, width + 1), dtype=bool)
        np.not_equal(rows[1:], rows[:-1], out=neq[1:, :width])
        differs = neq.argmax(axis=1)
        # the cells holding a token, depth by depth, row by row (padding only follows a row's end); a node
        # starts at a cell where its row differs from the row above, so numbering those cells in this order
        # numbers the nodes depth by depth, and each node's cells are one run (its rows are adjacent)
        cell_d, cell_r = np.nonzero((rows != PAD).T)
        is_new = cell_d >= differs[cell_r]
        cell_node = np.cumsum(is_new)  # every depth's first cell starts a node: ids 1..n_new
        starts = np.flatnonzero(is_new)
        new_d, new_r = cell_d[starts], cell_r[starts]
        n_new = len(starts)
        paths = np.zeros((width, n_rows), dtype=np.int64)
        paths[cell_d, cell_r] = cell_node
        parents = np.empty(n_new + 1, dtype=np.int64)
        parents[0] = -1
        parents[1:] = paths[new_d - 1, new_r]  # depth 0 reads the row's last depth (-1): set to the root below
        parents[1:][new_d == 0] = 0
        tokens = np.empty(n_new + 1, dtype=np.int64)
        tokens[0] = root_token
        tokens[1:] = rows[new_r, new_d]
        depths = np.empty(n_new + 1, dtype=np.int64)
        depths[0] = 0
        np.add(new_d, 1, out=depths[1:])
        # the mass of a node: the weights of the rows through it (the root: all of them), in row order
        cell_orig = order[cell_r]  # the row each cell belongs to, as given
        cell_w = weights[cell_orig]
        mass = np.bincount(cell_node, weights=cell_w, minlength=n_new + 1)
        mass[0] = weights[order].sum()
        if n_src:
            smass = np.bincount(cell_node * n_src + sources[cell_orig], weights=cell_w,
                                minlength=(n_new + 1) * n_src).reshape(n_new + 1, n_src)
            smass[0] = np.bincount(sources[order], weights=weights[order], minlength=n_src)
        else:
            smass = np.zeros((n_new + 1, 0))
        # each node's source: its heaviest row's; among equal weights the row given first (a stable sort of
        # the rows as given by weight, heaviest first)
        best_first = np.argsort(-weights, kind="stable")
        rank = np.empty(n_rows, dtype=np.int64)
        rank[best_first] = np.arange(n_rows)
        source_index = np.empty(n_new + 1, dtype=np.int64)
        source_index[0] = -1
        source_index[1:] = sources[best_first[np.minimum.reduceat(rank[cell_orig], starts)]]
        trie._set(tokens, parents, depths, mass, smass, source_index, paths)
        return trie


def along_paths(trie: TokenTrie, values: np.ndarray, accumulate) -> np.ndarray:
    """[N] `accumulate` (np.multiply, np.minimum) of `values` along each node's path from depth 1 down to
    the node, the root's value kept: one cumulative operation over the trie's rows, in path order (the same
    floats as going depth by depth)."""
    paths = trie.paths
    out = np.array(values, dtype=np.float64)
    if paths.size:
        root = out[0]
        out[paths] = accumulate.accumulate(out[paths], axis=0)  # cells past a row's end write the root...
        out[0] = root  # ...which keeps its own value
    return out


def padded_rows(conts: Sequence[tuple[Sequence[int], float]], width: int | None = None
                ) -> tuple[np.ndarray, np.ndarray]:
    """[(tokens, weight)] -> (rows [C, L] padded with -1, weights [C]), in one pass over the tokens.
    width: L (at least the longest continuation); default the longest continuation's length."""
    lengths = np.fromiter((len(t) for t, _ in conts), dtype=np.int64, count=len(conts))
    weights = np.fromiter((w for _, w in conts), dtype=np.float64, count=len(conts))
    total = int(lengths.sum())
    longest = int(lengths.max()) if len(conts) else 0
    rows = np.full((len(conts), max(longest, width or 0)), PAD, dtype=np.int64)
    if total:
        flat = np.fromiter(chain.from_iterable(t for t, _ in conts), dtype=np.int64, count=total)
        row = np.repeat(np.arange(len(conts)), lengths)
        col = np.arange(total) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        rows[row, col] = flat
    return rows, weights


def row_tuples(rows: np.ndarray, weights: np.ndarray) -> list[tuple[tuple[int, ...], float]]:
    """(rows, weights) -> [(tokens, weight)]: padded_rows undone."""
    lengths = (rows != PAD).sum(axis=1).tolist()
    return [(tuple(r[:n]), w) for r, n, w in zip(rows.tolist(), lengths, weights.tolist())]


def match_strength(match_len: int | None) -> float:
    """How much to trust a source given the length of the context suffix it matched.

    1 - 2^-n: a 1-token match counts half, 4 tokens 94%. Sources that report no match length count fully.
    """
    if match_len is None:
        return 1.0
    return 0.0 if match_len <= 0 else 1.0 - 0.5**match_len


def mix(
    root_token: int,
    proposals: Iterable[tuple[str, float, float, Sequence[tuple[Sequence[int], float]]]],
) -> TokenTrie:
    """One trie from (source name, share, strength, [(tokens, weight), ...]) per source.

    Shares should sum to at most 1 over the configured sources: a source with nothing to say leaves
    its share unclaimed, which keeps the root mass (and every estimate below it) honest.
    """
    return mix_rows(root_token, [(name, share, strength, *padded_rows(conts))
                                 for name, share, strength, conts in proposals])


def mix_rows(root_token: int,
             proposals: Iterable[tuple[str, float, float, np.ndarray, np.ndarray]]) -> TokenTrie:
    """`mix` from (source name, share, strength, rows [C, L] padded with -1, weights [C]) per source: the
    drafter's path (the sources' `propose_rows`)."""
    proposals = list(proposals)
    names, strengths = [p[0] for p in proposals], [p[2] for p in proposals]
    used = [(s, share * strength, rows, w) for s, (_, share, strength, rows, w) in enumerate(proposals)
            if share > 0 and strength > 0 and len(w)]
    if not used:
        return TokenTrie(root_token, names, strengths)
    if all(rows.shape[1] for _, _, rows, _ in used) and _all_kept(used):
        parts = _scaled(used)  # the usual case: no per-source masks
    else:
        parts = _scaled_kept(used)
    if not parts:
        return TokenTrie(root_token, names, strengths)
    width = max(rows.shape[1] for _, rows, _ in parts)
    rows = np.full((sum(len(w) for _, _, w in parts), width), PAD, dtype=np.int64)
    at = 0
    for _, r, _ in parts:
        rows[at:at + len(r), : r.shape[1]] = r
        at += len(r)
    weights = np.concatenate([w for _, _, w in parts]) if len(parts) > 1 else parts[0][2]
    sources = np.repeat(np.array([s for s, _, _ in parts], dtype=np.int64), [len(w) for _, _, w in parts])
    return TokenTrie.build(root_token, names, strengths, rows, weights, sources)


def _all_kept(used: list) -> bool:
    """Whether every row of every source has a positive weight and a first token (one check over all of
    them: the sources' own rows always do, so the per-source masks are the exception)."""
    w = np.concatenate([w for _, _, _, w in used])
    first = np.concatenate([rows[:, 0] for _, _, rows, _ in used])
    return bool(((w > 0) & (first != PAD)).all())


def _scaled(used: list) -> list[tuple[int, np.ndarray, np.ndarray]]:
    """[(source, rows, weights scaled to share * strength in all)], each source's total summed as before
    (its own `sum`: the same float, so the same trie to the last bit)."""
    out = []
    for s, scale, rows, w in used:
        total = w.sum()
        if not total <= 0:
            out.append((s, rows, w * (scale / total)))
    return out


def _scaled_kept(used: list) -> list[tuple[int, np.ndarray, np.ndarray]]:
    """`_scaled` after dropping the rows without a positive weight or a first token."""
    kept = []
    for s, scale, rows, w in used:
        keep = (w > 0) & (rows[:, 0] != PAD) if rows.shape[1] else np.zeros(len(w), dtype=bool)
        kept.append((s, scale, rows[keep], w[keep]))
    return _scaled(kept)
