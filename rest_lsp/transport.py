"""The LSP byte stream, read so that no input can take the server down.

pygls' own stdio reader (pygls.io_.run_async) allocates whatever `Content-Length` says (a MemoryError exits
the process at 99999999999), needs the header spelt `Content-Length: N\\r\\n` exactly, and after one framing
error glues every later message to the broken one, so the server never answers again. It also drops a body
that is not JSON, or not JSON-RPC, without a reply, and ignores requests after `shutdown` silently. Those
parts cannot be fixed from outside pygls, so this module replaces its reader and hands pygls only
well-formed JSON-RPC objects (docs/daemon.md, "Upstream issues", has the reproductions).

`MessageReader` turns bytes into `Message`s and `FramingError`s with bounded memory:

- header names are case-insensitive and lines may end in LF or CRLF (clients differ);
- a `Content-Length` over `max_body` is never allocated: the body is skipped like any unframed bytes;
- a JSON body cannot hold a raw header line (JSON strings escape CR and LF, and a bare `Content-Length:` is
  not JSON), so one inside a body means the announced length was wrong: the reader resynchronises there;
- bytes outside any message are skipped up to the next header line, keeping at most `max_header` of them
  (plus a short sample) in memory.

`Connection` runs a reader over a byte source and answers per JSON-RPC 2.0: -32700 for a body that is not
JSON, -32600 (InvalidRequest) for one that is not a JSON-RPC message and for requests after `shutdown`,
and, when a mis-framed message's id can still be read, an InvalidRequest answer to that id, so an editor
never waits forever on a request the server could not read.
"""
from __future__ import annotations

import asyncio
import hmac
import json
import logging
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Union

log = logging.getLogger(__name__)

MAX_BODY = 64 << 20        # bytes of one message; an open 20 MB buffer is the largest seen in practice
MAX_HEADER = 8 << 10       # bytes of one header block
STALL_S = 2.0              # a message still incomplete after this long without new bytes is re-examined
SAMPLE = 64 << 10          # bytes of skipped input kept to recover a request id from
CHUNK = 64 << 10

# A header line anywhere in the stream; it cannot occur inside a valid JSON body (see the docstring).
_HEADER_LINE = re.compile(rb"content-(?:length|type)[ \t]*:[^\r\n]*\r?\n", re.IGNORECASE)
_ANCHOR_MAX = MAX_HEADER          # a header line longer than this is not one
_BLANK = re.compile(rb"\r?\n\r?\n")


@dataclass
class Message:
    body: bytes


@dataclass
class FramingError:
    reason: str
    skipped: int = 0                      # bytes dropped
    sample: bytes = b""                   # their start (what an id can be recovered from)


Event = Union[Message, FramingError]


