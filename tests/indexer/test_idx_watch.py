"""Watching: edits, editors' atomic saves, deletions, renames and moved folders become searchable."""
from __future__ import annotations

import os
import time

import pytest
from idx_helpers import write_files

from indexer.store import Datastore
from indexer.watch import Watcher, open_or_build


def _wait_for(pred, timeout=10.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.02)
    return False


@pytest.fixture()
def watched(tmp_path, bpe_tok_path):
    write_files(tmp_path / "r", {"a.py": "alpha = 1\n", "pkg/b.py": "beta = 2\n", ".git/HEAD": "ref"})
    ds = Datastore.build([tmp_path / "r"], tmp_path / "ds", tokenizer=bpe_tok_path)
    updates = []
    w = Watcher(ds, debounce_s=0.2, on_update=updates.append).start()
    yield tmp_path / "r", ds, updates
    w.stop()


def _found(ds, text):
    ids = ds.tokenizer.encode(text, add_special_tokens=False).ids
    return ds.search(ids, n_max=len(ids), n_min=len(ids)).match_len == len(ids)


def test_watch_follows_saves_deletes_renames_and_moved_folders(watched):
    root, ds, updates = watched
    (root / "a.py").write_text("alpha = 'edited value'\n")
    assert _wait_for(lambda: _found(ds, "alpha = 'edited value'"))
    assert not _found(ds, "alpha = 1")

    tmp = root / ".a.py.swp~"  # an editor's atomic save: write a temporary file, rename it over
    tmp.write_text("alpha = 'atomic save'\n")
    os.replace(tmp, root / "a.py")
    assert _wait_for(lambda: _found(ds, "alpha = 'atomic save'"))
    assert not any(".swp" in p for p in ds.documents)

    (root / "pkg" / "b.py").rename(root / "pkg" / "c.py")
    assert _wait_for(lambda: str(root / "pkg" / "c.py") in ds.documents and str(root / "pkg" / "b.py") not in ds.documents)

    (root / "pkg").rename(root / "moved")
    assert _wait_for(lambda: str(root / "moved" / "c.py") in ds.documents and not any("/pkg/" in p for p in ds.documents))
    assert _found(ds, "beta = 2")

    (root / "moved" / "c.py").unlink()
    assert _wait_for(lambda: not _found(ds, "beta = 2"))  # searchable first, in memory
    assert _wait_for(lambda: sorted(ds.documents) == [str(root / "a.py")])  # then committed
    # the watcher applied batches (not one update per event) and each within a fraction of a second
    assert updates and max(u["latency_s"] for u in updates) < 5
    # and what it wrote reopens from disk with the same answers
    again = Datastore.open(ds.path)
    assert sorted(again.documents) == sorted(ds.documents)


def test_open_or_build_syncs_changes_made_while_not_watching(tmp_path, bpe_tok_path):
    write_files(tmp_path / "r", {"a.py": "one = 1\n"})
    Datastore.build([tmp_path / "r"], tmp_path / "ds", tokenizer=bpe_tok_path)
    (tmp_path / "r" / "a.py").unlink()
    write_files(tmp_path / "r", {"b.py": "two = 2\n"})
    ds = open_or_build([tmp_path / "r"], tmp_path / "ds", tokenizer=bpe_tok_path)
    assert list(ds.documents) == [str(tmp_path / "r" / "b.py")]
    ds2 = open_or_build([tmp_path / "r", tmp_path / "r"], tmp_path / "ds", tokenizer=bpe_tok_path)
    assert list(ds2.documents) == [str(tmp_path / "r" / "b.py")]


def test_falls_back_to_polling_when_native_watching_fails(tmp_path, bpe_tok_path, monkeypatch):
    write_files(tmp_path / "r", {"a.py": "alpha = 1\n"})
    ds = Datastore.build([tmp_path / "r"], tmp_path / "ds", tokenizer=bpe_tok_path)
    w = Watcher(ds, debounce_s=0.2)

    def no_watches():
        raise OSError(28, "inotify watch limit reached")

    monkeypatch.setattr(w._observer, "start", no_watches)
    w.start()
    try:
        assert type(w._observer).__name__ == "PollingObserver"
        (tmp_path / "r" / "b.py").write_text("polled_value = 2\n")
        assert _wait_for(lambda: str(tmp_path / "r" / "b.py") in ds.documents, timeout=15)
    finally:
        w.stop()
