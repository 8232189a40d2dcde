"""End to end over stdio: a real `rest-lsp --stdio` process, the tiny model, pygls' client.

Each server start costs a model load, so each test drives one process through several checks.
"""
from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from lsprotocol import types
from pygls.exceptions import JsonRpcException

from e2e_common import SOURCE, wait_for
from testmodels.gate import gate_env


def error_code(exc: JsonRpcException) -> int:
    return exc.to_response_error().code


async def test_completion_workspace_cache_config(session, tiny_model, tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "util.py").write_text("def add(a, b):\n    return a + b\n")
    result = await session.initialize({"model": str(tiny_model), "timeBudgetMs": 0, "maxTokens": 24,
                                       "draftBudget": 4, "cacheDir": str(tmp_path / "cache")}, [ws])
    assert result.capabilities.inline_completion_provider is not None
    assert result.capabilities.text_document_sync.change == types.TextDocumentSyncKind.Incremental

    uri = (ws / "demo.py").as_uri()
    session.open(uri, SOURCE)
    # where the cursor rests (our clients' notification) and where an edit leaves it: the prompt is computed
    # there and the model predicts on from it at low priority
    session.client.protocol.notify("rest/cursor", {"textDocument": {"uri": uri},
                                                   "position": {"line": 10, "character": 4}})
    session.client.protocol.notify("rest/cursor", {"textDocument": {"uri": uri}, "position": {"line": "x"}})
    st = await wait_for(session, lambda st: st["totals"]["cursor_notifications"] == 1
                        and st["totals"]["typing_predictions"] == 1 and st["totals"]["runs"] == 1,
                        "the prediction at the cursor")
    assert st["totals"]["prompt_tokens"] > 0 and st["totals"]["tokens"] > 0
    # multi-line at the empty line inside main(); single line where code follows the cursor
    multi = await session.complete(uri, 10, 4, invoked=True)
    item = multi.items[0]
    assert item.range.start == types.Position(10, 4) and item.range.end == types.Position(10, 4)
    # Invoked: the greedy answer and one alternative sampled at temperature 0.8 (`alternatives` 2), shown only
    # when it differs; for the tiny model (seed 0) a multi-line sample differs from the greedy text
    texts = [i.insert_text for i in multi.items]
    assert len(texts) == 2 and texts[0] != texts[1] and all(texts), texts
    single = await session.complete(uri, 5, 9)   # inside "with open(path) as f:", after "with " (the tiny
    # model, seed 0, says something there: the check below always runs)
    assert single.items and all("\n" not in i.insert_text for i in single.items), single
    st = await session.stats()
    recent = st["recent"]
    assert [r["mode"] for r in recent[-2:]] == ["multi", "single"]
    assert recent[-2]["trigger"] == "invoked" and recent[-1]["trigger"] == "automatic"
    # the first answered from what was predicted where the cursor rested; the second a model call
    assert recent[-2]["outcome"] in ("reused", "cache") and not recent[-2]["model_call"]
    assert st["totals"]["model_calls"] == 1 and recent[-1]["tokens"] > 0 and recent[-1]["steps"] > 0
    assert st["model"]["state"] == "ready"

    # the workspace is indexed with work-done progress, then watched
    st = await wait_for(session, lambda st: st["datastore"]["folders"][0]["state"] in ("ready", "failed"),
                        "workspace index")
    folder = st["datastore"]["folders"][0]
    assert folder["state"] == "ready", folder
    assert folder["documents"] >= 1
    kinds = [p.value["kind"] if isinstance(p.value, dict) else p.value.kind for p in session.progress]
    assert "begin" in kinds and "end" in kinds
    # a file written on disk shows up in the drafts
    (ws / "zoo.py").write_text("def zebra_quokka_marmot(x):\n    return x * 31337\n")
    await wait_for(session, lambda st: st["datastore"]["folders"][0]["watch_updates"] >= 1, "watcher update")
    drafts = await session.request("rest/drafts", {"text": "def zebra_quokka"})
    texts = "".join(c.text for c in drafts.continuations)
    assert "_marmot" in texts, drafts
    # an open buffer's unsaved text shows up in the drafts (the live shard)
    before = (await session.stats())["datastore"]["folders"][0]["live_updates"]
    session.edit(uri, 2, (11, 0), (11, 0), "\nrhinoceros_lemur_gazelle = 424242\n")
    await wait_for(session, lambda st: st["datastore"]["folders"][0]["live_updates"] > before, "live update")
    # the buffer is fed on the workspace's own thread, and a feed of the text before the edit may be the update
    # just counted: ask until the edit's text is there (the feed is seconds at most), then check it
    for _ in range(100):
        drafts = await session.request("rest/drafts", {"text": "rhinoceros_lemur"})
        if "_gazelle" in "".join(c.text for c in drafts.continuations):
            break
        await asyncio.sleep(0.1)
    assert "_gazelle" in "".join(c.text for c in drafts.continuations)

    # the completion cache: typing the first character of the suggestion costs no model call
    line_doc = (ws / "cache.py").as_uri()
    text = "values = [1, 2, 3]\ntotal = sum(values"
    session.open(line_doc, text)
    first = await session.complete(line_doc, 1, 18)
    # the tiny model (seed 0) completes this line with at least two characters: the check always runs
    assert first.items and len(first.items[0].insert_text) >= 2, first
    shown = first.items[0].insert_text
    calls = (await session.stats())["totals"]["model_calls"]
    session.edit(line_doc, 2, (1, 18), (1, 18), shown[0])
    again = await session.complete(line_doc, 1, 19)
    st = await session.stats()
    assert st["recent"][-1]["outcome"] in ("cache", "reused")  # the prediction may still be decoding
    assert st["totals"]["model_calls"] == calls
    # the rest of what was shown, continued where the first answer was cut at the predict budget
    assert again.items[0].insert_text.startswith(shown[1:].rstrip())

    # selectedCompletionInfo: the answer extends the selected item and replaces its range
    sel_doc = (ws / "sel.py").as_uri()
    session.open(sel_doc, "import os\nx = os.pa")
    sel = types.SelectedCompletionInfo(range=types.Range(types.Position(1, 7), types.Position(1, 9)), text="path")
    r = await session.complete(sel_doc, 1, 9, selected=sel)
    assert r.items, r
    for it in r.items:
        assert it.insert_text.startswith("path") and it.range.start == types.Position(1, 7)

    # a configuration change takes effect: a language filter, then a smaller token budget
    session.client.workspace_did_change_configuration(types.DidChangeConfigurationParams(
        settings={"rest-lsp": {"languages": ["rust"], "maxTokens": 3}}))
    r = await session.complete(uri, 10, 4)
    st = await session.stats()
    assert not r.items and st["recent"][-1]["outcome"] == "skipped"
    assert st["config"]["max_tokens"] == 3 and st["config"]["languages"] == ["rust"]
    session.client.workspace_did_change_configuration(types.DidChangeConfigurationParams(
        settings={"rest-lsp": {"languages": None}}))
    r = await session.complete(uri, 10, 4, invoked=True)
    st = await session.stats()
    assert st["recent"][-1]["outcome"] == "completed" and r.items and r.items[0].insert_text
    assert 0 < st["recent"][-1]["tokens"] <= 3 * 2
    # a bad setting is reported, not applied
    session.client.workspace_did_change_configuration(types.DidChangeConfigurationParams(
        settings={"rest-lsp": {"maxTokens": "lots", "noSuchSetting": 1}}))
    await wait_for(session, lambda st: True, "config")
    assert (await session.stats())["config"]["max_tokens"] == 3
    assert any("noSuchSetting" in m.message for m in session.messages)


