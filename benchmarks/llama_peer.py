"""The peer in the typing benchmark: llama.cpp's `llama-server` driven the way llama.vim drives it.

    llama-server -m MODEL.gguf -t 2 -c 0 -ub 1024 -b 1024 --cache-reuse 256 -np 1   (llama.vim's preset, one slot)

`InfillEditor` is the open document as llama.vim (ggml-org/llama.vim, autoload/llama.vim) keeps it, with its
client logic, so that benchmarks/bench_typing.py's simulated person can type into it as into an LSP editor:
- every key (CursorMovedI) asks for a completion, unless one for that context is cached; while a request is in
  flight the next one waits (retried every 100 ms), and no request is ever cancelled;
- the request is `/infill` with the 256 lines above as `input_prefix`, the cursor line's text before the
  cursor as `prompt`, the rest of the line and 64 lines below as `input_suffix` (a whitespace-only line counts
  as empty), `n_predict` 128, `n_indent`, top-k 40 / top-p 0.90 / infill samplers, `cache_prompt`, and
  `t_max_predict_ms` 250 (1,000 for a speculative request);
- responses go into a cache (250 keys) under the context's key and three keys with the prefix's first lines
  dropped; a hint is shown from the cache at the cursor, or from a cached completion typed through up to 128
  characters back (the typed characters must equal its start);
- once a hint is shown, a speculative request computes the completion as if the hint were accepted.
Left out: the ring buffer of extra-context chunks (filled from yanks, buffer switches and saves, and sent
only while the user is idle for 3 s: it stays empty in this replay's continuous typing), and the hint's
rendering checks against the lines below (only the check against the rest of the line is kept).

The hint at the cursor is what `request()` answers: at once when one is shown, else when a response brings
one for the same text and cursor (the person's next key makes it moot). `cancel()` does nothing (llama.vim
never cancels).
"""
from __future__ import annotations

import asyncio
import http.client
import json
import time
from pathlib import Path
from types import SimpleNamespace

from lsp_client import proc_cpu_seconds

N_PREFIX, N_SUFFIX, N_PREDICT = 256, 64, 128
T_MAX_PROMPT_MS, T_MAX_PREDICT_MS, T_FIRST_PREDICT_MS = 500, 1000, 250
MAX_LINE_SUFFIX = 8  # no automatic request with more than this many characters right of the cursor
MAX_CACHE_KEYS = 250
LOOKBACK = 128
RETRY_S = 0.100
# llama.vim's FIM presets (`--fim-qwen-*-default`), and one slot: with the default four, each of the first four
# requests lands on an empty slot and computes the whole prompt (about 12 s for 1,000 tokens on a 2-core AVX2 CPU)
SERVER_ARGS = ["-c", "0", "-ub", "1024", "-b", "1024", "--cache-reuse", "256", "-np", "1"]


