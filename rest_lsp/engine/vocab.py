"""Drafted ids stay inside the model's vocabulary.

A tokenizer can hold ids past the model's embedding: transformers 5 loads CodeLlama's tokenizer with
`<FILL_ME>` at id 32016 while the model has 32,016 rows (0..32015), and any text containing `<FILL_ME>`
(a buffer, a file in the workspace or the corpus) is encoded with that id into the live shards and the
datastores. A drafted id past the embedding would be an IndexError in the verifier on a CPU, and a
device-side assert that ruins the CUDA context on a GPU; it can never be accepted anyway.
"""
from __future__ import annotations

from typing import Sequence


def clip_to_vocab(proposals: Sequence[tuple[Sequence[int], float]], vocab_size: int
                  ) -> list[tuple[tuple[int, ...], float]]:
    """Each (continuation, weight) cut before its first id outside [0, vocab_size); emptied ones dropped.
    Continuations that become equal keep their own entries (the drafter's trie adds their weights)."""
    out: list[tuple[tuple[int, ...], float]] = []
    for tokens, weight in proposals:
        kept = []
        for t in tokens:
            if not 0 <= t < vocab_size:
                break
            kept.append(int(t))
        if kept:
            out.append((tuple(kept), weight))
    return out