async def test_bad_input_keeps_the_server_up(session, tiny_model, tmp_path):
    await session.initialize({"model": str(tiny_model), "maxTokens": 8, "draftBudget": 4,
                              "cacheDir": str(tmp_path / "cache")})
    uri = (tmp_path / "a.py").as_uri()
    session.open(uri, "def f(x):\n    return x\n")
    # unknown document
    with pytest.raises(JsonRpcException) as e:
        await session.complete((tmp_path / "never-opened.py").as_uri(), 0, 0)
    assert error_code(e.value) == -32602 and "unknown document" in str(e.value)
    # a line past the end of the file: InvalidParams; a column past the end of a line: the line's end
    with pytest.raises(JsonRpcException) as e:
        await session.complete(uri, 40, 0)
    assert error_code(e.value) == -32602 and "past the end" in str(e.value)
    r = await session.complete(uri, 0, 500)
    assert r.items and all(it.range.start == types.Position(0, 9) for it in r.items), r
    # malformed params, written raw: the client's own types would refuse to send them
    fut = asyncio.get_running_loop().create_future()
    session.client.protocol._request_futures["bad-1"] = fut
    body = json.dumps({"jsonrpc": "2.0", "id": "bad-1", "method": "textDocument/inlineCompletion",
                       "params": {"textDocument": 5, "position": "here"}}).encode()
    session.proc.stdin.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)
    with pytest.raises(JsonRpcException) as e:
        await session._wait(fut, 30)
    assert error_code(e.value) == -32602 and "malformed" in str(e.value)
    # binary content: no completion, and the reason in the stats
    bin_uri = (tmp_path / "blob.bin").as_uri()
    session.open(bin_uri, "\x00\x01\x02binary\x00" * 100, language="plaintext")
    r = await session.complete(bin_uri, 0, 5)
    assert not r.items and (await session.stats())["recent"][-1]["reason"] == "binary content"
    # a 10 MB document: answered (the prompt is a window around the cursor)
    big = "".join(f"def function_{i}(a, b):\n    return a * {i} + b\n\n" for i in range(240_000))
    assert len(big) > 10_000_000
    big_uri = (tmp_path / "big.py").as_uri()
    session.open(big_uri, big)
    r = await session.complete(big_uri, 240_000 * 3, 0)
    rec = (await session.stats())["recent"][-1]
    assert rec["outcome"] == "completed" and rec["mode"] == "multi" and r.items and r.items[0].insert_text
    # still serving ordinary requests
    r = await session.complete(uri, 1, 4)
    rec = (await session.stats())["recent"][-1]
    assert rec["outcome"] == "completed" and rec["model_call"] and r.items and r.items[0].insert_text