class MessageReader:
    """Incremental LSP framing with bounded memory. `feed` bytes as they arrive; `stalled` when no more came
    for a while; `close` at the end of the stream. Each returns the messages and framing errors found."""

    def __init__(self, max_body: int = MAX_BODY, max_header: int = MAX_HEADER):
        self.max_body = max_body
        self.max_header = max_header
        self._buf = bytearray()
        self._need: int | None = None     # body length being read; None: looking for a header
        self._scanned = 0                 # body bytes already checked for a header line
        self._skipped = 0                 # unframed bytes dropped since the last message
        self._sample = bytearray()
        self._why: str | None = None      # why bytes are being skipped

    @property
    def pending(self) -> bool:
        """Part of a message (or skipped bytes not reported yet) is held."""
        # in the header state the buffer is short (unframed bytes are dropped), so strip() is cheap
        return self._need is not None or self._skipped > 0 or bool(self._buf.strip())

    def feed(self, data: bytes) -> list[Event]:
        self._buf += data
        out: list[Event] = []
        while self._step(out):
            pass
        return out

    def stalled(self) -> list[Event]:
        """No bytes came for a while. A body shorter than announced, or bytes without a header, that hold a
        complete JSON value were a wrong length or a missing header: report them now (the client is waiting
        for an answer) instead of holding them until more bytes come."""
        if self._need is not None:
            body = bytes(self._buf)
            if _complete_json(body):
                self._buf.clear()
                self._need = None
                return [FramingError(f"a body of {len(body)} bytes where Content-Length announced more",
                                     len(body), body[:SAMPLE])]
            return []
        if self._buf.strip() and _complete_json(bytes(self._buf)):
            self._drop(len(self._buf), "bytes without a Content-Length header")
        return self._flush_skipped()

    def close(self) -> list[Event]:
        out = []
        if self._need is not None and self._buf:
            out.append(FramingError(f"the stream ended inside a message ({len(self._buf)} of {self._need} "
                                    "bytes)", len(self._buf), bytes(self._buf[:SAMPLE])))
        elif self._buf.strip():
            self._drop(len(self._buf), "bytes without a Content-Length header at the end of the stream")
        self._buf.clear()
        self._need = None
        return out + self._flush_skipped()

    # -- the state machine -------------------------------------------------------------------------
    def _step(self, out: list[Event]) -> bool:
        if self._need is not None:
            return self._read_body(out)
        m = _HEADER_LINE.search(self._buf)
        if m is None:
            # keep a tail that may be the start of a header line; drop the rest
            keep = min(len(self._buf), _ANCHOR_MAX)
            cut = len(self._buf) - keep
            nl = self._buf.rfind(b"\n", 0, len(self._buf))
            if nl >= cut:
                cut = nl + 1
            if cut > 0:
                self._drop(cut, "bytes without a Content-Length header")
            return False
        if m.start() > 0:
            self._drop(m.start(), "bytes without a Content-Length header")
        out.extend(self._flush_skipped())
        end = _BLANK.search(self._buf, 0, self.max_header + 4)
        # the block ends at the first blank line; a header line is at most max_header bytes
        if end is None:
            if len(self._buf) > self.max_header:
                self._drop(m.end() - m.start(), "a header block without its blank line")
                out.extend(self._flush_skipped())
                return True
            return False
        if end.end() > self.max_header:
            self._drop(m.end() - m.start(), f"a header block over {self.max_header} bytes")
            out.extend(self._flush_skipped())
            return True
        block = bytes(self._buf[:end.start()])
        length, problem = _content_length(block)
        del self._buf[:end.end()]
        if problem is not None:
            out.append(FramingError(problem))
            self._why = "the body of a message with a broken header"
            return True
        if length > self.max_body:
            out.append(FramingError(f"Content-Length {length} is over the limit of {self.max_body} bytes: the "
                                    "message is skipped"))
            self._why = "the body of a message over the size limit"
            return True
        self._need, self._scanned = length, 0
        return True

    def _read_body(self, out: list[Event]) -> bool:
        n = self._need
        assert n is not None
        upto = min(n, len(self._buf))
        start = max(0, self._scanned - _ANCHOR_MAX)
        m = _HEADER_LINE.search(self._buf, start, upto)
        if m is not None:
            body = bytes(self._buf[:m.start()])
            del self._buf[:m.start()]
            self._need = None
            out.append(FramingError(f"Content-Length {n}, but the next header came after {len(body)} bytes",
                                    len(body), body[:SAMPLE]))
            return True
        self._scanned = upto
        if len(self._buf) < n:
            return False
        body = bytes(self._buf[:n])
        del self._buf[:n]
        self._need = None
        cut = _header_start_at_end(body)
        if cut is not None and not _complete_json(body):
            # announced a few bytes too long: the body ends with the start of the next header
            self._buf[:0] = body[cut:]
            out.append(FramingError(f"Content-Length {n}, but the next header started after {cut} bytes",
                                    cut, body[:min(cut, SAMPLE)]))
            return True
        out.append(Message(body))
        return True

    def _drop(self, n: int, why: str) -> None:
        if len(self._sample) < SAMPLE:
            self._sample += self._buf[:min(n, SAMPLE - len(self._sample))]
        del self._buf[:n]
        self._skipped += n
        self._why = self._why or why

    def _flush_skipped(self) -> list[Event]:
        if not self._skipped:
            return []
        sample, n, why = bytes(self._sample), self._skipped, self._why or "unframed bytes"
        self._sample, self._skipped, self._why = bytearray(), 0, None
        if not sample.strip() and n == len(sample):
            return []           # stray line ends between messages: nothing lost
        return [FramingError(f"{n} bytes skipped ({why})", n, sample)]


