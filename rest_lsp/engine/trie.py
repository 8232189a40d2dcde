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
Because parents come before their children, what accumulates along paths (the acceptance estimate, the
ranking's clamp) is one pass over the nodes in id order. Building and those passes are compiled loops
(restbase/jit.py): as numpy they were some forty small calls per step, most of a drafting step's cost.
"""
from __future__ import annotations

from bisect import bisect_left
from itertools import chain
from typing import Iterable, Sequence

import numpy as np

from restbase.jit import njit

PAD = -1  # after a continuation's last token in a padded row


class TokenTrie:
    """Continuations after a fixed root token; node 0 is the root (depth 0: the token already decided).

    Per node (arrays of N): `tokens`, `parents` (-1 for the root), `depths`, `mass` (the estimate), `smass`
    ([N, sources]: each source's part of the mass), `source_index` (the source of the heaviest continuation
    through the node; -1 for the root), `first_child` / `n_children` (the children are ids first_child ..
    first_child + n_children - 1, tokens ascending)."""

    def __init__(self, root_token: int, names: Sequence[str] = (), strengths: Sequence[float] = ()):
        self._name(names, strengths)
        self._set(np.array([root_token], dtype=np.int64), np.array([-1], dtype=np.int64),
                  np.zeros(1, dtype=np.int64), np.zeros(1), np.zeros((1, len(self.names))),
                  np.array([-1], dtype=np.int64), np.zeros(1, dtype=np.int64), np.ones(1, dtype=np.int64))

    def _name(self, names: Sequence[str], strengths: Sequence[float]) -> None:
        self.names = list(names)  # the sources, in the order of `smass`'s columns
        self.strengths = list(strengths) or [1.0] * len(self.names)

    def _set(self, tokens, parents, depths, mass, smass, source_index, n_children, first_child) -> None:
        self.tokens, self.parents, self.depths = tokens, parents, depths
        self.mass, self.smass, self.source_index = mass, smass, source_index
        self.n_children, self.first_child = n_children, first_child
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
    def mixed(cls, root_token: int, names: Sequence[str], strengths: Sequence[float], rows: np.ndarray,
              weights: np.ndarray, sources: np.ndarray, scales: np.ndarray) -> "TokenTrie":
        """The trie of continuations `rows` ([C, L] ids, padded with -1 after each row's end) with weights [C]
        from sources [C] (indices into `names`), each source's weights normalised to sum to its scale
        (scales [len(names)]: share times strength). Rows without a first token or a positive weight are
        left out, and so is a source whose weights sum to nothing. Rows that share a prefix share its nodes;
        each adds its weight to every node on its path."""
        return cls.from_arrays(names, strengths, mixed_trie_arrays(rows, weights, sources, scales, int(root_token)))

    @classmethod
    def from_arrays(cls, names: Sequence[str], strengths: Sequence[float], arrays: tuple) -> "TokenTrie":
        """The trie of `mixed_trie_arrays`' answer (tokens, parents, depths, mass, smass, source_index,
        n_children, first_child)."""
        trie = cls.__new__(cls)  # not through __init__: its root-only arrays would be replaced at once
        trie._name(names, strengths)
        trie._set(*arrays)
        return trie


@njit
def mixed_trie_arrays(rows, w, src, scale, root_token):
    """TokenTrie's arrays (see TokenTrie.mixed): the rows kept and scaled, sorted, and built into nodes."""
    n_src = len(scale)
    n = len(w)
    keep = np.zeros(n, np.bool_)
    for i in range(n):
        keep[i] = w[i] > 0 and rows.shape[1] > 0 and rows[i, 0] != PAD
    factor = np.full(n_src, np.nan)
    for s in range(n_src):
        mine = np.flatnonzero(keep & (src == s))
        total = _pairwise_sum(w[mine], 0, len(mine))  # numpy's summation order: the same float as w.sum()
        if len(mine) and not total <= 0:
            factor[s] = scale[s] / total
    kept = np.flatnonzero(keep & ~np.isnan(factor[src]))
    krows = rows[kept]
    ksrc = src[kept]
    kw = w[kept] * factor[ksrc]
    order = _lex_order(krows)
    rank = np.empty(len(kept), np.int64)  # each row's place by weight, heaviest first, ties to the earlier
    rank[np.argsort(-kw, kind="mergesort")] = np.arange(len(kept))
    sw = kw[order]
    return _build_trie(krows[order], sw, ksrc[order], rank[order], n_src, root_token,
                       _pairwise_sum(sw, 0, len(sw)))


@njit
def _pairwise_sum(a, lo, n):
    """sum(a[lo:lo + n]) added up as numpy's `sum` does (halves down to blocks of up to 128, each summed with
    eight accumulators): the tries stay the same to the last bit as when numpy summed. Without recursion:
    numba's disk cache cannot reload a recursive function (the process crashes)."""
    if n <= 128:
        return _block_sum(a, lo, n)
    # post-order over the halving tree: (lo, n, combine?) tasks, partial sums on a second stack
    task_lo, task_n, task_join = np.empty(128, np.int64), np.empty(128, np.int64), np.empty(128, np.bool_)
    sums = np.empty(128)
    tp, sp = 1, 0
    task_lo[0], task_n[0], task_join[0] = lo, n, False
    while tp:
        tp -= 1
        lo, n, join = task_lo[tp], task_n[tp], task_join[tp]
        if join:
            sums[sp - 2] = sums[sp - 2] + sums[sp - 1]
            sp -= 1
        elif n <= 128:
            sums[sp] = _block_sum(a, lo, n)
            sp += 1
        else:
            half = n // 2
            half -= half % 8
            task_lo[tp], task_n[tp], task_join[tp] = lo, n, True  # after both halves
            task_lo[tp + 1], task_n[tp + 1], task_join[tp + 1] = lo + half, n - half, False
            task_lo[tp + 2], task_n[tp + 2], task_join[tp + 2] = lo, half, False  # the left half first
            tp += 3
    return sums[0]


@njit
def _block_sum(a, lo, n):
    if n < 8:
        res = 0.0
        for i in range(lo, lo + n):
            res += a[i]
        return res
    r = a[lo:lo + 8].copy()
    i = 8
    while i < n - (n % 8):
        for j in range(8):
            r[j] += a[lo + i + j]
        i += 8
    res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]))
    while i < n:
        res += a[lo + i]
        i += 1
    return res