HOLD_AFTER = 8   # tokens a run of the cancellation test decodes before the gate holds it


async def gated_session(start_session, tmp_path: Path, hold_after: int) -> tuple[object, Path]:
    """A server whose runs wait at the gate file (testmodels/gate.py) once they have decoded `hold_after` tokens."""
    gate = tmp_path / "gate"
    return await start_session(gate_env(tmp_path / "hook", gate, hold_after)), gate


async def test_cancellation_and_supersession(start_session, tiny_model, tmp_path):
    session, gate = await gated_session(start_session, tmp_path, HOLD_AFTER)
    try:
        await _cancel_and_supersede(session, tiny_model, gate, tmp_path)
    finally:
        gate.unlink(missing_ok=True)   # a held run would keep the server from shutting down


async def _cancel_and_supersede(session, tiny_model: Path, gate: Path, tmp_path: Path) -> None:
    # long generations: plain decoding, many tokens, no time budgets (no partial answers), no line limit; every
    # run waits at the gate once it has decoded HOLD_AFTER tokens
    await session.initialize({"model": str(tiny_model), "maxTokens": 3000, "maxLines": 100000,
                              "timeBudgetMs": 0, "predictBudgetMs": 0, "promptBudgetMs": 0, "draftBudget": 0,
                              "index_workspace": False})
    uri = (tmp_path / "long.py").as_uri()
    session.open(uri, SOURCE)
    await wait_for(session, lambda st: st["model"]["state"] == "ready", "model")
    # supersession: a newer request for the same document wins without any $/cancelRequest. The cursor is at
    # the end of the file, at the top level: no later line can leave its block, so the older answer can only
    # be complete once its run ends, and the gate holds it
    older = asyncio.ensure_future(session.complete(uri, 11, 0))
    # held at the gate, not merely started: an edit that came earlier would stop it with fewer tokens
    held = Path(f"{gate}.held")
    await wait_for(session, lambda st: held.exists() and st["model"]["running"], "the older request at the gate")
    newer = asyncio.ensure_future(session.request(
        types.TEXT_DOCUMENT_INLINE_COMPLETION, session.inline_params(uri, 11, 0, invoked=True), msg_id="newer"))
    r = await older
    assert not r.items
    st = await session.stats()
    assert st["recent"][-1]["outcome"] == "superseded" and st["model"]["running"]
    # cancellation: the newer one, waiting on the held run, answers RequestCancelled; the prediction goes on
    # (the next keys may be what it says) ...
    session.client.protocol.notify(types.CANCEL_REQUEST, types.CancelParams(id="newer"))
    with pytest.raises(JsonRpcException) as e:
        await newer
    assert error_code(e.value) == -32800
    st = await session.stats()
    assert st["predictions"]["live"] == 1 and st["model"]["running"]
    # ... until an edit contradicts it: it stops at its next step (let through once the edit is in), and its
    # work counts as wasted
    session.edit(uri, 2, (11, 0), (11, 0), "\u00a7\u00a7 nothing a model would say")
    await session.stats()   # answered after the edit is handled (messages are handled in order)
    gate.unlink()
    st = await wait_for(session, lambda st: st["totals"]["wasted_steps"] > 0 and not st["model"]["running"],
                        "the stopped decode")
    t = st["totals"]
    assert t["cancelled"] == 1 and t["superseded"] == 1 and st["predictions"]["live"] == 0
    assert HOLD_AFTER <= t["wasted_tokens"] <= HOLD_AFTER + 1, t   # what it decoded before the gate, and one step


