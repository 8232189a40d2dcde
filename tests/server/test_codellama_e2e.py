"""CodeLlama end to end: the daemon over stdio and `rest-lsp complete` with the tiny CodeLlama-layout model.

Every datastore the daemon builds or opens is in the model's own tokenizer (32,017 entries as transformers
loads CodeLlama's); one in another vocabulary is rebuilt when it is the daemon's own (the workspace) and
refused with the command that rebuilds it when it is the user's (the corpus).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from test_e2e import SOURCE, wait_for
from test_embedded_and_cli import run_cli


def model_fingerprint(model_dir) -> dict:
    from transformers import AutoTokenizer

    from indexer.tokenizer import fingerprint

    return fingerprint(AutoTokenizer.from_pretrained(str(model_dir)))


async def test_codellama_daemon_indexes_in_its_own_tokenizer_and_completes(session, tiny_codellama, tiny_model,
                                                                         tmp_path):
    from indexer.manifest import read_manifest
    from indexer.store import Datastore

    from rest_lsp.service.workspace import workspace_store_dir

    ws, cache = tmp_path / "ws", tmp_path / "cache"
    ws.mkdir()
    (ws / "zoo.py").write_text("def zebra_quokka_marmot(x):\n    return x * 31337\n")
    # this folder's datastore from an earlier daemon with another model (the tiny Qwen): ours, so rebuilt
    stale = workspace_store_dir(cache, ws.resolve())
    Datastore.build([ws.resolve()], stale, tokenizer=str(tiny_model)).close()
    # a corpus in that other vocabulary: the user's, so refused and reported
    Datastore.build([ws], tmp_path / "corpus", tokenizer=str(tiny_model)).close()
    await session.initialize({"model": str(tiny_codellama), "timeBudgetMs": 0, "maxTokens": 16, "draftBudget": 4,
                              "cacheDir": str(cache), "corpus": str(tmp_path / "corpus")}, [ws])
    uri = (ws / "demo.py").as_uri()
    session.open(uri, SOURCE)
    r = await session.complete(uri, 10, 4, invoked=True)
    st = await wait_for(session, lambda st: st["datastore"]["folders"][0]["state"] in ("ready", "failed"),
                        "workspace index")
    assert r.items and st["recent"][-1]["tokens"] > 0
    model = st["model"]
    assert model["state"] == "ready" and model["fim"] == "codellama"
    assert "TokenizerMismatch" in model["corpus"] and "--tokenizer MODEL" in model["corpus"], model["corpus"]
    folder = st["datastore"]["folders"][0]
    assert folder["state"] == "ready" and Path(folder["datastore"]) == stale
    want = model_fingerprint(tiny_codellama)
    got = read_manifest(stale)["tokenizer"]
    assert (got["vocab_size"], got["vocab_hash"], got["encoding_hash"]) == \
        (32017, want["vocab_hash"], want["encoding_hash"])
    drafts = await session.request("rest/drafts", {"text": "def zebra_quokka"})
    assert "_marmot" in "".join(c.text for c in drafts.continuations), drafts
    # an open buffer's text goes to the live shard in the model's tokens too
    before = (await session.stats())["datastore"]["folders"][0]["live_updates"]  # the open buffer's, one or more
    session.edit(uri, 2, (11, 0), (11, 0), "\nrhinoceros_lemur_gazelle = 424242\n")
    await wait_for(session, lambda st: st["datastore"]["folders"][0]["live_updates"] > before, "live update")
    drafts = await session.request("rest/drafts", {"text": "rhinoceros_lemur"})
    assert "_gazelle" in "".join(c.text for c in drafts.continuations)


def test_complete_with_a_hub_id_offline(tiny_codellama, tmp_path, shared_cache):
    from testmodels.tiny import install_in_hub_cache

    install_in_hub_cache(tiny_codellama, tmp_path / "hub", "tiny-org/tiny-codellama")
    ws = tmp_path / "ws"
    ws.mkdir()
    target = ws / "demo.py"
    target.write_text(SOURCE)
    (ws / "util.py").write_text("def read_config(path):\n    with open(path) as f:\n        return f.read()\n")
    env = {**os.environ, "REST_LSP_CACHE": str(shared_cache), "TRANSFORMERS_VERBOSITY": "error",
           "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path / "hub")}
    p = run_cli("complete", f"{target}:11:5", "--model", "tiny-org/tiny-codellama", "--workspace", str(ws),
                "--cache-dir", str(tmp_path / "cache"), "--max-tokens", "16", "--json", "--compare", env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout)
    assert out["model"] == "tiny-org/tiny-codellama" and out["figures"]["tokens"] > 0
    assert out["plain"]["same_text"] is True and out["plain"]["tokens"] == out["figures"]["tokens"]
    ws_store = out["workspace"]
    assert ws_store["state"] == "ready"
    from indexer.manifest import read_manifest

    got = read_manifest(Path(ws_store["datastore"]))["tokenizer"]
    want = model_fingerprint(tiny_codellama)
    assert (got["vocab_hash"], got["encoding_hash"]) == (want["vocab_hash"], want["encoding_hash"])