def _content_length(block: bytes) -> tuple[int, str | None]:
    length = None
    for line in re.split(rb"\r?\n", block):
        name, sep, value = line.partition(b":")
        if not sep:
            return 0, f"a header line without a colon: {line[:80]!r}"
        if name.strip().lower() == b"content-length":
            v = value.strip()
            if not v.isdigit():
                return 0, f"Content-Length is not a number: {v[:40]!r}"
            length = int(v)
    if length is None:
        return 0, "a header block without Content-Length"
    return length, None


_HEADER_NAMES = (b"content-length", b"content-type")
_PARTIAL_LINE = re.compile(rb"(?:content-length[ \t]*:[ \t]*\d*|content-type[ \t]*:[^\r\n]*)\r?", re.I)


def _header_start_at_end(body: bytes) -> int | None:
    """Where the body's tail is the unfinished start of a header line (None: it is not). A JSON body never
    ends that way, but the caller still checks, since a JSON string may hold `content-type: ...`."""
    tail_from = max(0, len(body) - 200)
    for i in range(tail_from, len(body)):
        if body[i] in b"cC":
            rest = body[i:]
            low = rest.lower()
            if any(name.startswith(low) for name in _HEADER_NAMES) or _PARTIAL_LINE.fullmatch(rest):
                return i
    return None


def _complete_json(data: bytes) -> bool:
    try:
        json.loads(data)
        return True
    except (ValueError, RecursionError):
        return False


# ---------------------------------------------------------------------------------------------------
PARSE_ERROR = -32700
INVALID_REQUEST = -32600
INTERNAL_ERROR = -32603
SERVER_NOT_INITIALIZED = -32002   # LSP's code for a request before `initialize`
UNAUTHORIZED = -32004             # server-defined: an `initialize` over TCP without the server's token
BUSY = -32005                     # server-defined: another client is being served
GATE_MAX_BODY = 1 << 20           # an `initialize` is a few KB: a peer not let in gets no more memory than this


def message_id(obj: Any) -> int | str | None:
    """A JSON object's id when it is a valid JSON-RPC id (a string or an integer)."""
    i = obj.get("id") if isinstance(obj, dict) else None
    return i if isinstance(i, str) or (isinstance(i, int) and not isinstance(i, bool)) else None


def request_id(obj: Any) -> int | str | None:
    """The id of a JSON-RPC request object (one with a method), when it has a valid one."""
    return message_id(obj) if isinstance(obj, dict) and "method" in obj else None


def check_envelope(obj: Any) -> str | None:
    """Why `obj` is not a JSON-RPC 2.0 request, notification or response (None: it is one)."""
    if isinstance(obj, list):
        return "batches are not part of LSP" if obj else "an empty batch"
    if not isinstance(obj, dict):
        return f"a JSON {type(obj).__name__} is not a JSON-RPC message"
    if obj.get("jsonrpc") != "2.0":
        return 'the message lacks "jsonrpc": "2.0"'
    if "id" in obj:
        i = obj["id"]
        if not (isinstance(i, str) or (isinstance(i, int) and not isinstance(i, bool)) or
                (i is None and "method" not in obj)):
            return f"id {json.dumps(i)[:40]} is not a number or a string"
    if "method" in obj:
        if not isinstance(obj["method"], str):
            return "method is not a string"
        if "params" in obj and not isinstance(obj["params"], (dict, list)):
            return "params is neither an object nor an array"
        return None
    if "id" not in obj:
        return "neither a method nor an id"
    if ("result" in obj) == ("error" in obj):
        return "a response needs exactly one of result and error"
    return None


@dataclass
class TransportStats:
    messages: int = 0
    framing_errors: int = 0
    parse_errors: int = 0
    invalid_requests: int = 0
    after_shutdown: int = 0
    oversized: int = 0
    bytes_skipped: int = 0
    handler_errors: int = 0
    last_error: str | None = None
    by_reason: dict = field(default_factory=dict)

    def count(self, kind: str, reason: str) -> None:
        setattr(self, kind, getattr(self, kind) + 1)
        self.last_error = reason[:300]
        key = re.sub(r"\d+", "N", reason)[:120]   # one entry per kind of problem, not per length
        self.by_reason[key] = self.by_reason.get(key, 0) + 1

    def snapshot(self) -> dict:
        d = {k: getattr(self, k) for k in ("messages", "framing_errors", "parse_errors", "invalid_requests",
                                           "after_shutdown", "oversized", "bytes_skipped", "handler_errors",
                                           "last_error")}
        d["by_reason"] = dict(sorted(self.by_reason.items(), key=lambda kv: -kv[1])[:20])
        return d


