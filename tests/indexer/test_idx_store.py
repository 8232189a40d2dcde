"""The on-disk datastore: build, manifest, incremental updates equal a rebuild, merging, mismatches."""
from __future__ import annotations

import hashlib
import random
import shutil
import time

import msgpack
import pytest
from idx_helpers import contexts_from, random_file, results, source_lines, write_files

import indexer.refresh as refresh_mod
from indexer.store import Datastore
from indexer.tokenizer import fingerprint, load_tokenizer
from indexer.types import DatastoreNotFound, IndexerError, TokenizerMismatch


def test_build_manifest_and_search(tmp_path, bpe_tok_path):
    write_files(tmp_path / "repo", {
        "a.py": "def alpha(x):\n    return x + 1\n",
        "pkg/b.py": "def alpha(x):\n    return x * 2\n",
        "pkg/notes.txt": "def alpha(x): not code\n",
    })
    ds = Datastore.build([tmp_path / "repo"], tmp_path / "ds", tokenizer=bpe_tok_path)
    tok = load_tokenizer(bpe_tok_path)
    sealed = msgpack.unpackb((tmp_path / "ds" / "manifest.msgpack").read_bytes())
    assert sealed["format"] == 2 and hashlib.sha256(sealed["body"]).hexdigest() == sealed["sha256"]
    m = msgpack.unpackb(sealed["body"])
    assert m["width"] == 2 and m["kind"] == "repository"
    assert m["tokenizer"] == fingerprint(tok)
    assert m["build_time_s"] > 0
    assert sorted(m["docs"]["path"]) == sorted(str(tmp_path / "repo" / p) for p in ("a.py", "pkg/b.py"))
    for s in m["shards"]:
        for f in ("tok", "sa"):
            assert len(s["files"][f]["sha256"]) == 64 and s["files"][f]["size"] > 0
    for a, b in zip(m["docs"]["start"], m["docs"]["end"]):
        assert 0 <= a < b
    r = ds.search(tok.encode("def alpha(x):\n    return x", add_special_tokens=False).ids)
    texts = sorted(tok.decode(list(c.tokens)) for c in r.continuations)
    assert r.count == 2 and any(t.startswith(" + 1") for t in texts) and any(t.startswith(" * 2") for t in texts)
    st = ds.stats()
    assert st["documents"] == 2 and st["shards"] == 1 and st["bytes_per_token"] > 0


def test_incremental_updates_equal_a_fresh_build(tmp_path, bpe_tok_path):
    rng = random.Random(7)
    lines = source_lines()
    repo = tmp_path / "repo"
    files = {f"m{i}.py": random_file(rng, lines) for i in range(12)}
    files.update({f"sub/d{i}.py": random_file(rng, lines) for i in range(6)})
    write_files(repo, files)
    ds = Datastore.build([repo], tmp_path / "ds", tokenizer=bpe_tok_path)
    tok = ds.tokenizer
    for step in range(14):
        op = step % 7
        existing = sorted(p for p in repo.rglob("*.py"))
        if op in (0, 1, 2):  # edit
            p = rng.choice(existing)
            p.write_text(random_file(rng, lines))
            changed = [p]
        elif op == 3:  # create
            p = repo / f"new{step}.py"
            p.write_text(random_file(rng, lines))
            changed = [p]
        elif op == 4:  # delete
            p = rng.choice(existing)
            p.unlink()
            changed = [p]
        elif op == 5:  # rename (an editor's atomic save looks like this too)
            p = rng.choice(existing)
            q = p.with_name(f"renamed{step}.py")
            p.rename(q)
            changed = [p, q]
        else:  # move a folder
            src = repo / "sub" if (repo / "sub").exists() else repo / "sub2"
            dst = repo / ("sub2" if src.name == "sub" else "sub")
            src.rename(dst)
            changed = [src, dst]
        ds.update_paths(changed)
    texts = [p.read_text() for p in sorted(repo.rglob("*.py"))]
    ctxs = contexts_from(tok, texts, rng, n=60)
    fresh = Datastore.build([repo], tmp_path / "fresh", tokenizer=bpe_tok_path)
    assert ds.stats()["documents"] == fresh.stats()["documents"] == len(texts)
    assert ds.stats()["tokens"] == fresh.stats()["tokens"]
    assert results(ds, ctxs) == results(fresh, ctxs)
    # reopening from disk gives the same answers as the writer's in-memory view
    assert results(Datastore.open(tmp_path / "ds"), ctxs) == results(fresh, ctxs)
    assert ds.stats()["shards"] < 8  # merged: not one shard per update


