"""Issue 12 end to end, against a real `rest-lsp --stdio` process with the tiny model: secrets never reach a
datastore or a draft (workspace files, watched edits, open buffers), settings the model cannot serve are
fitted and shown, and a damaged workspace datastore is rebuilt on the next start."""
from __future__ import annotations

import json
import time

from raw_client import RawServer

from indexer.manifest import MANIFEST
from indexer.store import Datastore


def wait_stats(s: RawServer, pred, what: str, timeout: float = 90.0) -> dict:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        st = s.stats()
        if pred(st):
            return st
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}: {json.dumps(st)[:2000]}\n{s.log()[-2000:]}")


def open_doc(s: RawServer, uri: str, text: str, language: str = "python") -> None:
    s.send("textDocument/didOpen", {"textDocument": {"uri": uri, "languageId": language, "version": 1, "text": text}})


def test_no_secret_reaches_a_datastore_or_a_draft(tmp_path, tiny_model, shared_cache, secrets_sample):
    s_ = secrets_sample
    ws = tmp_path / "ws"
    (ws / "keys").mkdir(parents=True)
    (ws / "config.py").write_text(s_.config_py())
    (ws / "settings_local.py").write_text(s_.settings_py())
    (ws / "keys" / "deploy_key").write_text(s_.pem)
    (ws / "terraform.tfstate").write_text(json.dumps({"secret_key": s_.aws_secret}))
    (ws / "app.py").write_text("from config import region\n\n\ndef main():\n    return region()\n")
    server = RawServer(tmp_path, env={"REST_LSP_CACHE": str(shared_cache)})
    try:
        server.initialize({"model": str(tiny_model), "cacheDir": str(tmp_path / "cache"), "maxTokens": 8}, [ws])
        st = wait_stats(server, lambda st: st["datastore"] and st["datastore"]["folders"]
                        and st["datastore"]["folders"][0]["state"] in ("ready", "failed"), "the workspace index")
        folder = st["datastore"]["folders"][0]
        assert folder["state"] == "ready", folder
        # a secret written while the daemon watches
        (ws / "later.py").write_text(f'TOKEN = "{s_.github_token}"\nLIMIT = 3\n')
        wait_stats(server, lambda st: st["datastore"]["folders"][0]["watch_updates"] >= 1, "the watcher")
        # open buffers: key material by name, by content, and secrets in ordinary code, in and out of the folder
        env_uri, key_uri = (ws / ".env").as_uri(), (tmp_path / "id_rsa").as_uri()
        open_doc(server, env_uri, f"API_KEY={s_.api_key}\n", "dotenv")
        open_doc(server, key_uri, s_.pem, "plaintext")
        open_doc(server, (ws / "edit.py").as_uri(), f'API_KEY = "{s_.api_key}"\nDB_PASSWORD = "{s_.db_password}"\n')
        open_doc(server, (tmp_path / "outside.py").as_uri(), s_.config_py())
        st = wait_stats(server, lambda st: len(st["datastore"]["secret_buffers"]) == 2
                        and len(st["datastore"]["masked_live"]) == 2, "the open buffers")
        assert set(st["datastore"]["secret_buffers"]) == {env_uri, key_uri}
        assert sorted(st["datastore"]["masked_live"].values()) == [2, 4]
        store_stats = next(iter(st["datastore"]["stores"].values()))
        assert store_stats["masked_lines"] == 6 and store_stats["masked_files"] == 3

        leaked = []
        for prefix in ('API_KEY = "', "API_KEY=", 'GITHUB_TOKEN = "', 'TOKEN = "', 'AWS_SECRET_ACCESS_KEY = "',
                       'DATABASE_URL = "postgres://app:', 'DB_PASSWORD = "', "-----BEGIN RSA PRIVATE KEY-----\n"):
            r = server.request("rest/drafts", {"text": prefix, "max_len": 32})["result"]
            text = "".join(c["text"] for c in r["continuations"])
            leaked += [(prefix, name) for name, v in s_.values().items() if v[:10] in text]
        store = Datastore.open(folder["datastore"])
        by_id = {sh.id: sh for sh in store._shards}
        for p, d in store.documents.items():
            decoded = store.tokenizer.decode([int(t) for t in by_id[d.shard].ids(d.start, d.end)])
            leaked += [(p, name) for name, v in s_.values().items() if v[:10] in decoded]
        assert leaked == []
        assert server.shutdown_and_exit() == 0
    finally:
        server.close()


def test_settings_the_model_cannot_serve_are_fitted_and_shown(tmp_path, tiny_model, shared_cache):
    server = RawServer(tmp_path, env={"REST_LSP_CACHE": str(shared_cache)})
    try:
        server.initialize({"model": str(tiny_model), "maxTokens": 100000, "indexWorkspace": False,
                           "cacheDir": str(tmp_path / "cache"), "timeBudgetMs": 2000, "noSuchOption": 1,
                           "corpus": str(tmp_path / "no-such-corpus")})
        st = wait_stats(server, lambda st: st["model"]["state"] == "ready", "the model")
        assert st["config"]["max_tokens"] < 4096 and "maxTokens 100000" in st["config_problems"][0]
        server.wait(lambda: len([n for n in server.notifications if n["method"] == "window/showMessage"]) >= 3,
                    10, "the warnings")
        shown = [n["params"]["message"] for n in server.notifications if n["method"] == "window/showMessage"]
        assert any("maxTokens 100000" in m for m in shown) and any("noSuchOption" in m for m in shown)
        assert any("no-such-corpus" in m and "not used" in m for m in shown)
        uri = (tmp_path / "a.py").as_uri()
        open_doc(server, uri, "def f(x):\n    \n")
        r = server.request("textDocument/inlineCompletion", {"textDocument": {"uri": uri},
                                                             "position": {"line": 1, "character": 4},
                                                             "context": {"triggerKind": 1}}, timeout=120)
        assert "result" in r, r
        assert server.stats()["totals"]["error"] == 0
    finally:
        server.close()


def test_a_damaged_workspace_store_is_rebuilt_at_the_next_start(tmp_path, tiny_model, shared_cache):
    ws = tmp_path / "ws"
    ws.mkdir()
    for i in range(3):
        (ws / f"m{i}.py").write_text(f"def f{i}(x):\n    return x + {i}\n")
    options = {"model": str(tiny_model), "cacheDir": str(tmp_path / "cache")}
    ready = lambda st: st["datastore"] and st["datastore"]["folders"] and \
        st["datastore"]["folders"][0]["state"] in ("ready", "failed")  # noqa: E731
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    first = RawServer(tmp_path / "one", env={"REST_LSP_CACHE": str(shared_cache)})
    try:
        first.initialize(options, [ws])
        store = wait_stats(first, ready, "the index")["datastore"]["folders"][0]["datastore"]
        assert first.shutdown_and_exit() == 0
    finally:
        first.close()
    manifest = (tmp_path / "cache").glob("workspaces/*/" + MANIFEST)
    m = next(manifest)
    m.write_bytes(m.read_bytes()[:-20])         # torn
    second = RawServer(tmp_path / "two", env={"REST_LSP_CACHE": str(shared_cache)})
    try:
        second.initialize(options, [ws])
        folder = wait_stats(second, ready, "the index")["datastore"]["folders"][0]
        assert folder["state"] == "ready" and folder["documents"] == 3 and folder["datastore"] == store
        assert "rebuilding" in second.log()
    finally:
        second.close()