@njit
def _lex_order(rows):
    """The rows' order sorted lexicographically (PAD, -1, first: a prefix before its extensions), stable:
    a bottom-up merge sort of row indices."""
    n = rows.shape[0]
    order = np.arange(n)
    tmp = np.empty(n, np.int64)
    run = 1
    while run < n:
        for lo in range(0, n, 2 * run):
            mid, hi = min(lo + run, n), min(lo + 2 * run, n)
            i, j, k = lo, mid, lo
            while i < mid and j < hi:
                if _row_less(rows, order[j], order[i]):
                    tmp[k] = order[j]
                    j += 1
                else:
                    tmp[k] = order[i]
                    i += 1
                k += 1
            tmp[k:k + mid - i] = order[i:mid]
            k += mid - i
            tmp[k:k + hi - j] = order[j:hi]
        order, tmp = tmp, order
        run *= 2
    return order


@njit
def _row_less(rows, a, b):
    for d in range(rows.shape[1]):
        if rows[a, d] != rows[b, d]:
            return rows[a, d] < rows[b, d]
    return False


@njit
def _build_trie(rows, w, src, rank, n_src, root_token, total):
    """TokenTrie's arrays from rows [C, L] sorted lexicographically (padded with PAD after each end, every row
    at least one token), their weights w [C], sources src [C] and places by weight rank [C].

    A node starts at a cell (depth d, row r) where row r differs from the row above at column d or before;
    numbering such cells depth by depth, row by row, numbers nodes depth by depth with each node's rows
    adjacent. Masses add up cell by cell in that order (the order numpy's bincount used: the same floats)."""
    n_rows, width = rows.shape
    differs = np.zeros(n_rows, np.int64)  # the first column where a row differs from the row above
    length = np.zeros(n_rows, np.int64)
    n_nodes = 1
    for r in range(n_rows):
        d = 0
        if r > 0:
            while d < width and rows[r, d] == rows[r - 1, d]:
                d += 1
        differs[r] = d
        n = 0
        while n < width and rows[r, n] != PAD:
            n += 1
        length[r] = n
        n_nodes += max(0, n - d)
    tokens = np.empty(n_nodes, np.int64)
    parents = np.empty(n_nodes, np.int64)
    depths = np.empty(n_nodes, np.int64)
    mass = np.zeros(n_nodes)
    smass = np.zeros((n_nodes, n_src))
    best = np.full(n_nodes, n_rows, np.int64)  # the smallest rank through each node
    source_index = np.full(n_nodes, -1, np.int64)
    tokens[0], parents[0], depths[0] = root_token, -1, 0
    at = np.zeros(n_rows, np.int64)  # each row's node at the depth before (the root first)
    node = 0
    for d in range(width):
        for r in range(n_rows):
            if d >= length[r]:
                continue
            if d >= differs[r]:
                node += 1
                tokens[node], parents[node], depths[node] = rows[r, d], at[r], d + 1
                cur = node
            else:  # the same node as the row above, which this depth has already visited
                cur = at[r - 1]
            at[r] = cur
            mass[cur] += w[r]
            if n_src:
                smass[cur, src[r]] += w[r]
            if rank[r] < best[cur]:
                best[cur], source_index[cur] = rank[r], src[r]
    mass[0] = total
    for r in range(n_rows):
        if n_src:
            smass[0, src[r]] += w[r]
    n_children = np.zeros(n_nodes, np.int64)
    for i in range(1, n_nodes):
        n_children[parents[i]] += 1
    first_child = np.empty(n_nodes, np.int64)  # children are one run of ids, the runs in parent order
    nxt = 1
    for i in range(n_nodes):
        first_child[i] = nxt
        nxt += n_children[i]
    return tokens, parents, depths, mass, smass, source_index, n_children, first_child