def test_many_updates_merge_into_few_shards(tmp_path, bpe_tok_path, monkeypatch):
    import indexer.writer as writer

    monkeypatch.setattr(writer, "LEVEL_BASE_TOKENS", 64)
    rng = random.Random(3)
    lines = source_lines()
    repo = tmp_path / "repo"
    write_files(repo, {f"f{i}.py": random_file(rng, lines, 10) for i in range(4)})
    ds = Datastore.build([repo], tmp_path / "ds", tokenizer=bpe_tok_path)
    counts = []
    for i in range(40):
        p = repo / f"f{rng.randrange(6)}.py"
        p.write_text(random_file(rng, lines, 10))
        ds.update_paths([p])
        counts.append(ds.stats()["shards"])
    assert max(counts) <= 12 and ds.stats()["dead_tokens"] < ds.stats()["stored_tokens"]
    files = sorted((tmp_path / "ds" / "shards").iterdir())
    assert len(files) == 2 * ds.stats()["shards"]  # superseded shard files are deleted
    ctxs = contexts_from(ds.tokenizer, [p.read_text() for p in repo.glob("*.py")], rng, n=30)
    fresh = Datastore.build([repo], tmp_path / "fresh", tokenizer=bpe_tok_path)
    assert results(ds, ctxs) == results(fresh, ctxs)
    ds.compact()
    assert ds.stats()["shards"] == 1 and ds.stats()["dead_tokens"] == 0
    assert results(ds, ctxs) == results(fresh, ctxs)


def test_unchanged_content_is_not_reindexed(tmp_path, bpe_tok_path):
    write_files(tmp_path / "r", {"a.py": "x = 1\n"})
    ds = Datastore.build([tmp_path / "r"], tmp_path / "ds", tokenizer=bpe_tok_path)
    (tmp_path / "r" / "a.py").write_text("x = 1\n")  # a save without a change: new mtime only
    s = ds.update_paths([tmp_path / "r" / "a.py"])
    assert s["added"] == s["changed"] == 0 and s["unchanged"] == 1 and ds.stats()["shards"] == 1


def test_a_second_reader_sees_the_writers_updates(tmp_path, bpe_tok_path):
    write_files(tmp_path / "r", {"a.py": "alpha beta gamma\n"})
    writer = Datastore.build([tmp_path / "r"], tmp_path / "ds", tokenizer=bpe_tok_path)
    reader = Datastore.open(tmp_path / "ds", auto_refresh=False)  # refreshed when asked only
    tok = writer.tokenizer
    q = tok.encode("delta epsilon", add_special_tokens=False).ids
    assert reader.search(q[:2]).match_len == 0
    (tmp_path / "r" / "b.py").write_text("delta epsilon zeta\n")
    writer.update_paths([tmp_path / "r" / "b.py"])
    assert reader.refresh() is True
    assert reader.search(q[:2]).match_len == 2


def test_a_searching_reader_picks_up_updates_without_reading_the_manifest(tmp_path, bpe_tok_path, monkeypatch):
    """A reader opened with auto_refresh sees another writer's update by itself, and its searches never stat
    the manifest: the refresh thread does (indexer/refresh.py), not the drafting step."""
    import threading

    import indexer.store as store_mod

    write_files(tmp_path / "r", {"a.py": "alpha beta gamma\n"})
    writer = Datastore.build([tmp_path / "r"], tmp_path / "ds", tokenizer=bpe_tok_path)
    reader = Datastore.open(tmp_path / "ds")
    q = writer.tokenizer.encode("delta epsilon", add_special_tokens=False).ids
    signature, searcher, stats_here = store_mod.manifest_signature, threading.get_ident(), []

    def counted(path):
        if threading.get_ident() == searcher:
            stats_here.append(path)
        return signature(path)

    monkeypatch.setattr(store_mod, "manifest_signature", counted)
    assert reader.search(q[:2]).match_len == 0
    (tmp_path / "r" / "b.py").write_text("delta epsilon zeta\n")
    writer.update_paths([tmp_path / "r" / "b.py"])
    stats_here.clear()  # the writer's own
    deadline = time.monotonic() + 20
    while reader.search(q[:2]).match_len != 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert reader.search(q[:2]).match_len == 2
    assert stats_here == []
    reader.close()  # a closed store is no longer watched
    assert reader not in list(refresh_mod._watched)


def test_tokenizer_mismatch_names_both(tmp_path, bpe_tok_path, wide_tok_path):
    write_files(tmp_path / "r", {"a.py": "w1 w2 w3\n"})
    Datastore.build([tmp_path / "r"], tmp_path / "ds", tokenizer=bpe_tok_path)
    with pytest.raises(TokenizerMismatch) as e:
        Datastore.open(tmp_path / "ds", tokenizer=wide_tok_path)
    assert bpe_tok_path in str(e.value) and wide_tok_path in str(e.value)
    Datastore.open(tmp_path / "ds", tokenizer=bpe_tok_path)  # the same vocabulary opens
    # attaching a store built with another vocabulary is refused too
    Datastore.build([tmp_path / "r"], tmp_path / "wide", tokenizer=wide_tok_path)
    with pytest.raises(TokenizerMismatch):
        Datastore.open(tmp_path / "ds", attach=[tmp_path / "wide"])


