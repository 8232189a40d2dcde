"""Every datastore in the loaded model's own tokenizer, whichever way the model is named.

The daemon hands the indexer the loaded model's tokenizer (`LoadedModel.indexer_tokenizer`); a corpus comes
from `rest-index build --tokenizer MODEL`, which must resolve MODEL to the same vocabulary. For CodeLlama the
raw tokenizer.json is not that vocabulary (transformers 5 adds `<FILL_ME>` at 32016), so the test also shows
the raw file's fingerprint differs.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from indexer.tokenizer import fingerprint, load_tokenizer
from indexer.types import IndexerError, TokenizerMismatch

ROOT = Path(__file__).resolve().parents[2]


def rest_index(*args, env):
    return subprocess.run([sys.executable, "-m", "indexer.cli", *map(str, args)], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=600)


@pytest.fixture(scope="module")
def named(tiny_codellama_dir, tmp_path_factory):
    """The tiny CodeLlama as a directory, as a real .gguf file and as a hub id in an offline hub cache."""
    from testmodels.tiny import install_in_hub_cache, write_llama_gguf

    tmp = tmp_path_factory.mktemp("named")
    gguf = write_llama_gguf(tiny_codellama_dir, tmp / "tiny-codellama.gguf")
    install_in_hub_cache(tiny_codellama_dir, tmp / "hub", "tiny-org/tiny-codellama")
    ws = tmp / "ws"
    ws.mkdir()
    (ws / "util.py").write_text("def add(a, b):\n    return a + b  # <FILL_ME> stays text\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "REST_LSP_CACHE": str(tmp / "cache"), "HF_HUB_OFFLINE": "1",
           "HF_HUB_CACHE": str(tmp / "hub"), "TRANSFORMERS_VERBOSITY": "error"}
    return {"dir": str(tiny_codellama_dir), "gguf": str(gguf), "hub": "tiny-org/tiny-codellama"}, ws, env, tmp


@pytest.mark.parametrize("naming", ["dir", "gguf"])
def test_the_loaded_model_and_rest_index_build_share_one_vocabulary(named, naming, monkeypatch):
    from rest_lsp.model.host import load_model

    names, ws, env, tmp = named
    monkeypatch.setenv("REST_LSP_CACHE", env["REST_LSP_CACHE"])   # the GGUF's converted copy goes there
    lm = load_model(names[naming], device="cpu")
    model_fp = fingerprint(lm.tokenizer)
    assert lm.fim is not None and lm.fim.name == "codellama" and lm.vocab_size == 32016
    assert fingerprint(lm.indexer_tokenizer)["vocab_hash"] == model_fp["vocab_hash"]
    assert lm.indexer_tokenizer is not as_fast(lm.tokenizer)   # a copy: no state shared across threads
    # the corpus command resolves the same name to the same vocabulary (in a child process: no torch there)
    out = tmp / f"corpus-{naming}"
    p = rest_index("build", ws, "--out", out, "--tokenizer", names[naming], "--json", env=env)
    assert p.returncode == 0, p.stderr[-2000:]
    built = json.loads(p.stdout)["tokenizer"]
    assert (built["vocab_hash"], built["vocab_size"]) == (model_fp["vocab_hash"], model_fp["vocab_size"])
    from indexer.store import Datastore

    Datastore.open(out, tokenizer=lm.indexer_tokenizer).close()   # what the daemon does with --corpus
    ids = lm.indexer_tokenizer.encode("return a + b", add_special_tokens=False).ids
    assert Datastore.open(out, tokenizer=lm.indexer_tokenizer).search(ids[:3], max_len=4).match_len == 3


def as_fast(tok):
    return tok.backend_tokenizer


def test_the_raw_tokenizer_json_is_not_codellamas_vocabulary_under_transformers(named, codellama_tokenizer):
    names, *_ = named
    from tokenizers import Tokenizer

    raw = Tokenizer.from_file(str(Path(names["dir"]) / "tokenizer.json"))
    assert fingerprint(raw)["vocab_size"] == 32016 and fingerprint(codellama_tokenizer)["vocab_size"] == 32017
    # a model directory is resolved as transformers loads it, not read raw
    assert fingerprint(load_tokenizer(names["dir"]))["vocab_hash"] == fingerprint(codellama_tokenizer)["vocab_hash"]


def test_rest_index_build_with_a_hub_id_offline(named, codellama_tokenizer):
    names, ws, env, tmp = named
    p = rest_index("build", ws, "--out", tmp / "corpus-hub", "--tokenizer", names["hub"], "--json", env=env)
    assert p.returncode == 0, p.stderr[-2000:]
    assert json.loads(p.stdout)["tokenizer"]["vocab_hash"] == fingerprint(codellama_tokenizer)["vocab_hash"]
    # an id that is in no cache, offline: a clear error naming it, no traceback
    p = rest_index("build", ws, "--out", tmp / "x", "--tokenizer", "tiny-org/not-there", env=env)
    assert p.returncode == 2 and "tiny-org/not-there" in p.stderr and "Traceback" not in p.stderr


def test_a_store_in_another_vocabulary_is_refused_with_the_command_that_rebuilds_it(named, tiny_model_dir, tmp_path):
    from indexer.store import Datastore

    names, ws, *_ = named
    Datastore.build([ws], tmp_path / "qwen-store", tokenizer=str(tiny_model_dir)).close()
    with pytest.raises(TokenizerMismatch, match="--tokenizer MODEL") as e:
        Datastore.open(tmp_path / "qwen-store", tokenizer=load_tokenizer(names["dir"]))
    assert "32017" in str(e.value)
    with pytest.raises(IndexerError, match="no tokenizer given"):
        load_tokenizer(None)
    from indexer.build import build_datastore

    with pytest.raises(IndexerError, match="no tokenizer given"):
        build_datastore([ws], tmp_path / "none", tokenizer=None)


@pytest.mark.embedded
def test_the_embedded_models_datastore_tokenizer_is_the_models():
    from transformers import AutoTokenizer

    from rest_lsp.model.host import embedded_model_dir

    model_tok = AutoTokenizer.from_pretrained(str(embedded_model_dir()))
    assert fingerprint(load_tokenizer("embedded"))["vocab_hash"] == fingerprint(model_tok)["vocab_hash"]


def test_one_vocabulary_encoded_another_way_is_refused(named, codellama_tokenizer, tmp_path):
    """CodeLlama's hub tokenizer.json with `<FILL_ME>` added has transformers' vocabulary, but its SentencePiece
    normalizer puts a dummy space before text that starts with a space, where the model's Metaspace does not:
    the same vocabulary hash, other ids for the same text."""
    from tokenizers import AddedToken, Tokenizer

    from indexer.manifest import read_manifest, write_manifest
    from indexer.store import Datastore

    names, ws, *_ = named
    raw = Tokenizer.from_file(str(Path(names["dir"]) / "tokenizer.json"))
    raw.add_special_tokens([AddedToken("<FILL_ME>", special=True, normalized=False)])
    assert fingerprint(raw)["vocab_hash"] == fingerprint(codellama_tokenizer)["vocab_hash"]
    assert raw.encode("  x").ids != codellama_tokenizer.encode("  x", add_special_tokens=False)
    Datastore.build([ws], tmp_path / "raw", tokenizer=raw).close()
    with pytest.raises(TokenizerMismatch, match="another encoding"):
        Datastore.open(tmp_path / "raw", tokenizer=codellama_tokenizer)
    # a store written before fingerprints had encoding_hash is checked by its vocabulary alone
    m = read_manifest(tmp_path / "raw")
    del m["tokenizer"]["encoding_hash"]
    write_manifest(tmp_path / "raw", m)
    Datastore.open(tmp_path / "raw", tokenizer=codellama_tokenizer).close()


def test_watch_keeps_an_existing_stores_tokenizer(named, tmp_path):
    """`rest-index watch` without --tokenizer on a store built for CodeLlama syncs it in CodeLlama's tokenizer
    (a default would rebuild it in the embedded model's)."""
    from indexer.build import build_datastore
    from indexer.cli import store_tokenizer

    names, ws, *_ = named
    rep = build_datastore([ws], tmp_path / "store", tokenizer=names["dir"])
    assert store_tokenizer(tmp_path / "store") == str(Path(names["dir"]).resolve())
    assert store_tokenizer(tmp_path / "none") is None
    assert fingerprint(load_tokenizer(store_tokenizer(tmp_path / "store")))["vocab_hash"] == rep["tokenizer"]["vocab_hash"]
