"""Saved KV caches of earlier prompts, so that no text is prefilled twice while its KV fits in memory.

The verifier holds one cache (the prompt being worked on). When another prompt needs it, the engine saves the
current cache here (`Verifier.export_state`) and brings back the saved state that shares the longest prefix
with the new prompt (`Verifier.import_state`); what differs past that prefix is computed again. Entries are
kept least-recently-used first out within a byte budget; a state whose tokens extend an older one of the same
key (document) replaces it.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
import torch

from .verifier import KVState


def common_prefix(a: Sequence[int] | np.ndarray, b: Sequence[int] | np.ndarray) -> int:
    """Length of the longest common prefix of two token sequences."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = np.flatnonzero(np.asarray(a[:n], dtype=np.int64) != np.asarray(b[:n], dtype=np.int64))
    return int(diff[0]) if len(diff) else n


@dataclass(eq=False)
class Entry:
    key: str | None  # what the state belongs to (a document URI), for replacing and reporting
    tokens: np.ndarray  # [n] int64: the tokens whose keys/values the state holds
    state: KVState
    logits: torch.Tensor | None  # [V] after the last token, when known (a prompt needs no forward then)
    scorer: Callable[[torch.Tensor], torch.Tensor] | None = None  # exact logits of given ids (with logits)
    used: int = field(default=0)

    @property
    def nbytes(self) -> int:
        return self.state.nbytes + (0 if self.logits is None else self.logits.nbytes)


class KVPool:
    """KV states by longest shared prefix, within `budget_bytes` (0: keep nothing)."""

    def __init__(self, budget_bytes: int = 0):
        self.budget_bytes = max(0, int(budget_bytes))
        self._entries: list[Entry] = []
        self._clock = itertools.count(1)
        self.hits = 0  # states brought back
        self.evicted = 0  # states dropped for room

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def nbytes(self) -> int:
        return sum(e.nbytes for e in self._entries)

    def put(self, key: str | None, tokens: Sequence[int], state: KVState, logits: torch.Tensor | None,
            scorer: Callable[[torch.Tensor], torch.Tensor] | None = None) -> None:
        """Keep a state (evicting the least recently used for room; one larger than the budget is not kept)."""
        arr = np.asarray(tokens, dtype=np.int64)
        # an older state of the same key whose tokens this one extends holds nothing this one lacks
        self._entries = [e for e in self._entries
                         if not (e.key == key and len(e.tokens) <= len(arr) and common_prefix(e.tokens, arr) == len(e.tokens))]
        entry = Entry(key, arr, state, logits, scorer, next(self._clock))
        if entry.nbytes > self.budget_bytes or len(arr) == 0:
            return
        self._entries.append(entry)
        while self.nbytes > self.budget_bytes:
            oldest = min(self._entries, key=lambda e: e.used)
            self._entries.remove(oldest)
            self.evicted += 1

    def take(self, tokens: Sequence[int], better_than: int = 0) -> tuple[Entry, int] | None:
        """The state sharing the longest prefix with `tokens` if that prefix is longer than `better_than`,
        removed from the pool (it becomes the verifier's cache), with the prefix length."""
        best, best_n = None, better_than
        arr = np.asarray(tokens, dtype=np.int64)
        for e in self._entries:
            n = common_prefix(e.tokens, arr)
            if n > best_n or (n == best_n and best is not None and e.used > best.used):
                best, best_n = e, n
        if best is None:
            return None
        self._entries.remove(best)
        self.hits += 1
        return best, best_n

    def clear(self) -> None:
        self._entries.clear()

    def snapshot(self) -> dict:
        return {"states": len(self._entries), "bytes": self.nbytes, "budget_bytes": self.budget_bytes,
                "tokens": int(sum(len(e.tokens) for e in self._entries)), "hits": self.hits,
                "evicted": self.evicted}