def test_wide_vocabulary_store_uses_uint32(tmp_path, wide_tok_path):
    write_files(tmp_path / "r", {"a.py": "w69999 w70 w65536 w5 w69999 w70 w65537\n"})
    ds = Datastore.build([tmp_path / "r"], tmp_path / "ds", tokenizer=wide_tok_path)
    assert ds.width == 4 and ds.manifest["width"] == 4
    # few distinct ids: stored as 2-byte ranks into the shard's alphabet, answers in real ids
    assert ds.manifest["shards"][0]["token_width"] == 2 and "alpha" in ds.manifest["shards"][0]["files"]
    r = ds.search([69999, 70])
    assert r.count == 2 and sorted(c.tokens[0] for c in r.continuations) == [65536, 65537]
    assert ds.search([69998, 70]).match_len == 0 and ds.search([69998, 69999, 70]).match_len == 2
    # more distinct ids than 2 bytes can rank: 4-byte tokens, nothing truncated
    (tmp_path / "r" / "b.py").write_text(" ".join(f"w{i}" for i in range(65600)) + " w69999 w70 w9\n")
    ds.update_paths([tmp_path / "r" / "b.py"])
    assert [s["token_width"] for s in ds.manifest["shards"]] == [2, 4]
    r = ds.search([69999, 70])
    assert r.count == 3 and sorted(c.tokens[0] for c in r.continuations) == [9, 65536, 65537]
    assert ds.search([65598, 65599]).continuations[0].tokens == (69999, 70, 9)
    ctxs = [[69999, 70], [65598, 65599], [1, 2, 3], [70, 65536]]
    ds.compact()  # merging maps ranks back to ids
    fresh = Datastore.build([tmp_path / "r"], tmp_path / "fresh", tokenizer=wide_tok_path)
    assert results(ds, ctxs) == results(fresh, ctxs) and results(Datastore.open(tmp_path / "ds"), ctxs) == results(fresh, ctxs)


def test_attached_corpus_is_searched_with_its_weight(tmp_path, bpe_tok_path):
    write_files(tmp_path / "r", {"a.py": "common prefix repo_tail\n"})
    write_files(tmp_path / "c", {"a.py": "common prefix corpus_tail\n"})
    Datastore.build([tmp_path / "c"], tmp_path / "corpus", tokenizer=bpe_tok_path, kind="corpus")
    ds = Datastore.build([tmp_path / "r"], tmp_path / "repo", tokenizer=bpe_tok_path, attach=[tmp_path / "corpus"])
    tok = ds.tokenizer
    r = ds.search(tok.encode("common prefix", add_special_tokens=False).ids)
    assert r.count == 2
    top, second = r.continuations[0], r.continuations[1]
    assert tok.decode(list(top.tokens)).startswith(" repo") and top.weight == 2 * second.weight


def test_opening_nothing_is_a_clear_error(tmp_path):
    with pytest.raises(DatastoreNotFound, match="no datastore"):
        Datastore.open(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DatastoreNotFound, match="rest-index build"):
        Datastore.open(tmp_path / "empty")
    with pytest.raises(IndexerError):
        Datastore.memory(vocab_size=10).update_paths([tmp_path])


def test_rebuild_replaces_the_previous_store(tmp_path, bpe_tok_path):
    write_files(tmp_path / "r", {"a.py": "one two\n"})
    Datastore.build([tmp_path / "r"], tmp_path / "ds", tokenizer=bpe_tok_path)
    shutil.rmtree(tmp_path / "r")
    write_files(tmp_path / "r", {"b.py": "three four\n", "c.py": "five\n"})
    ds = Datastore.build([tmp_path / "r"], tmp_path / "ds", tokenizer=bpe_tok_path)
    assert ds.stats()["documents"] == 2
    assert len(list((tmp_path / "ds" / "shards").iterdir())) == 2


def test_a_transformers_style_tokenizer_object_is_checked_and_used(tmp_path, bpe_tok_path, wide_tok_path):
    """The daemon holds a transformers fast tokenizer: its backend's vocabulary is what gets compared."""
    from types import SimpleNamespace

    write_files(tmp_path / "r", {"a.py": "alpha beta gamma\n"})
    Datastore.build([tmp_path / "r"], tmp_path / "ds", tokenizer=bpe_tok_path)
    hf_like = SimpleNamespace(backend_tokenizer=load_tokenizer(bpe_tok_path), name_or_path="some/model")
    ds = Datastore.open(tmp_path / "ds", tokenizer=hf_like)
    (tmp_path / "r" / "b.py").write_text("delta epsilon\n")
    assert ds.update_paths([tmp_path / "r" / "b.py"])["added"] == 1  # tokenized through the object
    other = SimpleNamespace(backend_tokenizer=load_tokenizer(wide_tok_path), name_or_path="other/model")
    with pytest.raises(TokenizerMismatch, match="other/model"):
        Datastore.open(tmp_path / "ds", tokenizer=other)