class Connection:
    """One client connection: bytes in, JSON-RPC objects to pygls' protocol, error answers out.

    `protocol` is a pygls JsonRPCProtocol with its writer set; `warn(message)` reports a problem the user
    should see (rate-limited by the caller); `reader`: one that already holds the start of the stream (a TCP
    client's, read by its `Gate`)."""

    done = False     # run_connection reads until the stream ends

    def __init__(self, protocol, *, max_body: int = MAX_BODY, warn: Callable[[str], None] | None = None,
                 reader: MessageReader | None = None):
        self.protocol = protocol
        self.reader = reader or MessageReader(max_body=max_body)
        self.reader.max_body = max_body
        self.stats = TransportStats()
        self._warn = warn or (lambda message: None)

    def feed(self, data: bytes) -> None:
        self._dispatch(self.reader.feed(data))

    def stalled(self) -> None:
        self._dispatch(self.reader.stalled())

    def close(self) -> None:
        self._dispatch(self.reader.close())

    def dispatch(self, events: list[Event]) -> None:
        """Handle events read elsewhere (by a Gate) as if this connection had read them."""
        self._dispatch(events)

    def _dispatch(self, events: list[Event]) -> None:
        for ev in events:
            if isinstance(ev, Message):
                self._handle_body(ev.body)
            else:
                self._framing(ev)

    def _framing(self, ev: FramingError) -> None:
        self.stats.bytes_skipped += ev.skipped
        over = "over the limit" in ev.reason
        self.stats.count("oversized" if over else "framing_errors", ev.reason)
        log.warning("framing error: %s", ev.reason)
        if over:
            self._warn(f"a message was skipped: {ev.reason}")
        try:
            obj = json.loads(ev.sample) if ev.sample.strip() else None
        except (ValueError, RecursionError):
            obj = None
        i = request_id(obj)
        if i is not None:   # a request the client waits for: answer it, even if its frame was wrong
            self._reply(i, INVALID_REQUEST, f"the request was not framed correctly ({ev.reason})")

    def _handle_body(self, body: bytes) -> None:
        self.stats.messages += 1
        try:
            obj = json.loads(body)
        except (ValueError, RecursionError) as exc:
            why = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
            self.stats.count("parse_errors", f"not JSON: {why}")
            log.warning("parse error: %s", why)
            self._reply(None, PARSE_ERROR, f"Parse error: {why}")
            return
        problem = check_envelope(obj)
        if problem is not None:
            self.stats.count("invalid_requests", problem)
            log.warning("invalid message: %s", problem)
            if isinstance(obj, dict) and "method" not in obj and "id" in obj:
                return    # a broken response to one of our requests: answering it could loop
            self._reply(message_id(obj), INVALID_REQUEST, f"Invalid Request: {problem}")
            return
        method = obj.get("method")
        if getattr(self.protocol, "_shutdown", False) and method is not None and method != "exit":
            self.stats.count("after_shutdown", f"{method} after shutdown")
            if "id" in obj:
                self._reply(obj["id"], INVALID_REQUEST,
                            f"Invalid Request: {method} after shutdown (only exit is accepted now)")
            return
        try:
            message = self.protocol.structure_message(obj)
            if isinstance(message, dict):      # pygls leaves objects it does not recognise as dicts
                raise ValueError("not a JSON-RPC message pygls recognises")
            self.protocol.handle_message(message)
        except (SystemExit, KeyboardInterrupt):
            raise
        except Exception as exc:  # noqa: BLE001 - nothing a client sends may end the server
            why = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
            self.stats.count("handler_errors", why)
            log.warning("message %s not handled: %s", method or obj.get("id"), why)
            i = request_id(obj)
            if i is not None:
                self._reply(i, INTERNAL_ERROR, f"the server could not handle {method}: {why}")

    def _reply(self, msg_id, code: int, message: str) -> None:
        try:
            self.protocol._send_data({"jsonrpc": "2.0", "id": msg_id, "error": {"code": code, "message": message}})
        except Exception:  # noqa: BLE001 - a closed pipe is seen by the read side
            log.exception("could not send an error reply")


