"""Bad input and crashes: damaged shards and manifests, a full disk, a killed builder, missing roots,
unreadable, undecodable, binary and vanishing files, symlink loops and links out of the root."""
from __future__ import annotations

import errno
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from idx_helpers import contexts_from, random_file, results, source_lines, write_files

import indexer.discover as disc
from indexer.build import build_datastore
from indexer.store import Datastore
from indexer.types import CorruptManifest, CorruptShard, IndexerError


@pytest.fixture()
def small_store(tmp_path, bpe_tok_path):
    rng = random.Random(1)
    lines = source_lines()
    write_files(tmp_path / "r", {f"f{i}.py": random_file(rng, lines) for i in range(8)})
    ds = Datastore.build([tmp_path / "r"], tmp_path / "ds", tokenizer=bpe_tok_path)
    ctxs = contexts_from(ds.tokenizer, [p.read_text() for p in (tmp_path / "r").glob("*.py")], rng, n=30)
    return tmp_path / "ds", ctxs, results(ds, ctxs)


def _shard_file(ds_dir: Path, suffix: str) -> Path:
    return sorted((ds_dir / "shards").glob(f"*{suffix}"))[0]


def test_a_flipped_byte_is_caught_by_the_checksum_and_repaired(small_store):
    ds_dir, ctxs, expected = small_store
    f = _shard_file(ds_dir, ".sa.npy")
    data = bytearray(f.read_bytes())
    data[-7] ^= 0x55
    f.write_bytes(bytes(data))
    with pytest.raises(CorruptShard, match="checksum"):
        Datastore.open(ds_dir)
    fixed = Datastore.open(ds_dir, repair=True)  # drops the shard and re-indexes its documents
    assert results(fixed, ctxs) == expected
    assert Datastore.open(ds_dir).verify() == []


def test_a_truncated_shard_is_caught_even_without_hashing(small_store):
    ds_dir, _, _ = small_store
    f = _shard_file(ds_dir, ".tok.npy")
    f.write_bytes(f.read_bytes()[:-10])
    with pytest.raises(CorruptShard, match="truncated"):
        Datastore.open(ds_dir, verify=False)
    os.unlink(f)
    with pytest.raises(CorruptShard, match="missing"):
        Datastore.open(ds_dir, verify=False)


def test_a_damaged_manifest_is_a_clear_error(small_store):
    ds_dir, _, _ = small_store
    (ds_dir / "manifest.msgpack").write_bytes(b"\x93garbage")
    with pytest.raises(CorruptManifest, match="rebuild"):
        Datastore.open(ds_dir)


def test_a_full_disk_during_a_build_leaves_the_previous_store(small_store, tmp_path, bpe_tok_path, monkeypatch):
    ds_dir, ctxs, expected = small_store
    write_files(tmp_path / "other", {"x.py": "entirely different content\n" * 200})
    import indexer.shardfile as shardfile

    real_write = shardfile._HashingWriter.write
    budget = {"left": 3000}

    def failing_write(self, b):
        budget["left"] -= memoryview(b).nbytes
        if budget["left"] < 0:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(self, b)

    monkeypatch.setattr(shardfile._HashingWriter, "write", failing_write)
    with pytest.raises(OSError, match="No space"):
        build_datastore([tmp_path / "other"], ds_dir, tokenizer=bpe_tok_path)
    monkeypatch.undo()
    assert not list(ds_dir.glob("**/.tmp-*"))
    assert results(Datastore.open(ds_dir), ctxs) == expected