class LlamaServer:
    """`llama-server` in a process of its own; its output goes to `log_dir`. Counts what its clients asked."""

    def __init__(self, binary: Path, model: Path, log_dir: Path, port: int = 8712, threads: int = 2,
                 extra_args: tuple[str, ...] = ()):
        self.binary, self.model, self.log_dir, self.port, self.threads = binary, model, log_dir, port, threads
        self.extra_args = extra_args  # e.g. lookup decoding: --spec-type ngram-cache -lcs FILE
        self.proc: asyncio.subprocess.Process | None = None
        self.totals = {"requests": 0, "speculative": 0, "hints_from_cache": 0, "hints_typed_through": 0,
                       "prompt_n": 0, "prompt_ms": 0.0, "predicted_n": 0, "predicted_ms": 0.0}

    async def start(self) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.log_dir / "llama-server.log", "wb")
        self.proc = await asyncio.create_subprocess_exec(
            str(self.binary), "-m", str(self.model), "--host", "127.0.0.1", "--port", str(self.port),
            "-t", str(self.threads), *SERVER_ARGS, *self.extra_args, stdout=log, stderr=log)
        log.close()

    async def wait_ready(self, timeout: float = 600) -> None:
        t_end = time.perf_counter() + timeout
        while time.perf_counter() < t_end:
            if self.proc.returncode is not None:
                raise RuntimeError(f"llama-server exited ({self.proc.returncode}): see {self.log_dir}")
            try:
                status, _ = await asyncio.to_thread(self._get, "/health")
                if status == 200:
                    return
            except OSError:
                pass
            await asyncio.sleep(0.5)
        raise TimeoutError("llama-server did not become ready")

    def _get(self, path: str) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
        try:
            conn.request("GET", path)
            r = conn.getresponse()
            return r.status, r.read()
        finally:
            conn.close()

    def post(self, path: str, body: dict) -> dict:
        """A blocking POST (run in a thread); the JSON answer."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        try:
            conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
            r = conn.getresponse()
            data = r.read()
            if r.status != 200:
                raise RuntimeError(f"llama-server {path}: HTTP {r.status}: {data[:200]!r}")
            return json.loads(data)
        finally:
            conn.close()

    def cpu_seconds(self) -> float:
        return proc_cpu_seconds(self.proc.pid)

    async def stats(self, last: int = 0) -> dict:
        return {"totals": dict(self.totals), "model": {"name": self.model.name, "verifier": "llama.cpp"}}

    async def close(self) -> None:
        if self.proc and self.proc.returncode is None:
            self.proc.terminate()
            try:
                await asyncio.wait_for(self.proc.wait(), 15)
            except asyncio.TimeoutError:
                self.proc.kill()
                await self.proc.wait()


class InfillEditor:
    """The open document as llama.vim keeps it (module docstring): the same surface as bench_typing's Editor."""

    def __init__(self, server: LlamaServer, path: Path, text: str, n_prefix: int = N_PREFIX, n_suffix: int = N_SUFFIX):
        self.server, self.uri = server, path.as_uri()
        self.n_prefix, self.n_suffix = n_prefix, n_suffix  # lines above and below the cursor sent
        self.lines = text.split("\n")
        self.version = 1
        self.pos = (0, 0)
        self.cache: dict[str, str] = {}  # context key -> completion (oldest evicted first)
        self.job: asyncio.Future | None = None
        self.retry: asyncio.TimerHandle | None = None
        self.hint: tuple[tuple[int, int, int], str] | None = None  # ((version, line, col), text) shown
        self.waiters: list[tuple[tuple[int, int, int], asyncio.Future]] = []
        self.indent_last = -1

    # ---- the editor's side (what bench_typing's person does) ----------------------------------------------
    def insert(self, line: int, col: int, text: str) -> tuple[int, int]:
        self.version += 1
        cur = self.lines[line]
        new = (cur[:col] + text + cur[col:]).split("\n")
        self.lines[line:line + 1] = new
        self._moved((line + len(new) - 1, len(new[-1]) - len(cur[col:])))
        return self.pos

    def cursor(self, line: int, col: int) -> None:
        if (line, col) != self.pos:
            self._moved((line, col))

    def request(self, line: int, col: int, msg_id: str) -> asyncio.Future:
        """The hint shown at (line, col) in the current text: now, or when a response brings one."""
        fut = asyncio.get_running_loop().create_future()
        place = (self.version, line, col)
        if self.hint and self.hint[0] == place:
            fut.set_result(_items(self.hint[1]))
        else:
            self.waiters.append((place, fut))
        return fut

    def cancel(self, msg_id: str) -> None:
        """llama.vim never cancels a request (the hint is hidden at the next key)."""

    def notice(self, version, line, col) -> asyncio.Event:
        return asyncio.Event()  # llama.cpp has no rest/suggestionReady

    # ---- llama.vim's logic -------------------------------------------------------------------------------
    def _moved(self, pos: tuple[int, int]) -> None:
        """CursorMovedI: hide the hint, show one from the cache if there is one, and ask for this context."""
        self.pos = pos
        self.hint = None
        self.waiters = [(p, f) for p, f in self.waiters if not f.done() and p[0] == self.version]
        self._try_hint()
        self._fim(None, True, [], True)

    def _context(self, pos: tuple[int, int], prev: list[str]) -> dict:
        """llama.vim's local context at pos (0-based line, column), or as if `prev` (lines) were inserted there."""
        y, x = pos
        lines = self.lines
        if not prev:
            cur = lines[y]
            cur_prefix, cur_suffix = cur[:x], cur[x:]
            above = lines[max(0, y - self.n_prefix):y]
            if not cur.strip():
                indent, cur_prefix, cur_suffix = 0, "", ""
            else:
                indent = len(cur) - len(cur.lstrip())
        else:
            cur = lines[y] + prev[0] if len(prev) == 1 else prev[-1]
            cur_prefix, cur_suffix = cur, ""
            above = lines[max(0, y - self.n_prefix + len(prev) - 1):y]
            if len(prev) > 1:
                above = above + [lines[y] + prev[0]] + prev[1:-1]
            indent = self.indent_last
        below = lines[y + 1:min(len(lines), y + 1 + self.n_suffix)]
        return {"prefix": "\n".join(above) + "\n", "middle": cur_prefix,
                "suffix": cur_suffix + "\n" + "\n".join(below) + "\n", "indent": indent, "line_suffix": cur_suffix}

    def _fim(self, pos: tuple[int, int] | None, is_auto: bool, prev: list[str], use_cache: bool) -> None:
        if self.job is not None:  # one request at a time: try again in 100 ms
            if self.retry is not None:
                self.retry.cancel()
            self.retry = asyncio.get_running_loop().call_later(RETRY_S, self._fim, pos, True, prev, use_cache)
            return
        pos = pos or self.pos
        ctx = self._context(pos, prev)
        if is_auto and len(ctx["line_suffix"]) > MAX_LINE_SUFFIX:
            return
        keys = [ctx["prefix"] + ctx["middle"] + "\u00ce" + ctx["suffix"]]
        trimmed = ctx["prefix"]
        for _ in range(3):  # the same completion serves after scrolling a few lines down
            trimmed = trimmed.split("\n", 1)[1] if "\n" in trimmed else ""
            if not trimmed:
                break
            keys.append(trimmed + ctx["middle"] + "\u00ce" + ctx["suffix"])
        if use_cache and any(k in self.cache for k in keys):
            return
        self.indent_last = ctx["indent"]
        body = {"input_prefix": ctx["prefix"], "input_suffix": ctx["suffix"], "input_extra": [],
                "prompt": ctx["middle"], "n_predict": N_PREDICT, "stop": [], "n_indent": ctx["indent"],
                "top_k": 40, "top_p": 0.90, "stream": False, "samplers": ["top_k", "top_p", "infill"],
                "cache_prompt": True, "t_max_prompt_ms": T_MAX_PROMPT_MS,
                "t_max_predict_ms": T_MAX_PREDICT_MS if prev else T_FIRST_PREDICT_MS,
                "response_fields": ["content", "timings/prompt_n", "timings/prompt_ms", "timings/predicted_n",
                                    "timings/predicted_ms"]}
        self.server.totals["requests"] += 1
        self.server.totals["speculative"] += bool(prev)
        self.job = asyncio.ensure_future(asyncio.to_thread(self.server.post, "/infill", body))
        self.job.add_done_callback(lambda f, keys=keys: self._on_response(f, keys))

    def _on_response(self, fut: asyncio.Future, keys: list[str]) -> None:
        self.job = None
        if fut.cancelled() or fut.exception() is not None:
            return
        r = fut.result()
        t = self.server.totals
        t["prompt_n"] += r.get("timings/prompt_n", 0)
        t["prompt_ms"] += r.get("timings/prompt_ms", 0.0)
        t["predicted_n"] += r.get("timings/predicted_n", 0)
        t["predicted_ms"] += r.get("timings/predicted_ms", 0.0)
        content = r.get("content", "")
        if not content:
            return
        for k in keys:
            if len(self.cache) >= MAX_CACHE_KEYS:
                del self.cache[next(iter(self.cache))]
            self.cache[k] = content
        if self.hint is None:
            self._try_hint()

    def _try_hint(self) -> None:
        """Show a hint at the cursor from the cache (the exact context, or typed through), then ask ahead."""
        ctx = self._context(self.pos, [])
        pm, suffix = ctx["prefix"] + ctx["middle"], ctx["suffix"]
        content = self.cache.get(pm + "\u00ce" + suffix)
        how = "hints_from_cache"
        if content is None:
            best = None
            for i in range(min(LOOKBACK, len(pm))):
                cached = self.cache.get(pm[:len(pm) - 1 - i] + "\u00ce" + suffix)
                removed = pm[len(pm) - 1 - i:]
                if cached and cached.startswith(removed) and len(cached) > i + 1:
                    if best is None or len(cached) - i - 1 > len(best):
                        best = cached[i + 1:]
            content, how = best, "hints_typed_through"
        if content is None:
            return
        text = self._rendered(content)
        if text is None:
            return
        self.server.totals[how] += 1
        place = (self.version, *self.pos)
        self.hint = (place, text)
        for p, f in self.waiters:
            if p == place and not f.done():
                f.set_result(_items(text))
        self._fim(self.pos, True, text.split("\n"), True)  # speculative: as if the hint were accepted

    def _rendered(self, content: str) -> str | None:
        """The hint llama.vim would show for `content` at the cursor, or None (nothing worth showing)."""
        lines = content.split("\n")
        while lines and lines[-1] == "":
            lines.pop()
        if not lines:
            return None
        y, x = self.pos
        cur = self.lines[y]
        if not cur.strip():  # the line is only indentation: the completion's own indentation goes under it
            lead = min(len(lines[0]) - len(lines[0].lstrip()), len(cur))
            lines[0] = lines[0][lead:]
        if len(lines) == 1 and lines[0] == cur[x:]:
            return None  # it repeats the rest of the line
        text = "\n".join(lines)
        return text if text.strip() else None


def _items(text: str) -> SimpleNamespace:
    return SimpleNamespace(items=[SimpleNamespace(insert_text=text)])