def encode_message(obj: Any) -> bytes:
    body = json.dumps(obj).encode()
    return b"Content-Length: %d\r\n\r\n" % len(body) + body


class Gate:
    """A TCP client before it is let in: anything local can connect to a port, so nothing it sends reaches
    the server until an `initialize` request carries the server's token in `initializationOptions.token`.
    Before that, requests are answered ServerNotInitialized (as LSP asks) and notifications, `exit` among
    them, are dropped; an `initialize` without the right token is answered UNAUTHORIZED and ends the
    connection (`done`, verdict "refused"). The token is taken out of the message, so that it is never
    logged nor taken for a setting. `token` None (`--no-auth`): any `initialize` is let in.

    Has the reading interface of a Connection (`reader`, `feed`, `stalled`, `close`, `done`) so that
    run_connection drives it; once `verdict` is "in", `initialize` and `rest` (what followed it in the same
    chunk) are for the Connection that takes over `reader`."""

    def __init__(self, token: str | None, send: Callable[[dict], None], *, hint: str = ""):
        self.reader = MessageReader(max_body=GATE_MAX_BODY)
        self._token = token
        self._send = send
        self._hint = hint
        self.verdict: str | None = None      # "in" | "refused"
        self.why = ""
        self.initialize: dict | None = None
        self.initialize_id: int | str | None = None
        self.rest: list[Event] = []

    @property
    def done(self) -> bool:
        return self.verdict is not None

    def feed(self, data: bytes) -> None:
        self._take(self.reader.feed(data))

    def stalled(self) -> None:
        self._take(self.reader.stalled())

    def close(self) -> None:
        self.reader.close()

    def refuse(self, code: int, message: str) -> None:
        """Answer the initialize that was let in with an error after all (the server is busy)."""
        self.error(self.initialize_id, code, message)
        self.verdict, self.why = "refused", message

    def error(self, msg_id, code: int, message: str) -> None:
        try:
            self._send({"jsonrpc": "2.0", "id": msg_id, "error": {"code": code, "message": message}})
        except Exception:  # noqa: BLE001 - a closed socket is seen by the read side
            log.exception("could not send an error reply")

    def _take(self, events: list[Event]) -> None:
        for i, ev in enumerate(events):
            obj = self._parse(ev)
            if obj is None or "method" not in obj:
                continue                      # responses: the server asked nothing yet
            msg_id = request_id(obj)
            if obj["method"] == "initialize" and msg_id is not None:
                self._initialize(obj, msg_id)
                self.rest = events[i + 1:]
                return
            if msg_id is not None:
                self.error(msg_id, SERVER_NOT_INITIALIZED,
                           f"{obj['method']} before initialize: this server takes nothing before an initialize "
                           "request" + (" with its token" if self._token is not None else ""))

    def _parse(self, ev: Event) -> dict | None:
        if isinstance(ev, FramingError):
            try:
                sample = json.loads(ev.sample) if ev.sample.strip() else None
            except (ValueError, RecursionError):
                sample = None
            if request_id(sample) is not None:
                self.error(request_id(sample), INVALID_REQUEST, f"the request was not framed correctly ({ev.reason})")
            return None
        try:
            obj = json.loads(ev.body)
        except (ValueError, RecursionError):
            self.error(None, PARSE_ERROR, "Parse error: the message is not JSON")
            return None
        problem = check_envelope(obj)
        if problem is not None:
            if isinstance(obj, dict) and "method" in obj:
                self.error(message_id(obj), INVALID_REQUEST, f"Invalid Request: {problem}")
            return None
        return obj

    def _initialize(self, obj: dict, msg_id: int | str) -> None:
        params = obj.get("params")
        options = params.get("initializationOptions") if isinstance(params, dict) else None
        given = options.pop("token", None) if isinstance(options, dict) else None
        self.initialize_id = msg_id
        if self._token is not None:
            ok = isinstance(given, str) and hmac.compare_digest(
                given.encode("utf-8", "surrogatepass"), self._token.encode())
            if not ok:
                what = "without a token" if given is None else "with a wrong token"
                self.error(msg_id, UNAUTHORIZED,
                           f"rest-lsp refused an initialize {what}: this server lets in a client that sends the "
                           f"contents of its token file as initializationOptions.token{self._hint}")
                self.verdict, self.why = "refused", f"initialize {what}"
                return
        self.verdict, self.initialize = "in", obj


