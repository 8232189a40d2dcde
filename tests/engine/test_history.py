"""The model's earlier output kept across processes (rest_lsp/engine/history.py)."""
from __future__ import annotations

import msgpack
import numpy as np
import pytest

from rest_lsp.engine import HistorySource
from rest_lsp.engine.history import HistoryError, load_history, save_history


def test_save_load_round_trip_and_atomic(tmp_path):
    src = HistorySource()
    src.begin([1, 2])
    src.observe([5, 6, 7])
    src.begin([3])
    src.observe([5, 6, 9])
    path = tmp_path / "sub" / "h.msgpack"
    save_history(path, src.tokens(), "m/100")
    assert [p.name for p in path.parent.iterdir()] == ["h.msgpack"]  # no temporary file left behind
    back = load_history(path, "m/100")
    assert back.dtype == np.int64 and back.tolist() == [5, 6, 7, -1, 5, 6, 9]
    assert load_history(path, "m").tolist() == back.tolist()  # a bare model name matches any vocabulary

    fresh = HistorySource()
    fresh.extend(back)
    fresh.begin([0])
    fresh.observe([5, 6])
    # both saved generations are drafted from, and the separator keeps them apart
    conts = sorted(c for c, _ in fresh.propose([5, 6], 4))
    assert conts == [(7,), (9,)]


def test_bad_history_files_are_refused(tmp_path):
    path = tmp_path / "h.msgpack"
    with pytest.raises(HistoryError, match="no history file"):
        load_history(path, "m")
    save_history(path, np.arange(50), "m/100")
    with pytest.raises(HistoryError, match="model 'm/100'"):
        load_history(path, "other/100")
    raw = path.read_bytes()
    path.write_bytes(raw[: len(raw) // 2])  # torn
    with pytest.raises(HistoryError, match="not a readable history"):
        load_history(path, "m/100")
    m = msgpack.unpackb(raw)
    m["tokens"] = m["tokens"][:-4] + b"\x01\x00\x00\x00"  # bit rot in the tokens
    path.write_bytes(msgpack.packb(m))
    with pytest.raises(HistoryError, match="corrupted"):
        load_history(path, "m/100")
    path.write_bytes(msgpack.packb({"format": "something-else"}))
    with pytest.raises(HistoryError, match="not a rest-lsp history"):
        load_history(path, "m/100")
    path.write_bytes(msgpack.packb({**m, "version": 99}))
    with pytest.raises(HistoryError, match="version 99"):
        load_history(path, "m/100")


def test_extend_keeps_the_latest_capacity():
    src = HistorySource(capacity=6)  # at least the latest 6 tokens, at most 12 (halved when full)
    src.extend(list(range(10)))
    src.extend([20, 21])
    src.extend([30, 31, 32])
    kept = src.tokens().tolist()
    assert 6 <= len(kept) <= 12 and kept[-4:] == [HistorySource.SEPARATOR, 30, 31, 32]
    assert 0 not in kept and 20 in kept


def test_two_processes_sharing_a_file_keep_both_outputs(tmp_path):
    """Two daemons of one model (two editor windows) save to one file: neither erases the other's output,
    and each drafts from the other's after its next save."""
    from rest_lsp.engine.history import HistoryFile

    path = tmp_path / "h.msgpack"
    a_src, b_src = HistorySource(), HistorySource()
    a, b = HistoryFile(path, "m/1", a_src), HistoryFile(path, "m/1", b_src)
    for hf in (a, b):
        with pytest.raises(HistoryError):
            hf.load()  # nothing saved yet
    assert not a.dirty
    a_src.begin([0])
    a_src.observe([10, 11, 12])
    b_src.begin([0])
    b_src.observe([20, 21, 22])
    assert a.dirty and b.dirty
    a.save()
    assert not a.dirty and load_history(path, "m/1").tolist() == [10, 11, 12]
    b.save()  # a wrote the file since b last saw it: a's output is kept, then b's
    saved = load_history(path, "m/1").tolist()
    assert saved == [10, 11, 12, -1, 20, 21, 22] and b_src.tokens().tolist() == saved
    a_src.begin([0])
    a_src.observe([13])
    a.save()
    assert load_history(path, "m/1").tolist() == saved + [-1, 13]
    # b now drafts a's continuation
    fresh = HistorySource()
    HistoryFile(path, "m/1", fresh).load()
    fresh.begin([0])
    fresh.observe([10, 11])
    assert (12,) in [c for c, _ in fresh.propose([10, 11], 2)]


def test_since_counts_through_halving():
    src = HistorySource(capacity=4)
    src.observe([1, 2, 3])
    mark = src.total
    src.observe([4, 5, 6, 7, 8, 9])  # more than the capacity at once: the latest 4 are appended
    assert src.since(mark).tolist() == [6, 7, 8, 9]
    src.observe([10, 11])  # the buffer (twice the capacity) is full: the latest capacity are kept
    assert src.tokens().tolist() == [8, 9, 10, 11] and src.since(mark).tolist() == [8, 9, 10, 11]
    assert src.since(src.total - 1).tolist() == [11]
    assert src.since(src.total).tolist() == []
    src.reset([7, 8])
    assert src.tokens().tolist() == [7, 8]


@pytest.mark.parametrize("damage", ["torn", "newer", "other-model"])
def test_a_save_never_writes_over_a_file_it_could_not_read(tmp_path, damage):
    """Damaged while the daemon runs, or rewritten by a newer rest-lsp or another model's daemon: the next
    save moves the file aside (kept whole for inspection) and says so, then writes its own output."""
    from rest_lsp.engine.history import HistoryFile

    path = tmp_path / "h.msgpack"
    src = HistorySource()
    hf = HistoryFile(path, "m/1", src)
    src.begin([0])
    src.observe([10, 11, 12])
    hf.save()
    good = path.read_bytes()
    theirs = {"torn": good[: len(good) // 2],
              "newer": msgpack.packb({**msgpack.unpackb(good), "version": 2, "extra": [1, 2]}),
              "other-model": msgpack.packb({**msgpack.unpackb(good), "model": "other/9"})}[damage]
    path.write_bytes(theirs)
    src.observe([13])
    hf.save()
    aside = list(tmp_path.glob("h.msgpack.unreadable-*"))
    assert len(aside) == 1 and aside[0].read_bytes() == theirs
    assert hf.error is not None and aside[0].name in hf.error
    assert load_history(path, "m/1").tolist() == [10, 11, 12, 13]


def test_a_save_that_cannot_move_the_damaged_file_writes_nothing(tmp_path, monkeypatch):
    from rest_lsp.engine import history
    from rest_lsp.engine.history import HistoryFile

    path = tmp_path / "h.msgpack"
    src = HistorySource()
    hf = HistoryFile(path, "m/1", src)
    src.observe([1, 2])
    hf.save()
    path.write_bytes(b"\x00 not a history file")
    src.observe([3])

    def cannot_move(p):
        raise PermissionError(13, "Permission denied", str(p))

    monkeypatch.setattr(history, "set_aside", cannot_move)
    with pytest.raises(OSError):
        hf.save()
    assert path.read_bytes() == b"\x00 not a history file"
