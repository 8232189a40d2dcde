"""Compiled loops: the per-step search and drafting code that numpy can only express as dozens of small calls.

A drafting step on a CPU is a few hundred small numpy calls (binary searches, gathers, a trie, an estimate);
each costs microseconds of dispatch, and after the model's forward pass has evicted the CPU caches, several
times more. The loops here are compiled by numba on first use and cached on disk under the rest-lsp cache
root (`numba/<digest of the sources>/`), so a process after the first loads them in milliseconds.

    njit(fn)   fn compiled (nopython, the GIL released, cached on disk)

Imports nothing of the project but storage, and never torch: the indexer uses it and must stay importable
without torch.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import time
from pathlib import Path
from typing import Callable, TypeVar

from restbase.storage import cache_root

KEEP_SOURCE_STATES = 4  # cache directories kept for other states of the sources (another install, a checkout)
STALE_AFTER_S = 86_400.0  # ... and only when a day old: a process of that state may still be writing there


def sources_digest(root: Path = Path(__file__).resolve().parents[1]) -> str:
    """A digest of the project's modules as they are on disk (path, size, modification time).

    numba checks a cached function against its own file only: a compiled function whose compiled callee in
    another file changed would load its old machine code, the callee's old code inlined. One cache directory per
    state of the sources cannot serve such a mix."""
    h = hashlib.sha256()
    for pkg in ("restbase", "indexer", "rest_lsp"):
        for path in sorted((root / pkg).rglob("*.py")):
            st = path.stat()
            h.update(f"{path.relative_to(root).as_posix()}:{st.st_size}:{st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:16]


def _cache_dir() -> str:
    """numba's cache directory for these sources under the cache root's `numba/`; the least recently used
    directories of other states beyond KEEP_SOURCE_STATES are removed once a day old."""
    base = cache_root() / "numba"
    here = base / sources_digest()
    here.mkdir(parents=True, exist_ok=True)
    os.utime(here)  # its modification time: when these sources were last used
    try:  # another process may be pruning too: a directory gone meanwhile is no error
        others = sorted(((d.stat().st_mtime, d) for d in base.iterdir() if d.is_dir() and d != here), reverse=True)
    except OSError:
        return str(here)
    for mtime, d in others[KEEP_SOURCE_STATES:]:
        if time.time() - mtime > STALE_AFTER_S:
            shutil.rmtree(d, ignore_errors=True)
    return str(here)


_CACHE = _cache_dir()
os.environ.setdefault("NUMBA_CACHE_DIR", _CACHE)

import numba  # noqa: E402  (reads NUMBA_CACHE_DIR at import)

if not numba.config.CACHE_DIR:  # numba was imported before us without a cache directory
    numba.config.CACHE_DIR = _CACHE

F = TypeVar("F", bound=Callable)


def njit(fn: F) -> F:
    """fn compiled by numba in nopython mode, releasing the GIL, its machine code cached on disk."""
    return numba.njit(cache=True, nogil=True)(fn)