# ---------------------------------------------------------------------------------------------------
class ChunkSource:
    """An async `read()` whose read in flight outlives a stall check (asyncio.wait leaves it running and,
    unlike wait_for before Python 3.12, never swallows a cancellation that comes with the data) and a change
    of consumer (a TCP client's Gate, then its Connection)."""

    def __init__(self, read: Callable[[], Awaitable[bytes]]):
        self._read = read
        self._pending: asyncio.Future | None = None

    async def next(self, stall_s: float | None = None) -> bytes | None:
        """The next chunk (b"" at the end of the stream), or None when `stall_s` passed without one."""
        if self._pending is None:
            self._pending = asyncio.ensure_future(self._read())
        if stall_s is not None:
            done, _ = await asyncio.wait({self._pending}, timeout=stall_s)
            if not done:
                return None
        fut, self._pending = self._pending, None
        return await fut

    def cancel(self) -> None:
        if self._pending is not None:
            self._pending.cancel()
            self._pending = None


async def run_connection(conn, read: "Callable[[], Awaitable[bytes]] | ChunkSource", *,
                         stall_s: float = STALL_S) -> str:
    """Feed `conn` (a Connection or a Gate) from `read()` (b"" at the end of the stream) until the stream
    ends or `conn.done`; returns why it ended. A SystemExit raised by pygls' `exit` handler propagates."""
    source = read if isinstance(read, ChunkSource) else ChunkSource(read)
    while not conn.done:
        try:
            data = await source.next(stall_s if conn.reader.pending else None)
        except (OSError, ValueError) as exc:
            conn.close()
            return f"reading the client's stream failed ({type(exc).__name__}: {exc})"
        if data is None:
            conn.stalled()
            continue
        if not data:
            conn.close()
            return "the client closed the connection"
        conn.feed(data)
        await asyncio.sleep(0)   # let the handlers just scheduled run between chunks
    return "done"


def stdin_chunks(stdin) -> Callable[[], Awaitable[bytes]]:
    """An async `read()` over a binary file, read on a daemon thread (a thread pool's thread blocked in
    read() would keep the interpreter from exiting while the client keeps the pipe open, which is how pygls'
    own reader behaves)."""
    import os

    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue(maxsize=4)
    try:
        fd = stdin.fileno()
        # os.read holds no lock: a thread blocked in BufferedReader.read1 aborts the interpreter's exit
        read1: Callable[[int], bytes] = lambda n: os.read(fd, n)  # noqa: E731
    except (AttributeError, OSError, ValueError):   # not a real file (tests pass BytesIO)
        read1 = getattr(stdin, "read1", None) or stdin.read

    def pump() -> None:
        while True:
            try:
                data = read1(CHUNK)
            except BaseException as exc:  # noqa: BLE001 - handed to the event loop
                asyncio.run_coroutine_threadsafe(queue.put(exc), loop)
                return
            fut = asyncio.run_coroutine_threadsafe(queue.put(data), loop)
            try:
                fut.result()
            except BaseException:  # noqa: BLE001 - the loop is gone
                return
            if not data:
                return

    threading.Thread(target=pump, name="rest-lsp-stdin", daemon=True).start()

    async def read() -> bytes:
        item = await queue.get()
        if isinstance(item, BaseException):
            raise item if isinstance(item, (OSError, ValueError)) else OSError(str(item))
        return item

    return read


class RateLimited:
    """Call `fn` at most once per `period_s`; the calls in between are counted in the next message."""

    def __init__(self, fn: Callable[[str], None], period_s: float = 60.0):
        self.fn, self.period_s = fn, period_s
        self._last = -period_s
        self._missed = 0

    def __call__(self, message: str) -> None:
        now = time.monotonic()
        if now - self._last < self.period_s:
            self._missed += 1
            return
        more = f" ({self._missed} more since the last report)" if self._missed else ""
        self._last, self._missed = now, 0
        self.fn(message + more)


# ---------------------------------------------------------------------------------------------------
def _exit_code(exc: SystemExit) -> int:
    return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)


