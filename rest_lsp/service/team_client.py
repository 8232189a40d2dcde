"""The editor side's client of a team server: OpenAI-compatible /v1/completions, streamed (stdlib only).

    client = TeamClient("http://team:8000", key="…")
    stream = client.stream(prompt_ids, max_tokens=64)    # the prompt as token ids: the daemon's own rendering
    while (piece := stream.next_text()) is not None:      # one server-sent event at a time
        ...
    stream.close()                                        # a superseded request: the connection is closed,
                                                          # and vLLM aborts the request when it sees that

The prompt goes as token ids, not text: the daemon renders the fill-in-the-middle prompt itself (FIM markers
as their ids, the cross-file block, the windows) and the server decodes exactly those tokens; OpenAI's `suffix`
field is not used (vLLM refuses it for Qwen models). Errors are TeamServerError with a message for the user.
"""
from __future__ import annotations

import http.client
import json
import os
import socket
import ssl
from dataclasses import dataclass, field
from typing import Sequence
from urllib.parse import urlsplit

KEY_ENV = "REST_LSP_TEAM_KEY"


class TeamServerError(Exception):
    """The team server could not be reached, refused the request (status 401: the key), or broke the stream."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


@dataclass
class TeamClient:
    url: str
    key: str | None = None
    model: str | None = None          # the served model's name; None: the first one /v1/models lists
    connect_timeout: float = 5.0
    read_timeout: float = 60.0
    _parts: tuple = field(init=False, repr=False)

    def __post_init__(self) -> None:
        u = urlsplit(self.url if "://" in self.url else f"http://{self.url}")
        if u.scheme not in ("http", "https") or not u.hostname:
            raise TeamServerError(f"team server URL {self.url!r}: expected http(s)://HOST[:PORT]")
        self._parts = (u.scheme, u.hostname, u.port or (443 if u.scheme == "https" else 80), u.path.rstrip("/"))

    # -- plumbing ------------------------------------------------------------------------------------
    def _connection(self) -> http.client.HTTPConnection:
        scheme, host, port, _ = self._parts
        if scheme == "https":
            return http.client.HTTPSConnection(host, port, timeout=self.connect_timeout,
                                               context=ssl.create_default_context())
        return http.client.HTTPConnection(host, port, timeout=self.connect_timeout)

    def _headers(self) -> dict:
        h = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
        if self.key:
            h["Authorization"] = f"Bearer {self.key}"
        return h

    def _open(self, method: str, path: str, body: dict | None = None):
        conn = self._connection()
        try:
            conn.request(method, self._parts[3] + path, body=None if body is None else json.dumps(body).encode(),
                         headers=self._headers())
            conn.sock.settimeout(self.read_timeout)
            resp = conn.getresponse()
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            raise TeamServerError(f"team server {self.url} unreachable: {type(exc).__name__}: {exc}") from None
        if resp.status != 200:
            detail = resp.read(2000).decode("utf-8", "replace").strip()
            conn.close()
            what = "the API key was refused" if resp.status == 401 else f"HTTP {resp.status}"
            raise TeamServerError(f"team server {self.url}: {what}: {detail[:300]}", resp.status)
        return conn, resp

    def get_json(self, path: str) -> dict:
        conn, resp = self._open("GET", path)
        try:
            return json.loads(resp.read())
        except ValueError as exc:
            raise TeamServerError(f"team server {self.url}: {path} is not JSON") from exc
        finally:
            conn.close()

    # -- the API -------------------------------------------------------------------------------------
    def models(self) -> list[str]:
        return [m.get("id") for m in self.model_cards()]

    def model_cards(self) -> list[dict]:
        """/v1/models' entries (vLLM's carry max_model_len)."""
        return [m for m in self.get_json("/v1/models").get("data", []) if isinstance(m, dict)]

    def model_name(self) -> str:
        if self.model is None:
            names = self.models()
            if not names:
                raise TeamServerError(f"team server {self.url} serves no model")
            self.model = names[0]
        return self.model

    def max_model_len(self) -> int | None:
        """The served model's context in the server (prompt + completion), where it says."""
        name = self.model_name()
        for card in self.model_cards():
            if card.get("id") == name and isinstance(card.get("max_model_len"), int):
                return card["max_model_len"]
        return None

    def stream(self, prompt: Sequence[int] | str, *, max_tokens: int, temperature: float = 0.0,
               seed: int | None = None, stop: Sequence[str] | None = None) -> "CompletionStream":
        body = {"model": self.model_name(), "prompt": list(prompt) if not isinstance(prompt, str) else prompt,
                "max_tokens": int(max_tokens), "temperature": float(temperature), "stream": True,
                "stream_options": {"include_usage": True}}
        if seed is not None:
            body["seed"] = int(seed)
        if stop:
            body["stop"] = list(stop)
        conn, resp = self._open("POST", "/v1/completions", body)
        return CompletionStream(conn, resp, self.url)

    def complete(self, prompt, *, max_tokens: int, **kw) -> str:
        """The whole completion's text (reads the stream to its end)."""
        s = self.stream(prompt, max_tokens=max_tokens, **kw)
        try:
            while s.next_text() is not None:
                pass
        finally:
            s.close()
        return s.text


class CompletionStream:
    """One streamed completion: `next_text()` reads one event's text (None at the end)."""

    def __init__(self, conn: http.client.HTTPConnection, resp: http.client.HTTPResponse, url: str):
        self.conn, self.resp, self.url = conn, resp, url
        self.text = ""
        self.finish_reason: str | None = None
        self.usage: dict | None = None
        self.done = False
        self.closed = False

    def next_text(self) -> str | None:
        if self.done:
            return None
        while True:
            try:
                line = self.resp.readline()
            except (OSError, http.client.HTTPException, socket.timeout) as exc:
                self.close()
                raise TeamServerError(f"team server {self.url}: the stream broke: {type(exc).__name__}: {exc}") \
                    from None
            if not line:   # the server closed the stream without [DONE]
                self.close()
                return None
            line = line.strip()
            if not line.startswith(b"data:"):
                continue   # blank separators, comments, event names
            data = line[5:].strip()
            if data == b"[DONE]":
                self.close()
                return None
            try:
                event = json.loads(data)
            except ValueError:
                continue
            if "error" in event:
                self.close()
                raise TeamServerError(f"team server {self.url}: {event['error']}")
            if event.get("usage"):
                self.usage = event["usage"]
            piece = ""
            for choice in event.get("choices") or ():
                piece += choice.get("text") or ""
                if choice.get("finish_reason"):
                    self.finish_reason = choice["finish_reason"]
            self.text += piece
            return piece

    def close(self) -> None:
        """Ends the stream; a stream closed before its end closes the connection, which aborts the request."""
        self.done = True
        if not self.closed:
            self.closed = True
            for part in (self.resp, self.conn):   # the response holds the socket's file: both let go of it
                try:
                    part.close()
                except (OSError, http.client.HTTPException):
                    pass


def client_from_setting(server) -> TeamClient:
    """The `server` setting: a URL string, or {"url": …, "key": …, "keyEnv": …, "model": …}; the key from the
    setting, else the variable it names (default REST_LSP_TEAM_KEY)."""
    if isinstance(server, str):
        server = {"url": server}
    if not isinstance(server, dict) or not isinstance(server.get("url"), str):
        raise TeamServerError("the server setting needs a url")
    key = server.get("key") or os.environ.get(server.get("key_env") or server.get("keyEnv") or KEY_ENV) or None
    return TeamClient(server["url"], key=key, model=server.get("model"))
