"""Adapter to the indexer: build or refresh a workspace folder's datastore, and watch the folder."""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterable


def _filters(exclude: Iterable[str]):
    from indexer.discover import Filters

    # the indexer already skips .git, node_modules, virtual environments, build output, secrets and
    # whatever .gitignore says; `exclude` adds gitignore-style patterns relative to the folder
    return Filters(exclude_paths=tuple(exclude))


def open_or_build(root: Path, store_dir: Path, *, tokenizer: str | None, exclude: Iterable[str],
                  progress: Callable[..., object] | None = None, rebuild: bool = False):
    """-> (Datastore, figures). Opens and syncs an existing store of this folder, else builds one;
    rebuild=True builds it from scratch whatever is there (the old store is replaced only once the new one
    is complete, so it can serve searches meanwhile)."""
    from indexer.store import Datastore
    from indexer.watch import open_or_build as indexer_open_or_build

    store_dir.parent.mkdir(parents=True, exist_ok=True)
    if rebuild:
        if progress:
            progress(f"rebuilding {store_dir}")
        ds = Datastore.build([root], store_dir, tokenizer=tokenizer, filters=_filters(exclude))
    else:
        ds = indexer_open_or_build([root], store_dir, tokenizer=tokenizer, filters=_filters(exclude),
                                   log_fn=(lambda msg: progress(msg)) if progress else None)
    st = ds.stats()
    return ds, {"documents": st["documents"], "tokens": st["tokens"], "shards": st["shards"]}


def watch(ds, on_update: Callable[[dict], None]):
    """Start indexer.watch.Watcher on the store's roots; changed files become searchable in about 0.2 s. Its
    catch-up scan is left to the workspace (WorkspaceIndex._catch_up runs it after the folder is announced
    ready, so that the scan does not hold up completions from the datastore)."""
    from indexer.watch import Watcher

    return Watcher(ds, debounce_s=0.2, on_update=on_update, catch_up=False).start()
