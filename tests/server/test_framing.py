"""The byte stream a broken client or an attacker could send, against a real `rest-lsp --stdio` process.

Each case is followed by a well-formed request that must be answered: the server resynchronises on the next
header instead of gluing later messages to the broken one. Errors are answered per JSON-RPC 2.0."""
from __future__ import annotations

import json

import pytest

from raw_client import RawServer, frame

PARSE_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND = -32700, -32600, -32601


@pytest.fixture
def raw(tmp_path, shared_cache):
    s = RawServer(tmp_path, env={"REST_LSP_CACHE": str(shared_cache)})
    yield s
    s.close()


def stats_request(msg_id: str) -> dict:
    return {"jsonrpc": "2.0", "id": msg_id, "method": "rest/stats", "params": {"last": 1}}


def assert_answers(raw: RawServer, msg_id: str) -> dict:
    r = raw.reply(msg_id, 30)
    assert "result" in r and r["result"]["totals"]["requests"] >= 0, r
    return r


def test_framing_errors_resynchronise(raw, tiny_model, tmp_path):
    raw.initialize({"model": str(tiny_model), "indexWorkspace": False, "cacheDir": str(tmp_path / "c")})
    broken = {"jsonrpc": "2.0", "id": "broken", "method": "rest/stats", "params": {}}
    cases = {
        # announced 5 bytes short: the body is not JSON (-32700), its tail is skipped up to the next header
        "short": frame(broken, delta=-5),
        # announced 5 and 50 bytes too long: the next header inside the body shows where it really ended;
        # the request's id is still readable, so it is answered (InvalidRequest), not left waiting
        "long": frame(broken, delta=5),
        "much-longer": frame(broken, delta=50),
        "not-a-number": b"Content-Length: five\r\n\r\n" + json.dumps(broken).encode(),
        "no-header": json.dumps(broken).encode(),
        "no-length": b"Content-Type: application/vscode-jsonrpc\r\n\r\n" + json.dumps(broken).encode(),
        "garbage": b"\x00\xff" * 300 + b"\r\n\r\nContent-Length\r\n",
    }
    for name, data in cases.items():
        raw.replies.pop("broken", None)
        raw.write(data)
        raw.write(frame(stats_request(f"after-{name}")))
        assert_answers(raw, f"after-{name}")
        if name == "short":
            assert raw.wait(lambda: raw.anonymous)[-1]["error"]["code"] == PARSE_ERROR
        elif name != "garbage":
            err = raw.reply("broken", 10)["error"]
            assert err["code"] == INVALID_REQUEST and "framed" in err["message"], (name, err)
    # a request announced too long, with nothing after it: answered once the stream stays quiet
    raw.replies.pop("broken", None)
    raw.write(frame(broken, delta=7))
    assert raw.reply("broken", 15)["error"]["code"] == INVALID_REQUEST

    # headers as some clients write them: lower case, LF-only line ends, a Content-Type line first
    raw.write(frame(stats_request("lower"), header=b"content-length"))
    raw.write(frame(stats_request("lf"), eol=b"\n"))
    body = json.dumps(stats_request("typed")).encode()
    raw.write(b"Content-Type: application/vscode-jsonrpc; charset=utf-8\r\nContent-Length: %d\r\n\r\n" % len(body)
              + body)
    for i in ("lower", "lf", "typed"):
        assert_answers(raw, i)

    # byte by byte, and several messages in one write
    data = frame(stats_request("slow"))
    for k in range(len(data)):
        raw.write(data[k:k + 1])
    raw.write(frame(stats_request("batch-1")) + frame(stats_request("batch-2")))
    for i in ("slow", "batch-1", "batch-2"):
        assert_answers(raw, i)

    st = raw.stats()["protocol"]
    assert st["framing_errors"] >= 6 and st["parse_errors"] >= 1 and st["bytes_skipped"] > 600
    assert raw.alive()