async def test_an_empty_automatic_answer_is_followed_by_suggestion_ready(start_session, tiny_model, tmp_path):
    # a prompt budget no prompt meets (the gate holds every run before its prompt: a tiny model could otherwise
    # finish within the budget on a loaded machine), no warm-up before the request: the Automatic request is
    # answered empty at once; the server says when the suggestion is there, for the document version and place asked
    session, gate = await gated_session(start_session, tmp_path, 0)
    try:
        await _empty_then_ready(session, tiny_model, gate, tmp_path)
    finally:
        gate.unlink(missing_ok=True)


async def _empty_then_ready(session, tiny_model: Path, gate: Path, tmp_path: Path) -> None:
    await session.initialize({"model": str(tiny_model), "promptBudgetMs": 1, "warmUp": False, "maxTokens": 16,
                              "indexWorkspace": False})
    uri = (tmp_path / "ready.py").as_uri()
    session.open(uri, SOURCE)
    session.edit(uri, 2, (10, 4), (10, 4), "re")
    await wait_for(session, lambda st: st["model"]["state"] == "ready", "model")
    r = await session.complete(uri, 10, 6)
    st = await session.stats()
    assert not r.items and st["recent"][-1]["answer"] == "prompt_budget" and st["recent"][-1]["watched"]
    assert st["totals"]["ready_notices"] == 0
    gate.unlink()
    await wait_for(session, lambda st: st["totals"]["ready_notices"] == 1, "the notice")
    assert session.ready == [{"textDocument": {"uri": uri, "version": 2}, "position": {"line": 10, "character": 6}}]
    r = await session.complete(uri, 10, 6)   # asked again: answered from the prediction, no new model run
    st = await session.stats()
    assert r.items and r.items[0].insert_text and st["recent"][-1]["source"] != "new"
    assert st["totals"]["predictions"] == 1   # (edits and newer requests end a watch: tests/server/test_latency.py)


async def test_model_failure_then_recovery_and_unwritable_cache(session, tiny_model, tmp_path):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the cache directory should go")
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "m.py").write_text("x = 1\n")
    await session.initialize({"model": str(tmp_path / "no-such-model"), "cacheDir": str(blocker / "cache")}, [ws])
    uri = (ws / "m.py").as_uri()
    session.open(uri, "x = 1\n")
    await wait_for(session, lambda st: st["model"]["state"] == "failed", "model failure")
    with pytest.raises(JsonRpcException) as e:
        await session.complete(uri, 1, 0)
    assert error_code(e.value) == -32001 and "no-such-model" in str(e.value)
    assert any(m.type == types.MessageType.Error and "no-such-model" in m.message for m in session.logs)
    # a good model and a corpus datastore through the configuration: the same server now completes
    from indexer.store import Datastore

    corpus_src = tmp_path / "corpus-src"
    corpus_src.mkdir()
    (corpus_src / "lib.py").write_text("def helper(value):\n    return value * 2\n")
    Datastore.build([corpus_src], tmp_path / "corpus", tokenizer=str(tiny_model)).close()
    session.client.workspace_did_change_configuration(types.DidChangeConfigurationParams(
        settings={"model": str(tiny_model), "maxTokens": 8, "draftBudget": 4, "corpus": str(tmp_path / "corpus")}))
    st = await wait_for(session, lambda st: st["model"]["state"] == "ready", "model reload")
    assert st["model"]["corpus"] == "loaded"
    r = await session.complete(uri, 1, 0)
    assert (await session.stats())["recent"][-1]["outcome"] == "completed" and r.items and r.items[0].insert_text
    # the cache directory could not be created: the workspace is not indexed, and says why
    st = await wait_for(session, lambda st: st["datastore"]["folders"][0]["state"] in ("ready", "failed"),
                        "workspace state")
    assert st["datastore"]["folders"][0]["state"] == "failed"
    assert "not-a-dir" in st["datastore"]["folders"][0]["error"]


