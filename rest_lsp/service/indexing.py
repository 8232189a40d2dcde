"""Adapter to the indexer: build or refresh a folder's datastore, and watch the folder."""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterable


def open_or_build(root: Path, store_dir: Path, *, tokenizer: str | None, exclude: Iterable[str],
                  progress: Callable[..., object] | None = None):
    """-> (Datastore, detail dict)."""
    raise RuntimeError("the indexer's datastore (indexer.store) is not available yet")


def watch(root: Path, exclude: Iterable[str], on_change: Callable[[list[Path]], None]):
    raise RuntimeError("indexer.watch is not available yet")
