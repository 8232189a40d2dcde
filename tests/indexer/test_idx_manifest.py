"""A damaged manifest, however damaged, is a one-line CorruptManifest (never a KeyError or an empty result),
and the daemon's path (open_or_build) rebuilds the store on its own."""
from __future__ import annotations

import hashlib
import random
import subprocess
import sys

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from idx_helpers import contexts_from, random_file, results, source_lines, write_files

from indexer.manifest import MANIFEST, read_manifest
from indexer.store import Datastore
from indexer.types import CorruptManifest, IndexerError
from indexer.watch import open_or_build


@pytest.fixture(scope="module")
def built(tmp_path_factory, bpe_tok_path):
    root = tmp_path_factory.mktemp("manifest")
    rng = random.Random(3)
    lines = source_lines()
    write_files(root / "r", {f"f{i}.py": random_file(rng, lines) for i in range(6)})
    ds = Datastore.build([root / "r"], root / "ds", tokenizer=bpe_tok_path)
    ctxs = contexts_from(ds.tokenizer, [p.read_text() for p in (root / "r").glob("*.py")], rng, n=20)
    return root, (root / "ds" / MANIFEST).read_bytes(), ctxs, results(ds, ctxs)


def body_of(data: bytes) -> dict:
    return msgpack.unpackb(msgpack.unpackb(data, raw=False)["body"], raw=False, strict_map_key=False)


def seal(m: dict) -> bytes:
    """A manifest with a valid checksum: damage a checksum cannot see (a writer's bug, a crafted file)."""
    body = msgpack.packb(m, use_bin_type=True)
    return msgpack.packb({"format": 2, "sha256": hashlib.sha256(body).hexdigest(), "body": body}, use_bin_type=True)


def install(store_dir, data: bytes, original: bytes) -> None:
    (store_dir / MANIFEST).write_bytes(data)


def one_line_error(store_dir) -> str:
    with pytest.raises(CorruptManifest) as e:
        Datastore.open(store_dir)
    msg = str(e.value)
    assert "\n" not in msg and "rebuild" in msg
    return msg


def test_flipped_bytes_and_truncation_fail_the_checksum(built):
    root, data, _, _ = built
    try:
        for pos in (len(data) // 3, len(data) // 2, len(data) - 5):
            damaged = bytearray(data)
            damaged[pos] ^= 0x20
            install(root / "ds", bytes(damaged), data)
            one_line_error(root / "ds")
        install(root / "ds", data[:len(data) // 2], data)
        one_line_error(root / "ds")
    finally:
        install(root / "ds", data, data)


STRUCTURAL = {
    "no shards": lambda m: m.pop("shards"),
    "width 3": lambda m: m.update(width=3),
    "shard tokens negative": lambda m: m["shards"][0].update(tokens=-1),
    "shard files gone": lambda m: m["shards"][0].pop("files"),
    "file name escapes": lambda m: m["shards"][0]["files"]["tok"].update(name="../../etc/passwd"),
    "dead span past the end": lambda m: m["shards"][0].update(dead=[[0, 10**9]]),
    "unknown shard": lambda m: m["docs"]["shard"].__setitem__(0, "s999999"),
    "span past the shard": lambda m: m["docs"]["end"].__setitem__(0, 10**9),
    "column short": lambda m: m["docs"]["start"].pop(),
    "path not text": lambda m: m["docs"]["path"].__setitem__(0, 7),
    "doc twice": lambda m: m["docs"]["path"].__setitem__(1, m["docs"]["path"][0]),
    "tokenizer gone": lambda m: m.pop("tokenizer"),
    "filters wrong": lambda m: m.update(filters={"max_file_size": "big"}),
    "not a map": lambda m: m.clear(),
    "shard kind a list": lambda m: m["shards"][0].update(kind=["repository"]),  # found by the fuzz test below
}


def test_a_shard_without_a_kind_is_served_as_a_repository_shard(built):
    root, data, ctxs, expected = built
    m = body_of(data)
    for sm in m["shards"]:
        sm.pop("kind", None)
    try:
        install(root / "ds", seal(m), data)
        assert results(Datastore.open(root / "ds", verify=False), ctxs) == expected
    finally:
        install(root / "ds", data, data)


@pytest.mark.parametrize("damage", list(STRUCTURAL))
def test_structural_damage_is_named(built, damage):
    root, data, _, _ = built
    m = body_of(data)
    STRUCTURAL[damage](m)
    try:
        install(root / "ds", seal(m), data)
        one_line_error(root / "ds")
    finally:
        install(root / "ds", data, data)


def _mutate(draw, node, depth=0):
    """Replace one random node of the manifest tree by a random value."""
    if isinstance(node, dict) and node and depth < 4:
        k = draw(st.sampled_from(sorted(node, key=str)))
        if draw(st.booleans()):
            node[k] = draw(st.none() | st.integers(-5, 10**10) | st.text(max_size=5) | st.binary(max_size=5)
                           | st.lists(st.integers(-3, 3), max_size=3))
        else:
            _mutate(draw, node[k], depth + 1)
    elif isinstance(node, list) and node and depth < 4:
        i = draw(st.integers(0, len(node) - 1))
        if draw(st.booleans()):
            node[i] = draw(st.none() | st.integers(-5, 10**10) | st.text(max_size=5))
        else:
            _mutate(draw, node[i], depth + 1)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_mutation_is_refused_or_served_without_crashing(built, data):
    """Random damage to a sealed manifest: either a CorruptManifest/CorruptShard (IndexerError) or a store
    that searches without raising. Nothing else."""
    root, original, ctxs, _ = built
    m = body_of(original)
    _mutate(data.draw, m)
    try:
        install(root / "ds", seal(m), original)
        try:
            ds = Datastore.open(root / "ds", verify=False)
        except IndexerError as e:
            assert "\n" not in str(e)
            return
        for c in ctxs[:5]:
            ds.search(c)
        ds.stats()
    finally:
        install(root / "ds", original, original)


def test_the_daemons_path_rebuilds_a_damaged_store(built, tmp_path, bpe_tok_path):
    root, data, ctxs, expected = built
    store = tmp_path / "copy"
    Datastore.build([root / "r"], store, tokenizer=bpe_tok_path)
    m = body_of((store / MANIFEST).read_bytes())
    m["shards"][0]["files"].pop("sa")
    (store / MANIFEST).write_bytes(seal(m))
    messages = []
    ds = open_or_build([root / "r"], store, tokenizer=bpe_tok_path, log_fn=messages.append)
    assert results(ds, ctxs) == expected
    assert any("damaged" in msg for msg in messages)
    read_manifest(store)   # sound again on disk


def test_the_cli_says_one_line_and_exits_2(built):
    root, data, _, _ = built
    try:
        install(root / "ds", data[:40], data)
        r = subprocess.run([sys.executable, "-m", "indexer.cli", "stats", str(root / "ds"), "--json"],
                           capture_output=True, text=True)
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and "rebuild" in r.stderr
    finally:
        install(root / "ds", data, data)


def test_format_1_manifests_still_open(built):
    """Stores written before the checksum (format 1: the manifest map itself) are read and checked."""
    root, data, ctxs, expected = built
    m = body_of(data)
    m["format"] = 1
    try:
        install(root / "ds", msgpack.packb(m, use_bin_type=True), data)
        assert results(Datastore.open(root / "ds"), ctxs) == expected
    finally:
        install(root / "ds", data, data)
