"""The model's vocabulary as the drafter and the decoding loop need it.

`inside_end` / `clip_rows`: drafted ids stay inside the model's vocabulary (the drafter's compiled step cuts
each row where `inside_end` says; `clip_rows` is the same cut over one source's rows). A tokenizer can hold ids
past the model's embedding: transformers 5 loads CodeLlama's tokenizer with `<FILL_ME>` at id 32016 while the model has 32,016
rows (0..32015), and any text containing `<FILL_ME>` (a buffer, a file in the workspace or the corpus) is
encoded with that id into the live shards and the datastores. A drafted id past the embedding would be an
IndexError in the verifier on a CPU, and a device-side assert that ruins the CUDA context on a GPU; it can
never be accepted anyway.

`VocabIndex`: token strings, searchable by prefix, for outputs that must start with a given text.

A prompt that ends inside a word ("return x.ite") or after a space cuts the text where the tokenizer never
cuts it in training (the space belongs to the next word's token, "items" is one token), and the model then
continues badly. So the service leaves such an ending out of the prompt and asks that the output start with
it (`GenerationConfig.forced_text`, token healing): at each step until the output spells it out, only
tokens that agree with what is left of it may be chosen.
"""
from __future__ import annotations

import bisect
import numpy as np
import torch

from restbase.jit import njit


@njit
def _outside(rows, vocab_size) -> bool:
    """Does any of rows [C, L] lie outside [-1, vocab_size)? (one compiled call per source and step: the four
    numpy calls it replaces cost 0.05-0.1 ms each right after a CPU forward pass)"""
    for i in range(rows.shape[0]):
        if inside_end(rows, i, vocab_size) < rows.shape[1]:
            return True
    return False


@njit
def inside_end(rows, i, vocab_size) -> int:
    """Where row i of rows [C, L] is cut: its first id outside [-1, vocab_size), or L (vocab_size < 0: L)."""
    if vocab_size >= 0:
        for j in range(rows.shape[1]):
            if rows[i, j] >= vocab_size or rows[i, j] < -1:
                return j
    return rows.shape[1]


def clip_rows(rows: np.ndarray, weights: np.ndarray, vocab_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Drafted rows (padded with -1 after each end) cut before their first id outside [0, vocab_size);
    rows emptied by the cut dropped. Rows that become equal keep their own entries (the trie adds their
    weights)."""
    if not _outside(rows, vocab_size):
        return rows, weights
    bad = (rows >= vocab_size) | (rows < -1)
    rows = np.where(np.logical_or.accumulate(bad, axis=1), -1, rows)
    keep = rows[:, 0] != -1
    return rows[keep], weights[keep]


# " " agrees with half of a code model's vocabulary (2 ms to gather), and a pause after a space asks for it at
# every key's first step: texts this short are answered from what was gathered before
SHORT, SHORT_KEPT = 2, 4096


class VocabIndex:
    def __init__(self, tokenizer, vocab_size: int):
        n = min(vocab_size, len(tokenizer))
        special = set(getattr(tokenizer, "all_special_ids", []) or [])
        special |= set(getattr(tokenizer, "added_tokens_decoder", {}) or {})
        texts = tokenizer.batch_decode([[i] for i in range(n)], skip_special_tokens=False,
                                       clean_up_tokenization_spaces=False)
        self.texts: list[str] = [("" if i in special else t) for i, t in enumerate(texts)]
        pairs = sorted((t, i) for i, t in enumerate(self.texts) if t and "\ufffd" not in t)
        self._sorted = [t for t, _ in pairs]
        self._ids = np.array([i for _, i in pairs], dtype=np.int64)
        self._exact: dict[str, list[int]] = {}
        self._short: dict[str, torch.Tensor] = {}
        for t, i in pairs:
            self._exact.setdefault(t, []).append(i)

    def agreeing(self, text: str) -> torch.Tensor:
        """Ids of the tokens that agree with `text`: they start with it, or they are a start of it (never
        to be modified: the answers for short texts, which agree with the most tokens, are kept)."""
        if len(text) > SHORT:
            return self._agreeing(text)
        ids = self._short.get(text)
        if ids is None:
            if len(self._short) >= SHORT_KEPT:
                self._short.clear()
            ids = self._short[text] = self._agreeing(text)
        return ids

    def _agreeing(self, text: str) -> torch.Tensor:
        lo = bisect.bisect_left(self._sorted, text)
        hi = bisect.bisect_left(self._sorted, text + "\U0010ffff")
        # a short text starts thousands of tokens: numpy, not Python lists (it runs at every key's first step)
        starts = [i for k in range(1, len(text)) for i in self._exact.get(text[:k], ())]
        ids = np.union1d(self._ids[lo:hi], np.array(starts, dtype=np.int64))
        return torch.from_numpy(ids)

    @staticmethod
    def left_after(forced: str, token_text: str) -> str:
        """What of `forced` is still to be spelled out after a token with this text."""
        if token_text.startswith(forced):
            return ""
        if forced.startswith(token_text):
            return forced[len(token_text):]
        return ""  # a token that disagrees (no agreeing token existed): the constraint is dropped