def test_json_rpc_errors_and_requests_after_shutdown(raw, tmp_path):
    raw.write(frame(b"{not json"))
    assert raw.wait(lambda: raw.anonymous)[-1]["error"]["code"] == PARSE_ERROR
    raw.write(frame(b"[[[[" * 50_000))          # nesting deep enough to exhaust the parser's recursion
    raw.wait(lambda: len(raw.anonymous) >= 2)
    assert raw.anonymous[-1]["error"]["code"] == PARSE_ERROR
    invalid = {
        "no-version": {"id": "a", "method": "rest/stats"},
        "method-number": {"jsonrpc": "2.0", "id": "b", "method": 5},
        "params-string": {"jsonrpc": "2.0", "id": "c", "method": "rest/stats", "params": "x"},
    }
    for i, obj in invalid.items():
        raw.write(frame(obj))
        assert raw.reply(obj["id"], 10)["error"]["code"] == INVALID_REQUEST, i
    for obj in ([], [{"jsonrpc": "2.0", "id": 1, "method": "x"}], 42, {"jsonrpc": "2.0", "id": [1], "method": "x"}):
        n = len(raw.anonymous)
        raw.write(frame(obj))
        raw.wait(lambda: len(raw.anonymous) > n)
        assert raw.anonymous[-1]["error"]["code"] == INVALID_REQUEST, obj
    assert raw.request("no/such/method")["error"]["code"] == METHOD_NOT_FOUND
    # malformed params of a custom request: InvalidParams, never an internal error with a traceback
    bad = raw.request("rest/drafts", {"text": "x", "max_len": "ten"})["error"]
    assert bad["code"] == -32602 and "data" not in bad or bad.get("data") is None

    assert raw.request("shutdown")["result"] is None
    after = raw.request("rest/stats", {})
    assert after["error"]["code"] == INVALID_REQUEST and "after shutdown" in after["error"]["message"]
    raw.send("exit")
    assert raw.proc.wait(15) == 0


def test_an_enormous_length_is_never_allocated(raw, tiny_model, tmp_path):
    raw.initialize({"model": str(tiny_model), "indexWorkspace": False, "cacheDir": str(tmp_path / "c")})
    base = raw.rss_mb()
    raw.write(b"Content-Length: 99999999999\r\n\r\n" + b'{"jsonrpc": "2.0", "method": "x", "params": "' + b"y" * 200_000)
    raw.write(frame(stats_request("after-huge")))
    r = assert_answers(raw, "after-huge")
    assert raw.rss_mb() - base < 200, (base, raw.rss_mb())
    assert r["result"]["protocol"]["oversized"] == 1
    # a message over --max-message-bytes (64 MiB by default) is skipped and shown to the user
    raw.wait(lambda: any(n["method"] == "window/showMessage" and "over the limit" in n["params"]["message"]
                         for n in raw.notifications), 10, "the warning")
    assert raw.alive()


def test_the_end_of_the_stream_saves_the_history_and_says_why(raw, tiny_model, tmp_path):
    cache = tmp_path / "cache"
    raw.initialize({"model": str(tiny_model), "indexWorkspace": False, "cacheDir": str(cache),
                    "maxTokens": 8, "timeBudgetMs": 0})
    uri = (tmp_path / "a.py").as_uri()
    raw.send("textDocument/didOpen", {"textDocument": {"uri": uri, "languageId": "python", "version": 1,
                                                       "text": "def f(x):\n    \n"}})
    r = raw.request("textDocument/inlineCompletion", {
        "textDocument": {"uri": uri}, "position": {"line": 1, "character": 4},
        "context": {"triggerKind": 1}}, timeout=120)
    assert "result" in r, r
    history = raw.stats()["model"]["history"]
    assert history["tokens"] > 0
    raw.proc.stdin.close()            # the editor died: no shutdown, no exit
    assert raw.proc.wait(30) == 1
    assert "the client closed the connection without shutdown; exiting" in raw.stderr()
    assert (cache / "history").is_dir() and any((cache / "history").glob("*.msgpack"))
