"""Draft sources: where the continuations of the current context come from.

- `DatastoreSource`: the corpus / repository suffix-array datastore (indexer's `Datastore.search`).
- `ContextSource`: prompt lookup over the prompt and the open buffers, every match with n >= 1 as a tree.
- `PromptLookupSource`: prompt lookup decoding: the latest match of the longest suffix (<= 3 tokens), one chain.
- `HistorySource`: the text this process generated before (users accept completions and then repeat them).
- `RecyclingSource`: the model's own earlier top-k predictions per token (Token Recycling / SAM-Decoding).
- `PaperSource`: REST as published (the baseline `rest-lsp bench` compares with).

Each returns weighted continuations; the drafter (rest_lsp/engine/drafter.py) normalises them per source and
mixes the sources by share (rest_lsp/engine/policy.py). The drafter asks for them as arrays (`propose_rows`: a
padded [C, L] matrix and C weights), which the datastore, context and history sources build without a Python
object per continuation or per token, in compiled loops (rest_lsp/engine/kernels_sources.py); `propose` is the
same answer as tuples. `last_match_len` (the context suffix a source matched; None where that means nothing)
lets the mixer trust long matches more than short ones.
"""
from __future__ import annotations

from typing import Protocol, Sequence, runtime_checkable

import numpy as np

from . import kernels_sources as kernels
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
    """`suffix_matches` as arrays (lengths [m], ends [m] int64), longest then latest first.

    exclude_end needs nothing done: a match needs a following token, so the text's own end never counts."""
    return kernels.suffix_match_arrays(text, query, n_max, limit)


def continuation_rows(text: np.ndarray, ends: np.ndarray, max_len: int) -> np.ndarray:
    """[m, max_len] the tokens after each end position, padded with PAD past the text's end and from a
    negative token on (a separator, HistorySource: never run into the next text)."""
    return kernels.continuation_rows(text, ends, max_len)


def weight_for_match(n: int) -> float:
    """Longer suffix matches predict better: weight grows with the match length (n^2)."""
    return float(n * n)


_NO_TOKENS = np.zeros(0, dtype=np.int64)
_NO_BOUNDS = np.zeros(1, dtype=np.int64)  # no text after the first