def test_a_full_disk_during_an_update_keeps_serving_the_old_state(small_store, tmp_path, monkeypatch):
    ds_dir, ctxs, expected = small_store
    ds = Datastore.open(ds_dir)
    p = next((tmp_path / "r").glob("*.py"))
    p.write_text("something new\n")
    import indexer.manifest as manifest

    def no_space(path, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(manifest, "write_bytes_atomic", no_space)
    with pytest.raises(OSError):
        ds.update_paths([p])
    monkeypatch.undo()
    assert results(ds, ctxs) == expected  # in memory: unchanged
    assert results(Datastore.open(ds_dir), ctxs) == expected  # on disk: unchanged
    ds.update_paths([p])  # once there is space again the update goes through
    assert ds.stats()["documents"] == 8 and not Datastore.open(ds_dir).verify()


def test_killing_the_builder_at_random_points_never_breaks_the_store(tmp_path, bpe_tok_path):
    rng = random.Random(11)
    lines = source_lines()
    write_files(tmp_path / "a", {f"a{i}.py": random_file(rng, lines) for i in range(10)})
    write_files(tmp_path / "b", {f"b{i}/m{j}.py": random_file(rng, lines, 60) for i in range(10) for j in range(30)})
    ds_dir = tmp_path / "ds"
    ref_a = Datastore.build([tmp_path / "a"], tmp_path / "ref_a", tokenizer=bpe_tok_path)
    ref_b = Datastore.build([tmp_path / "b"], tmp_path / "ref_b", tokenizer=bpe_tok_path)
    ctxs = contexts_from(ref_a.tokenizer, [p.read_text() for p in (tmp_path / "a").glob("*.py")], rng, n=10)
    ctxs += contexts_from(ref_a.tokenizer, [p.read_text() for p in list((tmp_path / "b").rglob("*.py"))[:20]], rng, n=10)
    expect = {10: results(ref_a, ctxs), 300: results(ref_b, ctxs)}
    cmd = [sys.executable, "-m", "indexer.cli", "build", str(tmp_path / "b"), "--out", str(ds_dir),
           "--tokenizer", bpe_tok_path, "--json"]
    t0 = time.monotonic()
    subprocess.run(cmd[:6] + [str(tmp_path / "scratch")] + cmd[7:], check=True, capture_output=True)
    full = time.monotonic() - t0
    build_datastore([tmp_path / "a"], ds_dir, tokenizer=bpe_tok_path)
    outcomes = []
    for i in range(6):
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(0.2, 1.0) * full)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        ds = Datastore.open(ds_dir)  # checksums verified
        n = ds.stats()["documents"]
        assert n in expect, n
        assert results(ds, ctxs) == expect[n]
        outcomes.append(n)
        if n == 300:  # the build finished before the kill: start again from A
            build_datastore([tmp_path / "a"], ds_dir, tokenizer=bpe_tok_path)
    assert 10 in outcomes  # at least one kill landed mid-build


def test_missing_roots(tmp_path, bpe_tok_path):
    with pytest.raises(IndexerError, match="no root exists"):
        build_datastore([tmp_path / "nope"], tmp_path / "ds", tokenizer=bpe_tok_path)
    write_files(tmp_path / "r", {"a.py": "x = 1\n"})
    rep = build_datastore([tmp_path / "nope", tmp_path / "r"], tmp_path / "ds", tokenizer=bpe_tok_path)
    assert rep["documents"] == 1 and any("nope" in e and "does not exist" in e for e in rep["errors"])


def test_unreadable_undecodable_binary_and_vanishing_files(tmp_path, bpe_tok_path, monkeypatch):
    write_files(tmp_path / "r", {
        "ok.py": "print('fine')\n",
        "latin1.py": b"s = '\xe9t\xe9'  # caf\xe9\n",
        "blob.py": b"\x00\x01\x02binary",
        "locked.py": "secret = 1\n",
    })
    real_read = disc.read_text

    def read_text(path, max_size):
        if Path(path).name == "locked.py":
            raise PermissionError(errno.EACCES, "Permission denied")
        return real_read(path, max_size)

    monkeypatch.setattr(disc, "read_text", read_text)
    real_walk = disc.walk

    def walk(*a, **kw):  # a file listed by the walk, then deleted before it is read
        yield from real_walk(*a, **kw)
        yield disc.Candidate(tmp_path / "r" / "gone.py", tmp_path / "r", 10, 0)

    monkeypatch.setattr(disc, "walk", walk)
    rep = build_datastore([tmp_path / "r"], tmp_path / "ds", tokenizer=bpe_tok_path)
    assert rep["documents"] == 2  # ok.py and latin1.py (its 3 bad bytes replaced)
    assert rep["undecodable_chars"] == 3
    assert rep["skipped"]["binary"] == 1 and rep["skipped"]["unreadable"] == 1 and rep["skipped"]["vanished"] == 1
    assert any("locked.py" in e and "Permission denied" in e for e in rep["errors"])


