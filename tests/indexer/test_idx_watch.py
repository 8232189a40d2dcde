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


def test_the_watcher_catches_up_on_what_changed_before_it_started(tmp_path, bpe_tok_path):
    write_files(tmp_path / "r", {"a.py": "alpha = 1\n", "b.py": "beta = 2\n"})
    ds = Datastore.build([tmp_path / "r"], tmp_path / "ds", tokenizer=bpe_tok_path)
    # between the build and the watcher: no event will ever come for these
    (tmp_path / "r" / "a.py").write_text("alpha = 'changed while nobody watched'\n")
    (tmp_path / "r" / "b.py").unlink()
    write_files(tmp_path / "r", {"c.py": "gamma = 3\n"})
    updates = []
    w = Watcher(ds, debounce_s=0.2, on_update=updates.append).start()
    try:
        # start() returns once the catch-up scan is searchable: no waiting on events
        assert _found(ds, "alpha = 'changed while nobody watched'") and not _found(ds, "alpha = 1")
        assert sorted(ds.documents) == [str(tmp_path / "r" / "a.py"), str(tmp_path / "r" / "c.py")]
        assert (w.caught_up["changed"], w.caught_up["added"], w.caught_up["removed"]) == (1, 1, 1)
        assert len(updates) == 1 and updates[0] is w.caught_up
    finally:
        w.stop()
    quiet = Watcher(Datastore.open(ds.path), debounce_s=0.2).start()   # nothing changed since: nothing to do
    try:
        assert quiet.updates == 0 and quiet.caught_up["changed"] == quiet.caught_up["added"] == 0
    finally:
        quiet.stop()


def _age(path, seconds: float) -> None:
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns - int(seconds * 1e9)))


def _rewrite_keeping_size_and_mtime(path, text: str) -> None:
    """What a save within the file system's mtime tick looks like to a stat: same size, same mtime."""
    st = path.stat()
    assert len(text.encode()) == st.st_size
    path.write_text(text)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_a_rewrite_the_stat_cannot_see_is_caught_near_the_scan_only(tmp_path, bpe_tok_path):
    write_files(tmp_path / "r", {"old.py": "settled = 1\n", "new.py": "fresh_1 = 1\n"})
    _age(tmp_path / "r" / "old.py", 3600)     # written long before the build's scan
    ds = Datastore.build([tmp_path / "r"], tmp_path / "ds", tokenizer=bpe_tok_path)
    assert isinstance(ds.manifest["scanned_ns"], int)
    _rewrite_keeping_size_and_mtime(tmp_path / "r" / "new.py", "fresh_2 = 2\n")   # in the build's tick
    s = ds.sync()
    assert s["rechecked"] == 1 and s["changed"] == 1           # new.py only: old.py's stat vouches for it
    assert _found(ds, "fresh_2 = 2") and not _found(ds, "fresh_1 = 1")
    _rewrite_keeping_size_and_mtime(tmp_path / "r" / "old.py", "settled = 2\n")
    assert ds.sync()["changed"] == 0 and _found(ds, "settled = 1")   # an hour before the scan: trusted


def test_a_manifest_without_a_scan_time_is_reread_once(tmp_path, bpe_tok_path):
    from indexer.manifest import read_manifest, unpack_docs, write_manifest

    write_files(tmp_path / "r", {"a.py": "value_a = 1\n", "b.py": "value_b = 1\n"})
    for name in ("a.py", "b.py"):
        _age(tmp_path / "r" / name, 3600)
    Datastore.build([tmp_path / "r"], tmp_path / "ds", tokenizer=bpe_tok_path)
    m = read_manifest(tmp_path / "ds")
    del m["scanned_ns"]                         # as a store built before scans were recorded
    write_manifest(tmp_path / "ds", m)
    _rewrite_keeping_size_and_mtime(tmp_path / "r" / "a.py", "value_a = 2\n")
    b_shard = unpack_docs(m["docs"])[str(tmp_path / "r" / "b.py")].shard
    ds = open_or_build([tmp_path / "r"], tmp_path / "ds", tokenizer=bpe_tok_path)
    assert ds.documents[str(tmp_path / "r" / "b.py")].shard == b_shard   # opened and synced, not rebuilt
    assert _found(ds, "value_a = 2") and not _found(ds, "value_a = 1")
    assert isinstance(read_manifest(tmp_path / "ds")["scanned_ns"], int)
    assert ds.sync()["rechecked"] == 0          # recorded now: the next start trusts the stats again
