"""`rest-lsp --tcp` over a real socket: only the user steers it (issue 31, item 6).

A real server process on a free loopback port with the tiny model on its command line; the clients are raw
sockets speaking LSP frames, so that a test sends exactly what a stranger on the machine could send.
"""
from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from raw_client import frame, read_message

SERVER_NOT_INITIALIZED, NOT_ALLOWED, UNAUTHORIZED, BUSY = -32002, -32003, -32004, -32005
SOURCE = "import os\n\n\ndef read_config(path):\n    with open(path) as f:\n        return f.read()\n\n\ndef main():\n    \n"


class TcpServer:
    """`rest-lsp --tcp --port 0 ...`; its stderr lines are collected to learn the port and the token file."""

    def __init__(self, tmp: Path, args: tuple[str, ...], env: dict):
        self.tmp = tmp
        self.log_file = tmp / "server.log"
        self.lines: list[str] = []
        self._cv = threading.Condition()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "rest_lsp.cli", "--tcp", "--port", "0", "--log-file", str(self.log_file), *args],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            env={**os.environ, "TRANSFORMERS_VERBOSITY": "error", **env})
        threading.Thread(target=self._read, daemon=True).start()
        self.port = int(self.line("rest-lsp: listening on ").rsplit(":", 1)[1])

    def _read(self) -> None:
        for raw in self.proc.stderr:
            with self._cv:
                self.lines.append(raw.decode(errors="replace").rstrip("\n"))
                self._cv.notify_all()
        with self._cv:
            self.lines.append("<end of stderr>")
            self._cv.notify_all()

    def line(self, prefix: str, contains: str = "", timeout: float = 120) -> str:
        """The first stderr line starting with `prefix` (and holding `contains`)."""
        end = time.monotonic() + timeout
        with self._cv:
            while True:
                for line in self.lines:
                    if line.startswith(prefix) and contains in line:
                        return line
                if "<end of stderr>" in self.lines or time.monotonic() > end:
                    raise AssertionError(f"no stderr line {prefix!r}...{contains!r}:\n" + "\n".join(self.lines)
                                         + "\n--- log ---\n" + self.log()[-3000:])
                self._cv.wait(0.5)

    @property
    def token_file(self) -> Path:
        return Path(self.line("rest-lsp: token file: ").split(": ", 2)[2])

    @property
    def token(self) -> str:
        return self.token_file.read_text().strip()

    def log(self) -> str:
        return self.log_file.read_text(errors="replace") if self.log_file.exists() else ""

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return self.proc.wait()


class Peer:
    """One TCP client; what the server sends is read on a thread."""

    def __init__(self, port: int):
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.replies: dict = {}
        self.notifications: list[dict] = []
        self.closed = False
        self._cv = threading.Condition()
        self._next = 0
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        f = self.sock.makefile("rb")
        try:
            while True:
                msg = read_message(f)
                if msg is None:
                    return
                with self._cv:
                    if "method" in msg and "id" in msg:   # a request from the server: answer null
                        self.sock.sendall(frame({"jsonrpc": "2.0", "id": msg["id"], "result": None}))
                    elif "method" in msg:
                        self.notifications.append(msg)
                    else:
                        self.replies[msg.get("id")] = msg
                    self._cv.notify_all()
        except OSError:
            pass
        finally:
            with self._cv:
                self.closed = True
                self._cv.notify_all()

    def wait(self, pred, what: str, timeout: float = 120):
        end = time.monotonic() + timeout
        with self._cv:
            while not (v := pred()):
                if time.monotonic() > end:
                    raise AssertionError(f"no {what} in {timeout} s")
                self._cv.wait(0.5)
            return v

    def send(self, method: str, params=None, msg_id=None) -> None:
        obj = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            obj["params"] = params
        if msg_id is not None:
            obj["id"] = msg_id
        self.sock.sendall(frame(obj))

    def request(self, method: str, params=None) -> dict:
        self._next += 1
        msg_id = f"r{self._next}"
        self.send(method, params, msg_id)
        return self.wait(lambda: self.replies.get(msg_id) or (self.closed and {"closed": True}),
                         f"the reply to {method}")

    def initialize(self, options: dict) -> dict:
        return self.request("initialize", {"processId": None, "rootUri": None,
                                           "capabilities": {"textDocument": {"inlineCompletion": {}}},
                                           "initializationOptions": options})

    def wait_closed(self) -> None:
        self.wait(lambda: self.closed, "the server closing the connection")

    def close(self) -> None:
        # close() alone keeps the connection open while the reader thread's makefile holds the socket
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


@pytest.fixture
def tcp_server(tmp_path, shared_cache, tiny_model):
    started: list[TcpServer] = []

    def start(*args: str) -> TcpServer:
        folder = tmp_path / f"server-{len(started)}"
        folder.mkdir()
        s = TcpServer(folder, ("--model", str(tiny_model), *args), {"REST_LSP_CACHE": str(shared_cache)})
        started.append(s)
        return s

    yield start
    for s in started:
        s.stop()


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rest_lsp.cli", *args], capture_output=True, text=True,
                          timeout=120, stdin=subprocess.DEVNULL)