def path_products(trie: TokenTrie, values: np.ndarray) -> np.ndarray:
    """[N] the product of `values` along each node's path from depth 1 down to the node (the root's value
    kept): the acceptance estimate from its conditionals."""
    return path_product_arrays(trie.parents, np.asarray(values, dtype=np.float64))


@njit
def path_product_arrays(parents, values):
    out = values.copy()
    for i in range(1, len(parents)):  # parents come first: the parent's product is final
        p = parents[i]
        if p > 0:
            out[i] = out[p] * values[i]
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
    used = [(s, rows, w) for s, (_, share, strength, rows, w) in enumerate(proposals)
            if share > 0 and strength > 0 and len(w)]
    width = max((rows.shape[1] for _, rows, _ in used), default=0)
    if not width:
        return TokenTrie(root_token, names, strengths)
    rows = np.full((sum(len(w) for _, _, w in used), width), PAD, dtype=np.int64)
    at = 0
    for _, r, _ in used:
        rows[at:at + len(r), : r.shape[1]] = r
        at += len(r)
    weights = np.concatenate([w for _, _, w in used]) if len(used) > 1 else np.asarray(used[0][2], np.float64)
    sources = np.repeat(np.array([s for s, _, _ in used], dtype=np.int64), [len(w) for _, _, w in used])
    scales = np.array([share * strength for _, share, strength, _, _ in proposals], dtype=np.float64)
    return TokenTrie.mixed(root_token, names, strengths, rows, weights, sources, scales)
