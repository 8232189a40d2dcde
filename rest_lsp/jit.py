"""Compiled loops: the per-step search and drafting code that numpy can only express as dozens of small calls.

A drafting step on a CPU is a few hundred small numpy calls (binary searches, gathers, a trie, an estimate);
each costs microseconds of dispatch, and after the model's forward pass has evicted the CPU caches, several
times more. The loops here are compiled by numba on first use and cached on disk under the rest-lsp cache
root (`numba/`), so a process after the first loads them in milliseconds.

    njit(fn)   fn compiled (nopython, the GIL released, cached on disk)

Imports nothing of the project but storage, and never torch: the indexer uses it and must stay importable
without torch.
"""
from __future__ import annotations

import os
from typing import Callable, TypeVar

from rest_lsp.storage import cache_root

_CACHE = str(cache_root() / "numba")
os.environ.setdefault("NUMBA_CACHE_DIR", _CACHE)

import numba  # noqa: E402  (reads NUMBA_CACHE_DIR at import)

if not numba.config.CACHE_DIR:  # numba was imported before us without a cache directory
    numba.config.CACHE_DIR = _CACHE

F = TypeVar("F", bound=Callable)


def njit(fn: F) -> F:
    """fn compiled by numba in nopython mode, releasing the GIL, its machine code cached on disk."""
    return numba.njit(cache=True, nogil=True)(fn)