async def test_rebuild_index_command(session, tiny_model, tmp_path):
    """workspace/executeCommand rest-lsp.rebuildIndex: answers at once, then the folder is rebuilt from
    scratch with work-done progress and comes back ready with its documents counted."""
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "util.py").write_text("def add(a, b):\n    return a + b\n")
    result = await session.initialize({"model": str(tiny_model), "cacheDir": str(tmp_path / "cache")}, [ws])
    assert "rest-lsp.rebuildIndex" in result.capabilities.execute_command_provider.commands
    st = await wait_for(session, lambda st: st["datastore"]["folders"][0]["state"] in ("ready", "failed"),
                        "workspace index")
    assert st["datastore"]["folders"][0]["state"] == "ready" and st["datastore"]["folders"][0]["documents"] == 1
    assert st["datastore"]["folders"][0]["rebuilds"] == 0

    (ws / "more.py").write_text("def mul(a, b):\n    return a * b\n")
    session.progress.clear()
    answer = await session._wait(session.client.workspace_execute_command_async(
        types.ExecuteCommandParams(command="rest-lsp.rebuildIndex")))
    assert list(answer["folders"] if isinstance(answer, dict) else answer.folders) == [str(ws.resolve())]
    st = await wait_for(session, lambda st: st["datastore"]["folders"][0]["rebuilds"] == 1, "rebuild")
    folder = st["datastore"]["folders"][0]
    assert folder["state"] == "ready" and folder["documents"] == 2 and folder["watching"]
    values = [p.value if isinstance(p.value, dict) else p.value.__dict__ for p in session.progress]
    begins = [v for v in values if v["kind"] == "begin"]
    assert begins and begins[0]["title"] == "rest-lsp: rebuilding the index"
    assert any(v["kind"] == "end" for v in values)

    with pytest.raises(JsonRpcException) as exc:
        await session._wait(session.client.workspace_execute_command_async(
            types.ExecuteCommandParams(command="rest-lsp.nope")))
    assert error_code(exc.value) == -32602 and "rest-lsp.nope" in str(exc.value)


async def test_history_survives_a_restart(start_session, tiny_model, tmp_path):
    """The model's output is a draft source kept in the cache directory: written when the daemon closes,
    read when the next one starts; an unreadable file is moved aside (not overwritten) and reported."""
    cache = tmp_path / "cache"
    options = {"model": str(tiny_model), "maxTokens": 16, "draftBudget": 4, "timeBudgetMs": 0,
               "cacheDir": str(cache), "indexWorkspace": False}
    doc = tmp_path / "h.py"
    first = await start_session()
    await first.initialize(options)
    first.open(doc.as_uri(), SOURCE)
    await first.complete(doc.as_uri(), 10, 4, invoked=True)
    history = (await first.stats())["model"]["history"]
    assert history["tokens"] > 0 and history["error"] is None
    saved = Path(history["file"])
    assert saved.parent == cache / "history"
    await first.close()
    assert saved.is_file()

    second = await start_session()
    await second.initialize(options)
    st = await wait_for(second, lambda st: st["model"]["state"] == "ready", "model load")
    restored = st["model"]["history"]["tokens"]
    assert restored > history["tokens"]  # the earlier output (and this load's warm-up), before any request
    await second.close()

    saved.write_bytes(saved.read_bytes()[:-7])  # a torn file
    third = await start_session()
    await third.initialize(options)
    st = await wait_for(third, lambda st: st["model"]["state"] == "ready", "model load")
    assert "corrupted" in st["model"]["history"]["error"] or "readable" in st["model"]["history"]["error"]
    assert st["model"]["history"]["tokens"] < history["tokens"]  # only this load's warm-up
    assert len(list(saved.parent.glob(saved.name + ".unreadable-*"))) == 1
    third.open(doc.as_uri(), SOURCE)
    r = await third.complete(doc.as_uri(), 10, 4, invoked=True)
    assert r.items and (await third.stats())["model"]["history"]["tokens"] > 0
    await third.close()
    # persistHistory off: nothing is read or written
    fourth = await start_session()
    await fourth.initialize({**options, "cacheDir": str(tmp_path / "cache-off"), "persistHistory": False})
    fourth.open(doc.as_uri(), SOURCE)
    await fourth.complete(doc.as_uri(), 10, 4, invoked=True)
    assert (await fourth.stats())["model"]["history"]["file"] is None
    await fourth.close()
    assert not (tmp_path / "cache-off" / "history").exists()