def serve_stdio(server, *, stdin=None, stdout=None, max_body: int = MAX_BODY,
                warn: Callable[[str], None] | None = None, on_end: Callable[[str], None] | None = None) -> int:
    """Serve `server` (a pygls LanguageServer) over stdin/stdout with this module's reader; returns the exit
    code. `on_end(why)` runs when the stream ends without an `exit` notification (save what must survive)."""
    import sys

    from pygls.io_ import StdoutWriter

    server._stop_event = threading.Event()
    server.protocol.set_writer(StdoutWriter(stdout or sys.stdout.buffer))
    conn = Connection(server.protocol, max_body=max_body, warn=warn)
    server.transport_stats = conn.stats

    async def main() -> str:
        return await run_connection(conn, stdin_chunks(stdin or sys.stdin.buffer))

    try:
        why = asyncio.run(main())
    except SystemExit as exc:       # the `exit` notification (pygls raises it after our handler ran)
        return _exit_code(exc)
    except KeyboardInterrupt:
        why = "interrupted"
    return _ended(server, why, on_end)


@dataclass
class Session:
    """What serves one TCP client: a pygls LanguageServer made for it, `warn` as Connection takes it, and
    `on_end(why)`, run (on a thread) when the client is gone: save what must survive, stop its threads."""
    server: Any
    warn: Callable[[str], None] | None = None
    on_end: Callable[[str], None] | None = None


class _Discard:
    """The writer of a session whose client is gone: what its threads still report goes nowhere."""

    def write(self, data) -> None:
        pass

    def close(self) -> None:
        pass


def _peer(writer: asyncio.StreamWriter) -> str:
    name = writer.get_extra_info("peername")
    return f"{name[0]}:{name[1]}" if isinstance(name, tuple) and len(name) >= 2 else str(name)


async def _hang_up(writer: asyncio.StreamWriter, source: ChunkSource, linger_s: float = 5.0) -> None:
    """Close a connection after an answer. Closing a socket with unread input resets it, and the peer may
    then lose the answer: so end our side first and read what it still sends until it closes (or a while,
    or a megabyte)."""
    try:
        await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
        left = 1 << 20
        loop = asyncio.get_running_loop()
        deadline = loop.time() + linger_s
        while left > 0:
            data = await asyncio.wait_for(source.next(), max(0.0, deadline - loop.time()))
            if not data:
                break
            left -= len(data)
    except (OSError, ValueError, asyncio.TimeoutError):
        pass
    finally:
        source.cancel()
        writer.close()


