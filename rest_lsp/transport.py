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
    should see (rate-limited by the caller)."""

    def __init__(self, protocol, *, max_body: int = MAX_BODY, warn: Callable[[str], None] | None = None):
        self.protocol = protocol
        self.reader = MessageReader(max_body=max_body)
        self.stats = TransportStats()
        self._warn = warn or (lambda message: None)

    def feed(self, data: bytes) -> None:
        self._dispatch(self.reader.feed(data))

    def stalled(self) -> None:
        self._dispatch(self.reader.stalled())

    def close(self) -> None:
        self._dispatch(self.reader.close())

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


# ---------------------------------------------------------------------------------------------------
async def run_connection(conn: Connection, read: Callable[[], Awaitable[bytes]], *,
                         stall_s: float = STALL_S) -> str:
    """Feed `conn` from `read()` (b"" at the end of the stream) until the stream ends; returns why it ended.
    A SystemExit raised by pygls' `exit` handler propagates."""
    pending: asyncio.Future | None = None
    while True:
        if pending is None:
            pending = asyncio.ensure_future(read())
        if conn.reader.pending:
            # asyncio.wait leaves the read running when the wait times out (wait_for needed a shield) and,
            # unlike wait_for before Python 3.12, never swallows a cancellation that comes with the data
            done, _ = await asyncio.wait({pending}, timeout=stall_s)
            if not done:
                conn.stalled()
                continue
        try:
            data = await pending
        except (OSError, ValueError) as exc:
            conn.close()
            return f"reading the client's stream failed ({type(exc).__name__}: {exc})"
        pending = None
        if not data:
            conn.close()
            return "the client closed the connection"
        conn.feed(data)
        await asyncio.sleep(0)   # let the handlers just scheduled run between chunks


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


def serve_tcp(server, host: str, port: int, *, max_body: int = MAX_BODY,
              warn: Callable[[str], None] | None = None, on_end: Callable[[str], None] | None = None) -> int:
    """Serve one client over TCP with this module's reader; returns the exit code."""
    server._stop_event = threading.Event()
    done: asyncio.Future | None = None

    async def client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        server.protocol.set_writer(writer)
        conn = Connection(server.protocol, max_body=max_body, warn=warn)
        server.transport_stats = conn.stats
        try:
            why = await run_connection(conn, lambda: reader.read(CHUNK))
        except SystemExit as exc:
            why = exc
        if not done.done():
            done.set_result(why)

    async def main():
        nonlocal done
        done = asyncio.get_running_loop().create_future()
        srv = await asyncio.start_server(client, host, port)
        log.info("serving on %s", ", ".join(str(s.getsockname()) for s in srv.sockets))
        async with srv:
            return await done

    try:
        why = asyncio.run(main())
    except KeyboardInterrupt:
        why = "interrupted"
    if isinstance(why, SystemExit):
        return _exit_code(why)
    return _ended(server, why, on_end)


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
