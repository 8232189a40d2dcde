"""A real `rest-lsp --stdio` process driven with raw bytes: what a broken client or an attacker could send.

The replies are read by a strict reader of our own on a thread (the server's replies are always well framed),
so a test can write anything to the server's stdin and still wait for a given answer.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path


def frame(obj, *, delta: int = 0, header: bytes = b"Content-Length", eol: bytes = b"\r\n") -> bytes:
    body = json.dumps(obj).encode() if not isinstance(obj, (bytes, bytearray)) else bytes(obj)
    return header + b": %d" % (len(body) + delta) + eol + eol + body


def read_message(f) -> dict | None:
    """The next JSON-RPC message from a binary stream (headers, then Content-Length bytes); None at its end."""
    length = None
    while True:
        line = f.readline()
        if not line:
            return None
        if line in (b"\r\n", b"\n"):
            break
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    assert length is not None, "the server sent a header block without Content-Length"
    return json.loads(f.read(length))


class RawServer:
    def __init__(self, tmp: Path, *, env: dict | None = None, args: tuple[str, ...] = ()):
        self.tmp = tmp
        self.log_file = tmp / "server.log"
        self.stderr_file = tmp / "server.stderr"
        self._stderr = open(self.stderr_file, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "rest_lsp.cli", "--stdio", "--log-file", str(self.log_file), *args],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr,
            env={**os.environ, "TRANSFORMERS_VERBOSITY": "error", **(env or {})})
        self.replies: dict = {}                 # id -> reply
        self.anonymous: list[dict] = []         # replies with id null (parse errors)
        self.notifications: list[dict] = []
        self._cv = threading.Condition()
        self._next = 0
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    # -- the server's output --------------------------------------------------------------------------
    def _read(self) -> None:
        while True:
            msg = read_message(self.proc.stdout)
            if msg is None:
                return
            with self._cv:
                if "method" in msg and "id" in msg:      # a request from the server: answer null
                    self.write(frame({"jsonrpc": "2.0", "id": msg["id"], "result": None}))
                elif "method" in msg:
                    self.notifications.append(msg)
                elif msg.get("id") is None:
                    self.anonymous.append(msg)
                else:
                    self.replies[msg["id"]] = msg
                self._cv.notify_all()

    def wait(self, pred, timeout: float = 60.0, what: str = "a reply"):
        end = time.monotonic() + timeout
        with self._cv:
            while True:
                v = pred()
                if v:
                    return v
                left = end - time.monotonic()
                if left <= 0 or self.proc.poll() is not None and not v:
                    if self.proc.poll() is not None:
                        raise AssertionError(f"the server exited ({self.proc.returncode}) waiting for {what}:\n"
                                             f"{self.log()[-3000:]}")
                    raise AssertionError(f"no {what} in {timeout} s:\n{self.log()[-3000:]}")
                self._cv.wait(min(left, 0.5))

    def reply(self, msg_id, timeout: float = 60.0) -> dict:
        return self.wait(lambda: self.replies.get(msg_id), timeout, f"the reply to {msg_id!r}")

    # -- input ----------------------------------------------------------------------------------------
    def write(self, data: bytes) -> None:
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def new_id(self) -> str:
        self._next += 1
        return f"t{self._next}"

    def send(self, method: str, params=None, msg_id=None) -> str | None:
        obj = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            obj["params"] = params
        if msg_id is not None:
            obj["id"] = msg_id
        self.write(frame(obj))
        return msg_id

    def request(self, method: str, params=None, timeout: float = 60.0) -> dict:
        return self.reply(self.send(method, params, self.new_id()), timeout)

    def initialize(self, options: dict, folders: list[Path] = ()) -> dict:
        r = self.request("initialize", {
            "processId": None, "rootUri": folders[0].as_uri() if folders else None,
            "capabilities": {"textDocument": {"inlineCompletion": {}}},
            "initializationOptions": options,
            "workspaceFolders": [{"uri": f.as_uri(), "name": f.name} for f in folders] or None})
        self.send("initialized", {})
        return r

    def stats(self) -> dict:
        return self.request("rest/stats", {"last": 50})["result"]

    def alive(self) -> bool:
        return self.proc.poll() is None

    def rss_mb(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return 0.0

    def log(self) -> str:
        out = self.log_file.read_text(errors="replace") if self.log_file.exists() else ""
        return out + "\n--- stderr ---\n" + self.stderr()

    def stderr(self) -> str:
        return self.stderr_file.read_text(errors="replace") if self.stderr_file.exists() else ""

    def shutdown_and_exit(self, timeout: float = 30.0) -> int:
        self.request("shutdown", None, timeout)
        self.send("exit")
        return self.proc.wait(timeout)

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
                self.proc.wait(15)
            except Exception:  # noqa: BLE001
                self.proc.kill()
                self.proc.wait()
        self._stderr.close()
