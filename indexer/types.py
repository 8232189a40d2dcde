"""Result types and errors shared by the indexer and its callers (the engine's draft sources)."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class Continuation:
    tokens: tuple[int, ...]  # up to max_len tokens that followed the matched suffix (never crosses a document)
    count: int  # raw occurrences (summed over shards; among the sampled occurrences when sampling)
    weight: float  # sum over shards of count * shard weight


def make_continuation(tokens: tuple, count: int, weight: float) -> Continuation:
    """Continuation(tokens, count, weight) without the frozen dataclass's per-field __setattr__ calls:
    a search builds up to 5,000 of them."""
    c = _new(Continuation)
    d = c.__dict__
    d["tokens"] = tokens
    d["count"] = count
    d["weight"] = weight
    return c


_new = object.__new__


@dataclass(frozen=True)
class SearchResult:
    match_len: int  # longest context suffix found (0: none)
    count: int  # occurrences of that suffix over all shards (exact, not sampled)
    continuations: list[Continuation] = field(default_factory=list)  # distinct, heaviest first


class SearchRows:
    """A search's answer as arrays, for the drafter (rest_lsp/engine): no object per continuation.

    rows [u, max_len] int64 token ids, padded with -1 after each continuation's end; counts [u] int64;
    weights [u] float64; heaviest first, as `SearchResult.continuations`. The arrays are read-only: a cached
    answer is shared by every caller."""

    __slots__ = ("match_len", "count", "rows", "counts", "weights", "_result")

    def __init__(self, match_len: int, count: int, rows: np.ndarray, counts: np.ndarray, weights: np.ndarray):
        self.match_len, self.count = match_len, count
        self.rows, self.counts, self.weights = rows, counts, weights
        for a in (rows, counts, weights):
            a.flags.writeable = False
        self._result: SearchResult | None = None

    @classmethod
    def empty(cls, match_len: int = 0, count: int = 0, max_len: int = 0) -> "SearchRows":
        return cls(match_len, count, np.full((0, max(0, max_len)), -1, dtype=np.int64), np.zeros(0, np.int64),
                   np.zeros(0))

    def result(self) -> SearchResult:
        """The same answer as Continuation objects (built once per answer)."""
        if self._result is None:
            lengths = (self.rows >= 0).sum(axis=1).tolist()
            conts = [make_continuation(tuple(r[:ln]), c, w) for r, ln, c, w in
                     zip(self.rows.tolist(), lengths, self.counts.tolist(), self.weights.tolist())]
            self._result = SearchResult(self.match_len, self.count, conts)
        return self._result


class IndexerError(Exception):
    """Base class of the indexer's errors: each carries a message meant for a person."""


class DatastoreNotFound(IndexerError):
    pass


class TokenizerMismatch(IndexerError):
    def __init__(self, stored: dict, given: dict):
        self.stored = stored
        self.given = given
        super().__init__(
            f"the datastore was built with tokenizer {stored.get('name')!r} "
            f"(vocab {stored.get('vocab_size')}, hash {str(stored.get('vocab_hash'))[:12]}) but "
            f"tokenizer {given.get('name')!r} (vocab {given.get('vocab_size')}, hash "
            f"{str(given.get('vocab_hash'))[:12]}) was requested (another vocabulary, or another encoding of "
            f"text into it); rebuild the datastore in that model's "
            f"tokenizer: rest-index build ROOT... --out DIR --tokenizer MODEL (the model directory, .gguf file "
            f"or hub id)"
        )


class CorruptShard(IndexerError):
    def __init__(self, shard_id: str, file: str, reason: str):
        self.shard_id = shard_id
        self.file = file
        self.reason = reason
        super().__init__(
            f"shard {shard_id} is damaged ({file}: {reason}); it is not served. Rebuild the datastore "
            f"(rest-index build ...) or open it with repair=True to re-index the affected documents"
        )


class CorruptManifest(IndexerError):
    pass


class TokenOutOfRange(IndexerError):
    pass
