"""How a shard lays out its tokens, in memory and on disk.

Tokens are stored big-endian with a fixed width (2 or 4 bytes) so that comparing raw bytes of two token runs
compares them lexicographically as token sequences; every document is followed by a sentinel token (the
width's largest value, never a real id), so a match or a continuation never crosses a document, and a shard's
token array ends with one.
"""
from __future__ import annotations

import numpy as np

from .types import TokenOutOfRange


def width_for_vocab(vocab_size: int) -> int:
    """Bytes per token: 2 when every id and the sentinel fit in uint16 (ids < 65,535), else 4."""
    return 2 if vocab_size <= 0xFFFF else 4


def sentinel_for_width(width: int) -> int:
    return 0xFFFF if width == 2 else 0xFFFFFFFF


def native_dtype(width: int):
    return np.dtype(np.uint16 if width == 2 else np.uint32)


def be_dtype(width: int):
    return np.dtype(">u2" if width == 2 else ">u4")


def check_ids(ids: np.ndarray, width: int) -> None:
    """Raise instead of wrapping: an id that does not fit below the sentinel is an error."""
    if ids.size == 0:
        return
    lo, hi = int(ids.min()), int(ids.max())
    if lo < 0 or hi >= sentinel_for_width(width):
        raise TokenOutOfRange(
            f"token id {hi if hi >= sentinel_for_width(width) else lo} does not fit a {8 * width}-bit "
            f"token store (ids must lie in 0..{sentinel_for_width(width) - 1})"
        )
