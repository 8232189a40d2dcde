"""Draft sources: where the continuations of the current context come from.

- `DatastoreSource`: the corpus / repository suffix-array datastore (indexer's `Datastore.search`).
- `ContextSource`: prompt lookup over the prompt and the open buffers, every match with n >= 1 as a tree.
- `HistorySource`: the text this process generated before (users accept completions and then repeat them).
- `RecyclingSource`: the model's own earlier top-k predictions per token (Token Recycling / SAM-Decoding).
- `PaperSource`: REST as published (the baseline `rest-lsp bench` compares with).

Each returns weighted continuations; the drafter (rest_lsp/engine/drafter.py) normalises them per source and
mixes the sources by share (rest_lsp/engine/policy.py). The drafter asks for them as arrays (`propose_rows`: a
padded [C, L] matrix and C weights), which the datastore, context and history sources build without a Python
object per continuation or per token; `propose` is the same answer as tuples. `last_match_len` (the context suffix a source matched;
None where that means nothing) lets the mixer trust long matches more than short ones.
"""
from __future__ import annotations

from typing import Protocol, Sequence, runtime_checkable

import numpy as np

from .trie import PAD, padded_rows, row_tuples

Rows = tuple[np.ndarray, np.ndarray]  # (rows [C, L] int64 padded with PAD after each end, weights [C] float64)


@runtime_checkable
class DraftSource(Protocol):
    """What the drafter calls on a source. Sources subclass it and override what they need; the defaults
    are no-ops, so the drafter calls every hook on every source without probing for it."""

    name: str
    last_match_len: int | None = None  # the context suffix the last `propose` matched (None: not meaningful)
    topk: int = 0  # how many of the model's top tokens per verified row `observe_forward` wants (0: none)

    def propose(self, context: Sequence[int], max_len: int) -> list[tuple[tuple[int, ...], float]]:
        """Continuations of the context with weights (any scale); the drafter normalises per source."""
        ...

    def propose_rows(self, context: Sequence[int], max_len: int) -> Rows:
        """`propose` as arrays: what the drafter calls. Sources that can build the rows directly override it."""
        return padded_rows(self.propose(context, max_len))

    def begin(self, context: Sequence[int]) -> None:
        """A generation starts (or resumes) after `context`; what `observe` appends continues it."""

    def observe(self, tokens: Sequence[int]) -> None:
        """Tokens appended to the context."""

    def observe_forward(self, tokens: Sequence[int], topk: Sequence[Sequence[int]],
                        parents: Sequence[int] | None = None) -> None:
        """The model's top-`topk` next tokens after each verified row (tokens [q], parents [q])."""


def suffix_matches(
    text: np.ndarray, query: np.ndarray, n_max: int, max_len: int, limit: int, exclude_end: bool = False
) -> list[tuple[int, int]]:
    """(match length n >= 1, end position) of places in `text` where a suffix of `query` occurs.

    Only places with at least one following token count; the longest (then latest) `limit` are kept.
    exclude_end: text ends with query itself (searching the context in itself), so skip that trivial match.
    """
    lengths, ends = suffix_match_arrays(text, query, n_max, limit, exclude_end)
    return list(zip(lengths.tolist(), ends.tolist()))