def wait_stats(peer: Peer, pred, what: str, tries: int = 600) -> dict:
    for _ in range(tries):
        st = peer.request("rest/stats", {"last": 10})["result"]
        if pred(st):
            return st
        time.sleep(0.1)
    raise AssertionError(f"{what}: {json.dumps(st)[:2000]}")


def error_code(reply: dict) -> int | None:
    return (reply.get("error") or {}).get("code")


def test_a_client_needs_the_token_from_a_private_file(tcp_server):
    srv = tcp_server()
    path = srv.token_file
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    token = srv.token
    assert len(token) >= 32

    stranger = Peer(srv.port)
    # before initialize: a request is refused, `exit` is dropped (it does not end the server)
    assert error_code(stranger.request("rest/stats", {})) == SERVER_NOT_INITIALIZED
    stranger.send("exit")
    r = stranger.initialize({"maxTokens": 8})
    assert error_code(r) == UNAUTHORIZED and "without a token" in r["error"]["message"], r
    stranger.wait_closed()

    wrong = Peer(srv.port)
    r = wrong.initialize({"token": token[:-1] + ("A" if token[-1] != "A" else "B")})
    assert error_code(r) == UNAUTHORIZED and "wrong token" in r["error"]["message"], r
    wrong.wait_closed()
    not_text = Peer(srv.port)
    assert error_code(not_text.initialize({"token": 12345})) == UNAUTHORIZED
    not_text.wait_closed()

    user = Peer(srv.port)
    r = user.initialize({"token": token, "maxTokens": 8})
    assert "inlineCompletionProvider" in r["result"]["capabilities"], r
    user.send("initialized", {})
    st = wait_stats(user, lambda st: st["model"]["state"] == "ready", "the model loads")
    assert st["config"]["max_tokens"] == 8   # the token was not taken for a setting...
    said = json.dumps(user.notifications)
    assert "unknown setting" not in said and token not in said, said
    assert token not in srv.log()            # ...nor logged
    user.close()

    assert srv.stop() == 0                   # SIGTERM: a clean end, the token file removed
    assert not path.exists()


def test_no_auth_only_on_loopback_and_tcp_options_only_with_tcp(tcp_server):
    p = run_cli("--tcp", "--no-auth", "--host", "0.0.0.0", "--port", "0")
    assert p.returncode == 2 and "loopback" in p.stderr, p.stderr
    p = run_cli("--stdio", "--trust-client")
    assert p.returncode == 2 and "only with --tcp" in p.stderr, p.stderr

    srv = tcp_server("--no-auth")
    srv.line("rest-lsp: --no-auth")
    assert not [line for line in srv.lines if line.startswith("rest-lsp: token file")]
    peer = Peer(srv.port)
    assert "result" in peer.initialize({}), "--no-auth lets a client in without a token"
    peer.close()


def _complete(peer: Peer, tmp: Path) -> dict:
    uri = (tmp / "demo.py").as_uri()
    peer.send("textDocument/didOpen", {"textDocument": {"uri": uri, "languageId": "python", "version": 1,
                                                         "text": SOURCE}})
    return peer.request("textDocument/inlineCompletion", {
        "textDocument": {"uri": uri}, "position": {"line": 9, "character": 4}, "context": {"triggerKind": 1}})


def test_paths_models_and_drafts_need_trust_client(tcp_server, tiny_model, tmp_path):
    log = tmp_path / "requests.jsonl"
    elsewhere = tmp_path / "elsewhere"
    srv = tcp_server()
    peer = Peer(srv.port)
    r = peer.initialize({"token": srv.token, "model": str(tmp_path / "no-such-model"), "requestLog": str(log),
                         "cacheDir": str(elsewhere), "corpus": str(tmp_path / "no-corpus"), "maxTokens": 7,
                         "timeBudgetMs": 0})
    assert "result" in r, r
    peer.send("initialized", {})
    shown = peer.wait(lambda: [n for n in peer.notifications if n["method"] == "window/showMessage"
                               and "--trust-client" in n["params"]["message"]], "the warning")
    assert all(k in shown[0]["params"]["message"] for k in ("model", "requestLog", "cacheDir", "corpus"))
    st = wait_stats(peer, lambda st: st["model"]["state"] == "ready", "the model loads")
    cfg = st["config"]
    # refused settings are ignored; the others apply
    assert cfg["model"] == str(tiny_model) and cfg["request_log"] is None and cfg["cache_dir"] is None
    assert cfg["corpus"] is None and cfg["max_tokens"] == 7

    peer.send("workspace/didChangeConfiguration", {"settings": {"restLsp": {"requestLog": str(log), "maxLines": 3}}})
    st = wait_stats(peer, lambda st: st["config"]["max_lines"] == 3, "the new setting")
    assert st["config"]["request_log"] is None

    assert "result" in _complete(peer, tmp_path)
    wait_stats(peer, lambda st: st["totals"]["requests"] >= 1, "the request recorded")
    assert not log.exists() and not elsewhere.exists()

    r = peer.request("rest/drafts", {"text": "def read_config(path):"})
    assert error_code(r) == NOT_ALLOWED and "--trust-client" in r["error"]["message"], r
    peer.close()