def join_texts(texts: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """texts as one int64 array [sum of lengths] and bounds [len(texts) + 1]: text i is
    joined[bounds[i]:bounds[i+1]]."""
    if not texts:
        return _NO_TOKENS, _NO_BOUNDS
    bounds = np.zeros(len(texts) + 1, dtype=np.int64)
    np.cumsum([len(t) for t in texts], out=bounds[1:])
    return np.concatenate(texts).astype(np.int64, copy=False), bounds


class _MatchingSource(DraftSource):
    """Continuations after every suffix match in a set of token texts, weighted by match length."""

    name = "match"

    def __init__(self, n_max: int = 16, max_matches: int = 16):
        self.n_max = n_max
        self.max_matches = max_matches
        self.last_match_len: int | None = 0

    def _texts(self, context: np.ndarray) -> list[tuple[np.ndarray, bool]]:
        """The texts searched, in order, each with whether it is the context itself."""
        raise NotImplementedError

    def _joined(self, context: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The texts as kernels.match_rows takes them: (first [a], rest [b], bounds [T+1])."""
        raise NotImplementedError

    def propose(self, context: Sequence[int], max_len: int) -> list[tuple[tuple[int, ...], float]]:
        return row_tuples(*self.propose_rows(context, max_len))

    def propose_rows(self, context: Sequence[int], max_len: int) -> Rows:
        """Each text's `max_matches` longest (then latest) matches; of those the `max_matches` longest (texts
        in order among equals) give rows [k, max_len] weighted n^2 [k], rows without a first token dropped."""
        ctx = np.asarray(context, dtype=np.int64)
        first, rest, bounds = self._joined(ctx)
        rows, weights, n = kernels.match_rows(first, rest, bounds, ctx[-self.n_max:], self.n_max,
                                              self.max_matches, max_len)
        self.last_match_len = int(n)
        return rows, weights


class ContextSource(_MatchingSource):
    """Prompt lookup over the context itself and the open buffers, as a tree of all matches (n >= 1)."""

    name = "context"

    def __init__(self, n_max: int = 16, max_matches: int = 16):
        super().__init__(n_max, max_matches)
        self.buffers: dict[str, np.ndarray] = {}
        # the buffers joined in one array for the kernel, with the dict they were joined from: rebuilt only
        # when the dict is replaced (every change replaces it), not on every step
        self._joined_buffers: tuple[dict[str, np.ndarray], np.ndarray, np.ndarray] = ({}, _NO_TOKENS, _NO_BOUNDS)

    # copy-on-write: the inference thread may be iterating the old dict while the LSP thread feeds a buffer
    def set_buffer(self, name: str, tokens: Sequence[int]) -> None:
        self.buffers = {**self.buffers, name: np.asarray(tokens, dtype=np.int64)}

    def drop_buffer(self, name: str) -> None:
        if name in self.buffers:
            self.buffers = {k: v for k, v in self.buffers.items() if k != name}

    def _texts(self, context: np.ndarray) -> list[tuple[np.ndarray, bool]]:
        return [(context, True)] + [(b, False) for b in self.buffers.values()]

    def _joined(self, context: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        buffers = self.buffers  # read once: the LSP thread may replace it meanwhile
        joined = self._joined_buffers
        if joined[0] is not buffers:
            joined = (buffers, *join_texts(list(buffers.values())))
            self._joined_buffers = joined
        return context, joined[1], joined[2]


class PromptLookupSource(_MatchingSource):
    """Prompt lookup decoding (Saxena 2023; transformers' `prompt_lookup_num_tokens`, vLLM's `ngram`
    speculator): the context's last n tokens, n from `n_max` down to 1, found earlier in the context (the
    prompt and the output so far, no open buffers), and the tokens after the latest such place as one chain.
    The drafter cuts it at its draft length; the `pld` policy (policy.py) verifies it whole.

    Example, n_max 3, draft length 4, context  a b c d b c e f b c:
        "f b c" occurs nowhere earlier; "b c" occurs at 1-2 and 4-5, the latest is 4-5 -> one row "e f b c".
    transformers takes the earliest place instead (here "d b c e") and n from 2 down.

    The matching is the context source's (the same compiled kernel), keeping one match instead of a tree."""

    name = "lookup"

    def __init__(self, n_max: int = 3):
        super().__init__(n_max, max_matches=1)

    def _texts(self, context: np.ndarray) -> list[tuple[np.ndarray, bool]]:
        return [(context, True)]

    def _joined(self, context: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return context, _NO_TOKENS, _NO_BOUNDS


class SnippetSource(ContextSource):
    """Prompt lookup over the repository snippets the prompts hold (rest_lsp/service/crossfile.py): the same
    matches ContextSource finds in a prompt's cross-file block, drafted and counted as their own source, so that
    what the selected snippets are worth shows in the accepted tokens by source. The caller keeps one buffer per
    document: the snippets of the block its prompts start with."""

    name = "snippets"

    def _texts(self, context: np.ndarray) -> list[tuple[np.ndarray, bool]]:
        return [(b, False) for b in self.buffers.values()]

    def _joined(self, context: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return (_NO_TOKENS, *super()._joined(context)[1:])


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

    def _joined(self, context: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return self._buf[: self._n], _NO_TOKENS, _NO_BOUNDS


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
    out_rows, out_w = np.zeros((0, 0), dtype=np.int64), np.zeros(0)  # u == 0: add_level takes any width
    for n_level, res in levels:
        if res.rows.shape[1]:  # no tokens at all (max_len 0): nothing to add
            out_rows, out_w = kernels.add_level(out_rows, out_w, res.rows, res.weights, n_level, max_continuations)
    if not len(out_rows):
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

    def _lookup(self, tail: tuple[int, ...]) -> tuple[int, ...]:
        """The top-k after the longest suffix of `tail` seen as a key (empty: none)."""
        get = self.table.get
        for n in range(min(self.order, len(tail)), 0, -1):
            hit = get(tail[-n:])  # a tuple's slice is the key itself: no list or tuple built per try
            if hit:
                return hit
        return ()

    def propose(self, context: Sequence[int], max_len: int) -> list[tuple[tuple[int, ...], float]]:
        if len(context) == 0:
            return []
        out: list[tuple[tuple[int, ...], float]] = []
        order, lookup = self.order, self._lookup
        last = min(self.depth, max_len)

        def expand(path: tuple[int, ...], tail: tuple[int, ...], weight: float, level: int) -> None:
            # tail: the context's and the path's last `order` tokens, all a lookup reads, carried down
            # a leaf at the last level needs no lookup (a third of them went to waste there)
            nxt = lookup(tail) if level < last else ()
            width = self.branching[level] if level < len(self.branching) else 1
            if not nxt:
                if path:
                    out.append((path, weight))
                return
            for rank, tok in enumerate(nxt[:width]):  # lower ranks are less likely
                expand(path + (tok,), (tail + (tok,))[-order:], weight / (rank + 1), level + 1)

        expand((), tuple(int(t) for t in context[-order:]), 1.0, 0)
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