def serve_tcp(new_session: Callable[[], Session], host: str, port: int, *, token: str | None,
              token_hint: str = "", exit_on_disconnect: bool = False, max_body: int = MAX_BODY,
              on_listen: Callable[[list], None] | None = None) -> int:
    """Serve LSP over TCP, one client at a time, each with a server of its own (`new_session()`); returns
    the exit code.

    A client is let in by its `initialize` (a Gate: with `token`, only one that presents it). While one is
    served, another that presents the token is answered BUSY and disconnected; the first is not disturbed.
    When the client disconnects (or sends `exit`) its session ends (`on_end`) and the next client is served,
    unless `exit_on_disconnect`: then the server ends with it (0 after `shutdown`, 1 otherwise, as over
    stdio). `on_listen(addresses)` runs once the port is bound, before any client is read."""
    import sys

    state: dict[str, Any] = {"client": None, "session": None}   # the peer served; its session, until ended
    idle: asyncio.Event | None = None            # set while no session is closing
    finished: asyncio.Future | None = None

    async def serve_client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = _peer(writer)
        source = ChunkSource(lambda: reader.read(CHUNK))
        gate = Gate(token, lambda obj: writer.write(encode_message(obj)), hint=token_hint)
        why = await run_connection(gate, source)
        if gate.verdict == "in" and state["client"] is not None:
            gate.refuse(BUSY, f"rest-lsp is serving another client ({state['client']}) and serves one at a time: "
                              "close that one first, or start another server on another port")
        if gate.verdict != "in":
            log.warning("client %s not let in: %s", peer, gate.why or why)
            await _hang_up(writer, source)
            return
        state["client"] = peer          # claimed before any await: a second client now finds the server busy
        session = None
        try:
            await idle.wait()           # the previous client's session may still be saving its state
            session = state["session"] = new_session()
            why = await _serve_session(session, gate, source, writer, max_body)
        except Exception as exc:  # noqa: BLE001 - the server goes on to the next client
            log.exception("serving client %s", peer)
            why = f"the server failed ({type(exc).__name__}: {exc})"
        finally:
            # released whatever happened, or every later client would be refused as busy
            state["client"] = None
            idle.clear()
            source.cancel()
            writer.close()
        shut = session is not None and bool(getattr(session.server.protocol, "_shutdown", False))
        try:
            if session is not None:
                session.server.protocol.set_writer(_Discard())   # its threads may still report
                await asyncio.get_running_loop().run_in_executor(None, _end_session, session, why)
                state["session"] = None     # ended (else the server's own end ends it)
        finally:
            idle.set()
        then = "exiting" if exit_on_disconnect else "waiting for the next client"
        print(f"rest-lsp: client {peer}: {why}{'' if shut else ' without shutdown'}; {then}", file=sys.stderr,
              flush=True)
        if exit_on_disconnect and not finished.done():
            finished.set_result(0 if shut else 1)

    async def main() -> int:
        nonlocal idle, finished
        loop = asyncio.get_running_loop()
        idle, finished = asyncio.Event(), loop.create_future()
        idle.set()
        try:
            import signal

            # SIGTERM ends a daemon as Ctrl-C does: the session in progress is saved, the token file removed
            loop.add_signal_handler(signal.SIGTERM, lambda: finished.done() or finished.set_result(0))
        except (ImportError, NotImplementedError, RuntimeError, ValueError):
            pass
        srv = await asyncio.start_server(serve_client, host, port)
        addresses = [s.getsockname() for s in srv.sockets]
        log.info("serving on %s", ", ".join(map(str, addresses)))
        if on_listen is not None:
            on_listen(addresses)
        try:
            return await finished
        finally:
            # not wait_closed(): from Python 3.12 it waits for the client being served to hang up
            srv.close()

    try:
        code = asyncio.run(main())
    except KeyboardInterrupt:
        code = 0
    session = state["session"]
    if session is not None:             # stopped while a client was served
        _end_session(session, "the server was stopped")
    return code


async def _serve_session(session: Session, gate: Gate, source: ChunkSource, writer: asyncio.StreamWriter,
                         max_body: int) -> str:
    """Hand a client let in by `gate` to its session's server and serve it until it is gone; returns why."""
    server = session.server
    server._stop_event = threading.Event()
    server.protocol.set_writer(writer)
    conn = Connection(server.protocol, max_body=max_body, warn=session.warn, reader=gate.reader)
    server.transport_stats = conn.stats
    log.info("client %s let in", _peer(writer))
    try:
        conn.dispatch([Message(json.dumps(gate.initialize).encode()), *gate.rest])
        why = await run_connection(conn, source)
    except SystemExit:                  # pygls exits this way only without a socket writer
        why = "exit"
    if writer.is_closing() and getattr(server.protocol, "_shutdown", False):
        why = "exit"                    # pygls' `exit` closed the socket
    return why


def _end_session(session: Session, why: str) -> None:
    if session.on_end is not None:
        try:
            session.on_end(why)
        except Exception:  # noqa: BLE001 - the next client is served anyway
            log.exception("closing a client's session")


def _ended(server, why: str, on_end: Callable[[str], None] | None) -> int:
    import sys

    shut = bool(getattr(server.protocol, "_shutdown", False))
    print(f"rest-lsp: {why}{'' if shut else ' without shutdown'}; exiting (an editor may start the server "
          "again)", file=sys.stderr, flush=True)
    if on_end is not None:
        try:
            on_end(why)
        except Exception:  # noqa: BLE001 - exiting anyway
            log.exception("closing after the end of the stream")
    return 0 if shut else 1


def is_loopback(host: str) -> bool:
    """Whether every address `host` names is a loopback one (a name is resolved: "localhost" may be ::1):
    what a server without a key may listen on (`rest-lsp --tcp --no-auth`, `rest-lsp team-server --no-auth`)."""
    import ipaddress
    import socket

    try:
        infos = socket.getaddrinfo(host, None)
    except (OSError, UnicodeError):
        return False
    return bool(infos) and all(ipaddress.ip_address(info[4][0].split("%")[0]).is_loopback for info in infos)