def test_trust_client_takes_paths_and_answers_drafts(tcp_server, tiny_model, tmp_path):
    log = tmp_path / "requests.jsonl"
    srv = tcp_server("--trust-client")
    peer = Peer(srv.port)
    assert "result" in peer.initialize({"token": srv.token, "model": str(tiny_model), "requestLog": str(log),
                                        "maxTokens": 7, "timeBudgetMs": 0})
    peer.send("initialized", {})
    st = wait_stats(peer, lambda st: st["model"]["state"] == "ready", "the model loads")
    assert st["config"]["request_log"] == str(log)
    assert "result" in _complete(peer, tmp_path)
    wait_stats(peer, lambda st: log.exists() and log.read_text().strip(), "the request log")
    assert json.loads(log.read_text().splitlines()[0])["trigger"] == "invoked"
    r = peer.request("rest/drafts", {"text": "def read_config(path):"})
    assert "match_len" in r.get("result", {}), r
    peer.close()


def test_one_client_at_a_time_and_the_server_outlives_its_clients(tcp_server):
    srv = tcp_server()
    token = srv.token
    first = Peer(srv.port)
    assert "result" in first.initialize({"token": token})
    first.send("initialized", {})

    second = Peer(srv.port)
    r = second.initialize({"token": token})
    assert error_code(r) == BUSY and "another client" in r["error"]["message"], r
    second.wait_closed()
    # the first is not disturbed: its answers still come to it
    assert "result" in first.request("rest/stats", {})

    first.close()    # a disconnect without shutdown: the server stays for the next client
    srv.line("rest-lsp: client ", "without shutdown; waiting for the next client")
    third = Peer(srv.port)
    assert "result" in third.initialize({"token": token})
    third.send("initialized", {})
    wait_stats(third, lambda st: st["model"]["state"] == "ready", "the model loads for the next client")
    assert third.request("shutdown")["result"] is None
    third.send("exit")
    third.wait_closed()
    srv.line("rest-lsp: client ", ": exit; waiting for the next client")

    fourth = Peer(srv.port)    # `exit` ended that client's session, not the server
    assert "result" in fourth.initialize({"token": token})
    fourth.send("initialized", {})
    wait_stats(fourth, lambda st: st["model"]["state"] == "ready", "the model loads for the fourth client")
    assert srv.alive()
    fourth.close()


def test_exit_on_disconnect_ends_the_server_with_its_client(tcp_server):
    srv = tcp_server("--exit-on-disconnect")
    path = srv.token_file
    peer = Peer(srv.port)
    assert "result" in peer.initialize({"token": srv.token})
    peer.send("initialized", {})
    assert peer.request("shutdown")["result"] is None
    peer.send("exit")
    assert srv.proc.wait(60) == 0
    assert not path.exists()

    srv = tcp_server("--exit-on-disconnect")
    peer = Peer(srv.port)
    assert "result" in peer.initialize({"token": srv.token})
    peer.close()                  # no shutdown: exit code 1, as over stdio
    assert srv.proc.wait(60) == 1


def test_withhold_keeps_the_shape_and_the_other_settings():
    from rest_lsp.service.config import PATH_KEYS, withhold

    flat = {"model": "/m", "requestLog": "/tmp/x", "cache_dir": "/c", "maxTokens": 9}
    kept, dropped = withhold(flat, PATH_KEYS)
    assert kept == {"maxTokens": 9} and sorted(dropped) == ["cache_dir", "model", "requestLog"]
    assert flat["model"] == "/m"     # the caller's object is left as it was
    nested = {"restLsp": {"corpus": "/k", "layout": "line"}, "other": 1}
    kept, dropped = withhold(nested, PATH_KEYS)
    assert kept == {"restLsp": {"layout": "line"}, "other": 1} and dropped == ["corpus"]
    assert withhold({"device": "cpu"}, PATH_KEYS) == ({"device": "cpu"}, [])
    assert withhold(None, PATH_KEYS) == (None, [])


@pytest.mark.embedded
def test_a_client_leaving_while_the_model_loads_ends_the_server_cleanly(tmp_path):
    """The embedded model loads for longer than a session's end waits for its worker (5 s): the process must
    still end with 1, not abort in the interpreter's finalization with that thread inside torch (SIGABRT,
    "terminate called without an active exception": 1-2 of 3 tries before rest_lsp/cli.py's `_leave`). The
    client leaves at three moments of the load (imports, weights, the verifier)."""
    for i, after_s in enumerate((0.3, 1.0, 2.5)):
        (tmp_path / str(i)).mkdir()
        srv = TcpServer(tmp_path / str(i), ("--exit-on-disconnect",), {})
        peer = Peer(srv.port)
        assert "result" in peer.initialize({"token": srv.token, "persistHistory": False})
        time.sleep(after_s)
        peer.close()
        assert srv.proc.wait(120) == 1, "\n".join(srv.lines[-20:])
        assert not any("terminate called" in line for line in srv.lines)
