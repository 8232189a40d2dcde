"""An open buffer's token ids, kept current by re-tokenizing only the lines an edit touched.

The live shard of a buffer used to be the whole text re-tokenized after every edit (1 MB: seconds per
keystroke with a real tokenizer). `LiveBuffer` holds the text as chunks of whole lines (about CHUNK_CHARS
each), every chunk with its ids, masked for secrets before tokenization (indexer/secrets.py). An update
finds the changed span by comparing the new text with the old from both ends (C-speed slice comparisons),
re-chunks and re-tokenizes only the chunks it overlaps, and keeps the others: the cost follows the edit,
not the buffer. A line longer than LONG_LINE characters (minified code, data) is not fed at all, which keeps
a 1 MB single-line buffer's edits at a few milliseconds; such lines are counted (`long_lines`).

Chunks are tokenized apart, so a token never spans two of them: at a chunk's first line the ids may differ
from the whole text's (drafts only; the model verifies every draft token).
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

CHUNK_CHARS = 4096
LONG_LINE = 10_000


@dataclass
class Chunk:
    text: str
    ids: np.ndarray
    masked: int = 0               # lines emptied: they carry a secret
    key_material: bool = False    # holds a private key: the whole buffer must not be fed
    long: bool = False            # one line over LONG_LINE characters: not fed


def _common_prefix(a: str, b: str) -> int:
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:                         # the longest prefix shared, by halving: O(n log n) memcmp
        mid = (lo + hi + 1) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _common_suffix(a: str, b: str, limit: int) -> int:
    lo, hi = 0, min(len(a), len(b), limit)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[len(a) - mid:len(a) - lo] == b[len(b) - mid:len(b) - lo]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def split_lines(text: str, chunk_chars: int = CHUNK_CHARS, long_line: int = LONG_LINE) -> list[tuple[str, bool]]:
    """`text` as (chunk, is_long_line) pieces: runs of whole lines of about chunk_chars, and each line over
    long_line characters alone."""
    out: list[tuple[str, bool]] = []
    pos, start, n = 0, 0, len(text)
    while pos < n:
        end = text.find("\n", pos)
        end = n if end < 0 else end + 1
        if end - pos > long_line:
            if start < pos:
                out.append((text[start:pos], False))
            out.append((text[pos:end], True))
            start = end
        elif end - start >= chunk_chars:
            out.append((text[start:end], False))
            start = end
        pos = end
    if start < n:
        out.append((text[start:n], False))
    return out


class LiveBuffer:
    """One open buffer. `encode(texts) -> ids per text` tokenizes (a batch: the tokenizer's threads share
    it); `clean(text, name) -> indexer.secrets.Cleaned` masks secrets."""

    def __init__(self, name: str, encode: Callable[[list[str]], Sequence[Sequence[int]]],
                 clean: Callable[[str, str], object]):
        self.name, self._encode, self._clean = name, encode, clean
        self.text = ""
        self.chunks: list[Chunk] = []
        self._offsets: list[int] = []
        self.tokenized_chars = 0                # characters tokenized by the last update (for tests, figures)
        self.backend: object | None = None      # the model whose tokenizer made the ids (the caller's note)

    def update(self, text: str) -> None:
        old = self.text
        if text == old and (self.chunks or not text):
            self.tokenized_chars = 0
            return
        p = _common_prefix(old, text)
        s = _common_suffix(old, text, min(len(old), len(text)) - p)
        # the chunks the changed span [p, len(old) - s) overlaps (or touches, at the end of the text)
        offs = self._offsets
        i = max(0, bisect.bisect_right(offs, p) - 1) if offs else 0
        j = max(i, bisect.bisect_right(offs, max(p, len(old) - s - 1)) - 1) if offs else -1
        delta = len(text) - len(old)

        def new_end(k: int) -> int:
            return offs[k] + len(self.chunks[k].text) + delta if k >= 0 else 0

        # chunks hold whole lines: when the edit joined the region's last line with the next chunk's
        # first line, that chunk is part of the region too
        while 0 <= j < len(self.chunks) - 1 and text[new_end(j) - 1:new_end(j)] != "\n":
            j += 1
        start = offs[i] if offs else 0
        new_region = text[start:new_end(j)] if self.chunks else text
        pieces = split_lines(new_region)
        fresh = self._make([t for t, _ in pieces], [lg for _, lg in pieces])
        self.chunks[i:j + 1] = fresh
        self.text = text
        self._offsets = list(np.cumsum([0] + [len(c.text) for c in self.chunks[:-1]])) if self.chunks else []

    def _make(self, texts: list[str], longs: list[bool]) -> list[Chunk]:
        chunks = [Chunk(t, np.zeros(0, dtype=np.int64), long=lg) for t, lg in zip(texts, longs)]
        todo = []
        for c in chunks:
            if c.long:
                continue
            cleaned = self._clean(c.text, self.name)
            if getattr(cleaned, "skip", None) is not None:
                c.key_material = True
                continue
            c.masked = cleaned.masked_lines
            todo.append((c, cleaned.text))
        ids = self._encode([t for _, t in todo]) if todo else []
        for (c, t), x in zip(todo, ids):
            c.ids = np.asarray(x, dtype=np.int64)
        self.tokenized_chars = sum(len(t) for _, t in todo)
        return chunks

    # -- what the buffer feeds -----------------------------------------------------------------------
    @property
    def key_material(self) -> bool:
        return any(c.key_material for c in self.chunks)

    @property
    def masked_lines(self) -> int:
        return sum(c.masked for c in self.chunks)

    @property
    def long_lines(self) -> int:
        return sum(c.long for c in self.chunks)

    def tokens(self) -> np.ndarray:
        parts = [c.ids for c in self.chunks if c.ids.size]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