def suffix_match_arrays(text: np.ndarray, query: np.ndarray, n_max: int, limit: int,
                        exclude_end: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """`suffix_matches` as arrays (lengths [m], ends [m]), longest then latest first."""
    none = np.zeros(0, dtype=np.int64)
    if len(text) < 2 or len(query) == 0:
        return none, none
    ends = np.flatnonzero(text[:-1] == query[-1])  # positions where the last query token occurs
    if exclude_end:
        ends = ends[ends < len(text) - 1]
    if len(ends) == 0:
        return none, none
    lengths = np.ones(len(ends), dtype=np.int64)
    alive = np.arange(len(ends))  # candidates still matching: fewer and fewer, so each round costs less
    for k in range(1, min(n_max, len(query))):
        pos = ends[alive] - k
        ok = pos >= 0
        ok[ok] = text[pos[ok]] == query[-1 - k]
        alive = alive[ok]
        if not len(alive):
            break
        lengths[alive] += 1
    order = np.lexsort((-ends, -lengths))[:limit]  # longest first, then latest
    return lengths[order], ends[order]


def continuation_rows(text: np.ndarray, ends: np.ndarray, max_len: int) -> np.ndarray:
    """[m, max_len] the tokens after each end position, padded with PAD past the text's end and from a
    negative token on (a separator, HistorySource: never run into the next text)."""
    idx = ends[:, None] + 1 + np.arange(max_len)[None, :]
    rows = text[np.minimum(idx, len(text) - 1)]
    cut = np.logical_or.accumulate((idx >= len(text)) | (rows < 0), axis=1)
    rows[cut] = PAD
    return rows


def weight_for_match(n: int) -> float:
    """Longer suffix matches predict better: weight grows with the match length (n^2)."""
    return float(n * n)


class _MatchingSource(DraftSource):
    """Continuations after every suffix match in a set of token texts, weighted by match length."""

    name = "match"

    def __init__(self, n_max: int = 16, max_matches: int = 16):
        self.n_max = n_max
        self.max_matches = max_matches
        self.last_match_len: int | None = 0

    def _texts(self, context: np.ndarray) -> list[tuple[np.ndarray, bool]]:
        raise NotImplementedError

    def propose(self, context: Sequence[int], max_len: int) -> list[tuple[tuple[int, ...], float]]:
        return row_tuples(*self.propose_rows(context, max_len))

    def propose_rows(self, context: Sequence[int], max_len: int) -> Rows:
        ctx = np.asarray(context, dtype=np.int64)
        query = ctx[-self.n_max:]
        lengths, rows = [], []
        for text, is_context in self._texts(ctx):
            n, ends = suffix_match_arrays(text, query, self.n_max, self.max_matches, is_context)
            if len(n):
                lengths.append(n)
                rows.append(continuation_rows(text, ends, max_len))
        if not lengths:
            self.last_match_len = 0
            return np.full((0, max(0, max_len)), PAD, dtype=np.int64), np.zeros(0)
        n = np.concatenate(lengths) if len(lengths) > 1 else lengths[0]
        order = np.argsort(-n, kind="stable")[: self.max_matches]  # longest first; texts in order among equals
        n = n[order]
        rows = (np.concatenate(rows) if len(rows) > 1 else rows[0])[order]
        self.last_match_len = int(n[0])
        keep = rows[:, 0] != PAD if max_len > 0 else np.zeros(len(n), dtype=bool)
        return rows[keep], (n[keep] * n[keep]).astype(np.float64)  # weight_for_match, per row


class ContextSource(_MatchingSource):
    """Prompt lookup over the context itself and the open buffers, as a tree of all matches (n >= 1)."""

    name = "context"

    def __init__(self, n_max: int = 16, max_matches: int = 16):
        super().__init__(n_max, max_matches)
        self.buffers: dict[str, np.ndarray] = {}

    # copy-on-write: the inference thread may be iterating the old dict while the LSP thread feeds a buffer
    def set_buffer(self, name: str, tokens: Sequence[int]) -> None:
        self.buffers = {**self.buffers, name: np.asarray(tokens, dtype=np.int64)}

    def drop_buffer(self, name: str) -> None:
        if name in self.buffers:
            self.buffers = {k: v for k, v in self.buffers.items() if k != name}

    def _texts(self, context: np.ndarray) -> list[tuple[np.ndarray, bool]]:
        return [(context, True)] + [(b, False) for b in self.buffers.values()]


class HistorySource(_MatchingSource):
    """The tokens this process generated before (the latest `capacity`); generations never run together."""

    name = "history"
    SEPARATOR = -1

    def __init__(self, n_max: int = 16, max_matches: int = 16, capacity: int = 65536):
        super().__init__(n_max, max_matches)
        self.capacity = capacity
        self._buf = np.empty(2 * capacity, dtype=np.int64)  # appended in place; halved when full
        self._n = 0
        self.total = 0  # tokens appended so far (separators included), kept or not: a position for `since`

    def begin(self, context: Sequence[int]) -> None:
        """A new generation starts: separate it from the previous one."""
        if self._n and self._buf[self._n - 1] != self.SEPARATOR:
            self.observe([self.SEPARATOR])

    def observe(self, tokens: Sequence[int]) -> None:
        new = np.asarray(tokens, dtype=np.int64)[-self.capacity :]
        self.total += len(new)
        if self._n + len(new) > len(self._buf):
            keep = self._buf[self._n - (self.capacity - len(new)) : self._n].copy() if self.capacity > len(new) else new[:0]
            self._buf[: len(keep)] = keep
            self._n = len(keep)
        self._buf[self._n : self._n + len(new)] = new
        self._n += len(new)

    def tokens(self) -> np.ndarray:
        """What is kept, oldest first, generations separated by SEPARATOR (a copy: `history.save_history`)."""
        return self._buf[: self._n].copy()

    def extend(self, tokens: Sequence[int]) -> None:
        """Add earlier output (`history.load_history`) as generations of their own."""
        self.begin(())
        self.observe(tokens)

    def since(self, total: int) -> np.ndarray:
        """The tokens appended after `self.total` was `total` (those still kept; a copy)."""
        n = min(self.total - total, self._n)
        return self._buf[self._n - n : self._n].copy() if n > 0 else self._buf[:0].copy()

    def reset(self, tokens: Sequence[int]) -> None:
        """Hold exactly `tokens` (the latest `capacity` of them)."""
        self._n = 0
        self.observe(tokens)

    def _texts(self, context: np.ndarray) -> list[tuple[np.ndarray, bool]]:
        return [(self._buf[: self._n], False)]


class DatastoreSource(DraftSource):
    """Continuations from indexer's suffix-array datastore (corpus and repository shards).

    The longest suffix match decides first; its continuations are often few and rare, so the continuations of
    the shorter `backoff` suffixes (2 tokens by default) are mixed in too, each level normalised and weighted
    by its match length squared (`weight_for_match`): on 20 HumanEval prompts this added 0.02-0.06 tokens per
    step (docs/engine.md). k: occurrences sampled per level, spread evenly over the match range; 256 keeps the
    same heavy continuations as 5,000 at a fifth of the time (the reference code's 5,000 stays in `paper`).
    max_len: continuations at most this long (None: the engine's draft length); the corpus uses
    CORPUS_MAX_LEN. datastore: anything with indexer's `search_rows` (a Datastore, the service's DatastoreSet).
    """

    def __init__(self, datastore, name: str = "corpus", n_max: int = 16, n_min: int = 2, k: int = 256,
                 max_continuations: int = 32, backoff: Sequence[int] = (2,), max_len: int | None = None):
        self.datastore = datastore
        self.name = name
        self.n_max, self.n_min, self.k = n_max, n_min, k
        self.max_len = max_len
        self.max_continuations = max_continuations
        self.backoff = tuple(backoff)
        self.last_match_len: int | None = 0

    def _search(self, context: Sequence[int], n_max: int, n_min: int, max_len: int) -> FoundRows:
        # limit: build only the heaviest continuations (the datastore's search takes it: indexer.store)
        return self.datastore.search_rows(context, n_max=n_max, n_min=n_min, k=self.k, max_len=max_len,
                                          limit=self.max_continuations)

    def propose(self, context: Sequence[int], max_len: int) -> list[tuple[tuple[int, ...], float]]:
        return row_tuples(*self.propose_rows(context, max_len))

    def propose_rows(self, context: Sequence[int], max_len: int) -> Rows:
        max_len = min(max_len, self.max_len) if self.max_len else max_len
        result = self._search(context, self.n_max, self.n_min, max_len)
        self.last_match_len = n = result.match_len
        levels = [(n, result)] + [(b, self._search(context, b, b, max_len))
                                  for b in self.backoff if self.n_min <= b < n]
        return merge_levels(levels, self.max_continuations, max_len)


class FoundRows(Protocol):
    """What DatastoreSource reads of a search (indexer.types.SearchRows)."""

    match_len: int
    rows: np.ndarray
    weights: np.ndarray


def merge_levels(levels: Sequence[tuple[int, FoundRows]], max_continuations: int, max_len: int) -> Rows:
    """One row per distinct continuation over the match levels [(n, search rows)]: each level's heaviest
    `max_continuations` normalised to sum 1 and weighted n^2 (`weight_for_match`), a continuation found at
    several levels summing its parts. Rows come in the order first seen (level by level, heaviest first)."""
    out_rows: np.ndarray | None = None
    out_w: np.ndarray | None = None
    for n_level, res in levels:
        rows, w = res.rows[:max_continuations], res.weights[:max_continuations]
        if rows.shape[1] == 0:
            continue
        keep = rows[:, 0] != PAD
        if not keep.all():
            rows, w = rows[keep], w[keep]
        total = sum(w.tolist())  # in order, as a Python sum: the same float as summing the weights one by one
        if not total > 0:
            continue
        part = float(weight_for_match(n_level)) * w / total
        if out_rows is None:
            out_rows, out_w = rows, part
            continue
        # each level's rows are distinct: a row equals at most one row found before
        same = (rows[:, None, :] == out_rows[None, :, :]).all(axis=2)  # [new, old]
        seen = same.any(axis=1)
        if seen.any():
            out_w = out_w.copy()
            np.add.at(out_w, same[seen].argmax(axis=1), part[seen])
        out_rows = np.concatenate([out_rows, rows[~seen]])
        out_w = np.concatenate([out_w, part[~seen]])
    if out_rows is None:
        return np.full((0, max(0, max_len)), PAD, dtype=np.int64), np.zeros(0)
    return out_rows, out_w


class RecyclingSource(DraftSource):
    """The model's own recent top-k next tokens, keyed by the last 1..`order` tokens (Token Recycling, with an
    n-gram backoff as in SAM-Decoding), expanded into a small tree.

    The engine reports the top-k of every row it verifies (`observe_forward`); each row's key is the tokens
    before it (the context and the row's tree path), and the latest top-k per key is kept. A draft follows the
    table from the context's last tokens, using at each node the longest key seen before: the model's choice
    after "x = y" is a better guess than its choice after "y" alone.
    """

    name = "recycle"

    def __init__(self, k: int = 4, depth: int = 4, branching: Sequence[int] = (4, 2, 1, 1), order: int = 3,
                 capacity: int = 1 << 18):
        self.k = self.topk = k
        self.depth = depth
        self.branching = tuple(branching)
        self.order = order
        self.capacity = capacity  # keys kept; the oldest go first
        self.table: dict[tuple[int, ...], tuple[int, ...]] = {}
        self.last_match_len: int | None = None
        self._tail: list[int] = []  # the last `order` context tokens the engine reported

    def begin(self, context: Sequence[int]) -> None:
        self._tail = [int(t) for t in context[-self.order :]]

    def observe(self, tokens: Sequence[int]) -> None:
        self._tail = (self._tail + [int(t) for t in tokens])[-self.order :]

    def observe_forward(self, tokens: Sequence[int], topk: Sequence[Sequence[int]],
                        parents: Sequence[int] | None = None) -> None:
        """tokens [q] fed to the model (tokens[0] is the context's last token, already observed), topk [q, k]
        its most likely next tokens after each, parents [q] the tree (None: a chain)."""
        before = self._tail[:-1]  # the context before tokens[0]
        paths: list[list[int]] = []
        for i, (tok, nxt) in enumerate(zip(tokens, topk)):
            p = -1 if i == 0 else (i - 1 if parents is None else parents[i])
            path = (paths[p] if p >= 0 else before)[-(self.order - 1) :] + [int(tok)] if self.order > 1 else [int(tok)]
            paths.append(path)
            value = tuple(int(t) for t in nxt[: self.k])
            for n in range(1, min(self.order, len(path)) + 1):
                key = tuple(path[-n:])
                self.table.pop(key, None)  # re-insert: the dict's order is the eviction order
                self.table[key] = value
        while len(self.table) > self.capacity:
            del self.table[next(iter(self.table))]

    def _lookup(self, tail: Sequence[int]) -> tuple[int, ...]:
        """The top-k after the longest suffix of `tail` seen as a key (empty: none)."""
        for n in range(min(self.order, len(tail)), 0, -1):
            hit = self.table.get(tuple(tail[-n:]))
            if hit:
                return hit
        return ()

    def propose(self, context: Sequence[int], max_len: int) -> list[tuple[tuple[int, ...], float]]:
        if not context:
            return []
        out: list[tuple[tuple[int, ...], float]] = []
        base = [int(t) for t in context[-self.order :]]

        last = min(self.depth, max_len)

        def expand(path: tuple[int, ...], weight: float, level: int) -> None:
            # a leaf at the last level needs no lookup (a third of them went to waste there)
            nxt = self._lookup(base + list(path)) if level < last else ()
            width = self.branching[level] if level < len(self.branching) else 1
            if not nxt:
                if path:
                    out.append((path, weight))
                return
            for rank, tok in enumerate(nxt[:width]):
                expand(path + (tok,), weight / (rank + 1), level + 1)  # lower ranks are less likely

        expand((), 1.0, 0)
        return out

    def propose_rows(self, context: Sequence[int], max_len: int) -> Rows:
        # a handful of short paths: padded in Python and converted once (padded_rows' several numpy calls
        # cost more than the tuples themselves here)
        conts = self.propose(context, max_len)
        if not conts:
            return np.zeros((0, 0), dtype=np.int64), np.zeros(0)
        width = max(len(t) for t, _ in conts)
        rows = np.array([t + (PAD,) * (width - len(t)) for t, _ in conts], dtype=np.int64)
        return rows, np.array([w for _, w in conts], dtype=np.float64)


# A generic corpus's continuations are cut at 6 tokens: on the 144 HumanEval prompts not benchmarked (a
# replay, 20-prompt chunks) M stays within 0.004 at 4-5 nodes and gains 0.02 at 64, as the tree's deep
# nodes go to the other sources, while drafting takes about 0.3 ms less per step (docs/engine.md). The
# repository and the context keep the full draft length: their long runs are the user's own idioms.
CORPUS_MAX_LEN = 6


class PaperSource(DraftSource):
    """REST as published: the longest context suffix (16 down to 2 tokens) found in the datastore, and the
    continuations of its first k occurrences in suffix-array order (a biased sample when there are more than
    k: the reference implementation's behaviour), weighted by raw counts."""

    name = "paper"

    def __init__(self, datastore, n_max: int = 16, n_min: int = 2, k: int = 5000):
        self.datastore = datastore
        self.n_max, self.n_min, self.k = n_max, n_min, k
        self.last_match_len: int | None = 0

    def propose(self, context: Sequence[int], max_len: int) -> list[tuple[tuple[int, ...], float]]:
        r = self.datastore.search(context, n_max=self.n_max, n_min=self.n_min, k=self.k, max_len=max_len,
                                  first_k=True)
        self.last_match_len = r.match_len
        return [(c.tokens, float(c.count)) for c in r.continuations]  # raw counts, as the reference weighs