def test_an_unreadable_file_during_an_update_keeps_its_old_content(tmp_path, bpe_tok_path, monkeypatch):
    write_files(tmp_path / "r", {"a.py": "alpha beta gamma delta\n"})
    ds = Datastore.build([tmp_path / "r"], tmp_path / "ds", tokenizer=bpe_tok_path)
    q = ds.tokenizer.encode("alpha beta", add_special_tokens=False).ids
    (tmp_path / "r" / "a.py").write_text("changed\n")
    monkeypatch.setattr(disc, "read_text", lambda p, m: (_ for _ in ()).throw(PermissionError(13, "Permission denied")))
    s = ds.update_paths([tmp_path / "r" / "a.py"])
    assert s["errors"] and ds.search(q).match_len == len(q)


def test_symlink_loops_and_links_out_of_the_root(tmp_path, bpe_tok_path):
    write_files(tmp_path / "outside", {"leak.py": "OUTSIDE_SECRET = 1\n"})
    write_files(tmp_path / "r", {"pkg/a.py": "inside = 1\n"})
    os.symlink(tmp_path / "r", tmp_path / "r" / "pkg" / "loop")  # a cycle
    os.symlink(tmp_path / "outside", tmp_path / "r" / "out_dir")
    os.symlink(tmp_path / "outside" / "leak.py", tmp_path / "r" / "leak.py")
    os.symlink(tmp_path / "r" / "pkg" / "a.py", tmp_path / "r" / "alias.py")  # inside: same file once
    rep = build_datastore([tmp_path / "r"], tmp_path / "ds", tokenizer=bpe_tok_path)
    ds = Datastore.open(tmp_path / "ds")
    assert rep["documents"] == 1
    assert rep["skipped"]["symlink_outside_root"] == 2 and rep["skipped"]["symlink_loop"] == 1
    assert rep["skipped"]["symlink_inside_root"] == 1
    assert list(ds.documents) == [str(tmp_path / "r" / "pkg" / "a.py")]
    assert not any("leak" in p for p in ds.documents)


def test_killing_a_writer_mid_update_then_sync_gives_a_correct_store(tmp_path, bpe_tok_path):
    rng = random.Random(5)
    lines = source_lines()
    repo = tmp_path / "r"
    write_files(repo, {f"f{i}.py": random_file(rng, lines) for i in range(20)})
    ds_dir = tmp_path / "ds"
    Datastore.build([repo], ds_dir, tokenizer=bpe_tok_path)
    script = f"""
import random, sys
from pathlib import Path
sys.path.insert(0, {str(Path(__file__).parent)!r})
from idx_helpers import random_file, source_lines
from indexer.store import Datastore
import indexer.writer as writer
writer.LEVEL_BASE_TOKENS = 256  # merge often
ds = Datastore.open({str(ds_dir)!r})
rng, lines = random.Random(), source_lines()
files = sorted(Path({str(repo)!r}).glob("*.py"))
print("ready", flush=True)
while True:
    p = rng.choice(files)
    p.write_text(random_file(rng, lines))
    ds.update_paths([p])
"""
    for i in range(4):
        proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        assert proc.stdout.readline().strip() == b"ready"
        time.sleep(rng.uniform(0.05, 1.5))
        proc.kill()
        proc.wait()
        ds = Datastore.open(ds_dir)  # every shard it names is intact
        assert ds.verify() == []
    ds.sync()  # files the dead writer changed but did not index yet
    texts = [p.read_text() for p in sorted(repo.glob("*.py"))]
    ctxs = contexts_from(ds.tokenizer, texts, rng, n=40)
    fresh = Datastore.build([repo], tmp_path / "fresh", tokenizer=bpe_tok_path)
    assert results(ds, ctxs) == results(fresh, ctxs)
    assert not list((ds_dir).glob("**/.tmp-*"))  # the next writer removed what the dead one left
