"""A person typing, over the real protocol: suggestions on screen, their latency, and the characters they save.

    .venv/bin/python benchmarks/bench_typing.py [--project boltons==26.2.0] [--limit 12 | --whole-file PATH ...]
        [--methods rest,plain[,patient][,rest-noask][,llama.cpp [--llama-server PATH] [--llama-model GGUF]]]
        [--rhythm human|fast|old] [--no-cancel] [--no-cursor] [--client project|plain] [--set KEY=VALUE ...]
        [--json OUT]

An editor-like client (benchmarks/lsp_client.py) drives `rest-lsp --stdio` in a separate process. The code is a
real project from PyPI that no corpus holds (benchmarks/realcode.py): function bodies of some of its files are
removed, the project is the workspace (indexed by the daemon), and the file with the bodies removed is open
(`--whole-file PATH`: the file is typed whole from an empty one, a new module among its siblings). The client
types each body character by character with a seeded rhythm (benchmarks/typist.py, its sources and assumptions):
by default (`--rhythm human`) an average typist, intervals drawn from a lognormal of mean 240 ms, longer after a
word, a bracket and at a line's end, who reads a suggestion before taking it and presses Tab (or accept-word per
word) to take it; `--rhythm fast` the same at 120 ms per key; `--rhythm old` the rhythm of the tables before
2026-12-02 (60-140 ms per key, 300-700 ms after a newline and after one space or bracket in four, taking a
suggestion free). After a newline the editor indents the new line (auto-indent), so indentation is not typed. It
asks for an inline completion once 150 ms pass without a key (Automatic trigger) and, VS Code style, cancels the
request in flight at the next key (`--no-cancel`: Neovim style). Like this project's editor clients it also says
where the cursor rests after 250 ms (`rest/cursor`; `--no-cursor` to leave it out), and it asks again when the
server says that a request it answered empty for want of time has its suggestion (`rest/suggestionReady`; method
`rest-noask`: REST with a client that does not). A suggestion that arrives while what was typed since the request
is still its prefix is shown; the simulated person then accepts the part equal to what they were about to type,
cut at a word boundary (the whole suggestion when it all matches), instead of typing their next key (human, fast:
when it spares more keys than the accept keys it costs, after reading it), and types on after it.

Every method has its own server, started one after another; then each body is typed by every method in turn
(the order reversed from one body to the next), each server left to finish what it still computes before the
next one's person types, so that the methods meet the machine in the same state (on a 2-core CPU the speed of
one run can differ from the next by a fifth).

Reported per method (REST, and plain decoding: `draftBudget: 0`, in the same run, one server each, the same
rhythm): pauses (requests), pauses with a suggestion shown before the next key, latency of shown suggestions
p50/p95, characters typed vs accepted (and body by body, REST against plain), server CPU seconds per typed
character, accept keys and keys saved, model runs (started by keys, by requests, ahead), and the daemon's own
figures. `--methods rest,plain,patient` adds a person who waits at each pause for the whole suggestion (the
first line, or the block; `predictBudgetMs: 0`). It is not a bound on what a faster method can accept (it was
named `ceiling` until REST out-accepted it): `timeBudgetMs` and `promptBudgetMs` still cut its answers, the
prompt at a pause depends on the editing history, the runs drift apart after their first different accept,
and the word-boundary rule lets a shorter suggestion take more than a longer one that goes wrong inside a
word. `llama.cpp` is the peer people use today: llama.cpp's llama-server
(`benchmarks/llama_server.sh` builds it) with the embedded model's own GGUF, driven as llama.vim drives it
(benchmarks/llama_peer.py: a request per key, its cache, typed-through hints and speculative requests), typed
by the same person in the same rhythm. A method name may carry a precision, `rest@int8w,rest@fp32`: the same
method on a server started with that `precision`, so two precisions meet the same bodies side by side (the
body-by-body lines then compare the first method with each other one). A method name may also carry its client,
`rest,rest:plain`: `:plain` types through a plain LSP client (whole-text didChange on every key, no rest/cursor,
no suggestionReady capability, so no asking again, and no pause at a body's start for the cursor to be warmed),
as simple editor plugins do, beside this project's clients (`:project`, the default; `--client plain` makes plain
the default). And it may carry a source tree, `rest,rest~before --tree before=DIR`: the method served by the code
checked out at DIR (`git worktree add DIR COMMIT`), so that a change is measured against the code before it in
one run. Settings of its own follow in brackets, `rest,rest[predictBudgetMs=30]` (`;` between two): a setting
against the default in one run.
"""
from __future__ import annotations

import argparse
import asyncio
import functools
import itertools
import json
import random
import re
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from lsprotocol import types

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's packages, not an editable install's
sys.path.insert(0, str(Path(__file__).resolve().parent))

from llama_peer import N_PREFIX, N_SUFFIX, InfillEditor, LlamaServer  # noqa: E402
from lsp_client import Server  # noqa: E402
from realcode import DEFAULT_PROJECT, fetch_project, function_bodies, python_files  # noqa: E402
from report import pct, write_json  # noqa: E402
from typist import DEFAULT, RHYTHMS, Typist, accept_keys, accept_s, interval, worth_taking  # noqa: E402

from restbase.assets import gguf_path  # noqa: E402
from restbase.storage import cache_root  # noqa: E402

DEBOUNCE_S = 0.150
CURSOR_REST_S = 0.250
PATIENCE_S = 10.0
START_S = 1.0
# A person who waits at every pause for the whole suggestion (the first line, or the block). Not a bound on
# what any method can accept (it was called `ceiling` until REST out-accepted it, 508 vs 505): timeBudgetMs and
# promptBudgetMs still cut its answers, the prompt at a pause depends on the editing history, runs drift apart
# after the first different accept, and the word-boundary rule lets a shorter suggestion take more than a longer
# one that goes wrong inside a word.
PATIENT = {"draftBudget": None, "predictBudgetMs": 0}
PEER = "llama.cpp"  # llama-server driven as llama.vim drives it (benchmarks/llama_peer.py)
WORD = re.compile(r"\w")
_ids = itertools.count()


@dataclass
class Body:
    """A function body to type: its text after the first line's indentation, and which characters a person
    types (not the indentation the editor adds after a newline)."""

    path: Path
    line: int  # 0-based line where the body starts
    indent: int
    text: str
    typed_mask: list[bool] = field(default_factory=list)

    def __post_init__(self):
        mask, at_line_start = [], False
        for ch in self.text:
            if at_line_start and ch in " \t":
                mask.append(False)
                continue
            at_line_start = ch == "\n"
            mask.append(True)
        self.typed_mask = mask


def prepare(root: Path, n_files: int, limit: int, seed: int, work: Path) -> tuple[Path, list[tuple[Path, str, list[Body]]]]:
    """The workspace (a copy of the project with the chosen bodies removed from their files) and, per typed
    file, its text as open in the editor and the bodies to type, in file order."""
    rng = random.Random(seed)
    files = [p for p in python_files(root) if len(function_bodies(p.read_text(encoding="utf-8"), 3, 10)) >= 3]
    rng.shuffle(files)
    chosen = sorted(files[:n_files])
    per_file = max(1, -(-limit // max(1, len(chosen))))
    ws = work / root.name
    shutil.copytree(root, ws)
    out = []
    for path in chosen:
        text = path.read_text(encoding="utf-8")
        bodies = function_bodies(text, 3, 10)
        pick = []
        for b in sorted(rng.sample(bodies, min(per_file, len(bodies)))):
            if not pick or b[0] > pick[-1][1]:  # a nested function's body lies inside its outer one's
                pick.append(b)
        lines = text.split("\n")
        todo = []
        for first, last, indent in reversed(pick):  # bottom-up, so earlier line numbers stay valid
            body_text = "\n".join(lines[first:last + 1])[indent:]
            lines[first:last + 1] = [" " * indent]
            todo.append((first, indent, body_text))
        opened = "\n".join(lines)
        target = ws / path.relative_to(root)
        target.write_text(opened, encoding="utf-8")
        # top-down: once the bodies above are typed, the text above a body is the original file's again, so
        # its line is its line in the original (the removed bodies collapsed to one line each until then)
        bodies_out = [Body(target, first, indent, body_text) for first, indent, body_text in reversed(todo)]
        out.append((target, opened, bodies_out))
    return ws, out


def prepare_whole(root: Path, rel_paths: list[str], work: Path) -> tuple[Path, list[tuple[Path, str, list[Body]]]]:
    """The workspace (a copy of the project in which each chosen file is there but empty: a module the person
    has just created) and, per file, its whole text to type from the top as one body."""
    ws = work / root.name
    shutil.copytree(root, ws)
    out = []
    for rel in rel_paths:
        src = root / rel
        if not src.is_file():
            raise SystemExit(f"--whole-file {rel}: no such file in {root}")
        target = ws / rel
        target.write_text("", encoding="utf-8")
        out.append((target, "", [Body(target, 0, 0, src.read_text(encoding="utf-8"))]))
    return ws, out


def acceptable(suggestion: str, coming: str) -> str:
    """The part of the suggestion a person takes: what they were about to type, cut at a word boundary
    (all of it when it all matches)."""
    n = 0
    while n < min(len(suggestion), len(coming)) and suggestion[n] == coming[n]:
        n += 1
    if n == len(suggestion):
        return suggestion
    while n > 0 and WORD.match(coming[n - 1]) and n < len(coming) and WORD.match(coming[n]):
        n -= 1  # inside a word: back to its start
    return suggestion[:n]


class Editor:
    """The open document as the client knows it, with its edits sent as incremental changes (this project's
    clients: they also say where the cursor rests and ask again at rest/suggestionReady)."""

    rest_notifications = True   # rest/cursor where the cursor rests, and a pause before each body for it
    asks_again = True           # an empty answer is asked again at the server's rest/suggestionReady

    def __init__(self, server: Server, path: Path, text: str):
        self.server, self.uri = server, path.as_uri()
        self.lines = text.split("\n")
        self.version = 1
        self.notices: dict[tuple[int, int, int], asyncio.Event] = {}   # (version, line, column) -> noticed
        server.on_ready = self.on_ready
        server.client.text_document_did_open(types.DidOpenTextDocumentParams(
            types.TextDocumentItem(uri=self.uri, language_id="python", version=1, text=text)))

    def insert(self, line: int, col: int, text: str) -> tuple[int, int]:
        """Insert at (line, col) (code points; the code here is ASCII, so UTF-16 units too); returns the cursor."""
        self.version += 1
        cur = self.lines[line]
        new = (cur[:col] + text + cur[col:]).split("\n")
        self.lines[line:line + 1] = new
        self.server.client.text_document_did_change(types.DidChangeTextDocumentParams(
            types.VersionedTextDocumentIdentifier(uri=self.uri, version=self.version), [self.change(line, col, text)]))
        return line + len(new) - 1, len(new[-1]) - len(cur[col:])

    def change(self, line: int, col: int, text: str) -> types.TextDocumentContentChangeEvent:
        """The didChange event of inserting `text` at (line, col) (self.lines already hold the result)."""
        return types.TextDocumentContentChangePartial(range=types.Range(types.Position(line, col),
                                                                        types.Position(line, col)), text=text)

    def on_ready(self, params: dict) -> None:
        """rest/suggestionReady: the suggestion for an empty answer at (version, line, column) is decided."""
        doc, pos = params.get("textDocument") or {}, params.get("position") or {}
        if doc.get("uri") == self.uri:
            self.notice(doc.get("version"), pos.get("line"), pos.get("character")).set()

    def notice(self, version, line, col) -> asyncio.Event:
        return self.notices.setdefault((version, line, col), asyncio.Event())

    def cursor(self, line: int, col: int) -> None:
        self.server.client.protocol.notify("rest/cursor", {"textDocument": {"uri": self.uri},
                                                           "position": {"line": line, "character": col}})

    def request(self, line: int, col: int, msg_id: str):
        params = types.InlineCompletionParams(
            context=types.InlineCompletionContext(trigger_kind=types.InlineCompletionTriggerKind.Automatic),
            text_document=types.TextDocumentIdentifier(uri=self.uri), position=types.Position(line, col))
        fut = self.server.client.protocol.send_request_async(types.TEXT_DOCUMENT_INLINE_COMPLETION, params,
                                                              msg_id=msg_id)
        fut.add_done_callback(lambda f: f.cancelled() or f.exception())  # a cancelled reply is read, not logged
        return fut

    def cancel(self, msg_id: str) -> None:
        self.server.client.protocol.notify(types.CANCEL_REQUEST, types.CancelParams(id=msg_id))


class PlainEditor(Editor):
    """A plain LSP client, as simple editor plugins are: every edit sends the whole text, and nothing of this
    project's own (no rest/cursor, no suggestionReady capability, no pause for the cursor before a body)."""

    rest_notifications = False
    asks_again = False

    def change(self, line: int, col: int, text: str) -> types.TextDocumentContentChangeEvent:
        return types.TextDocumentContentChangeWholeDocument(text="\n".join(self.lines))

    def cursor(self, line: int, col: int) -> None:
        pass   # a plain client has no such notification


CLIENTS = {"project": Editor, "plain": PlainEditor}


async def type_body(ed: Editor, body: Body, rng: random.Random, cancel: bool, cursor_msgs: bool, tally: dict,
                    trace: list | None = None, patient: bool = False, person: Typist = RHYTHMS[DEFAULT]) -> None:
    line, col = body.line, body.indent
    ours = getattr(ed, "rest_notifications", True)   # llama_peer's InfillEditor: the pause, and its own hints
    asks_again = getattr(ed, "asks_again", True)
    if ours:  # the person moved here, the client says so, and the person starts typing
        ed.cursor(line, col)
        await asyncio.sleep(START_S)
    cursor_msgs = cursor_msgs and ours
    i, text = 0, body.text
    take, take_keys = "", 0  # a suggestion part the person accepts as their next action, and its accept keys
    while i < len(text):
        if take:  # Tab (or word-accepts) instead of the next key
            line, col = ed.insert(line, col, take)
            tally["accepted"] += sum(body.typed_mask[i:i + len(take)])
            tally["accepts"] += 1
            tally["accept_keys"] += take_keys
            i += len(take)
            prev = take[-1]
        else:  # one key: the character, or after a newline the editor's indentation of the next line too
            ins = text[i]
            if ins == "\n":
                j = i + 1
                while j < len(text) and text[j] in " \t":
                    j += 1
                ins = text[i:j]
            line, col = ed.insert(line, col, ins)
            tally["typed"] += 1
            i += len(ins)
            prev = ins[0]
        take, take_keys = "", 0
        if i >= len(text):
            break
        gap = interval(person, prev, rng)
        t_key = time.perf_counter()
        version = ed.version
        shown: dict = {}
        appeared = asyncio.Event()
        sent: list = []

        async def suggestion(at_line, at_col, sent) -> str | None:
            """The first item's text (None: no item)."""
            msg_id = f"c{next(_ids)}"
            sent.append((msg_id, asyncio.ensure_future(ed.request(at_line, at_col, msg_id))))
            result = await asyncio.shield(sent[-1][1])  # the client decides whether to cancel it (below)
            items = getattr(result, "items", None) or []
            return items[0].insert_text if items else None

        async def ask(at_line=line, at_col=col, version=version, shown=shown, sent=sent, at=i):
            await asyncio.sleep(DEBOUNCE_S)
            tally["pauses"] += 1
            t0 = time.perf_counter()
            try:
                answer = await suggestion(at_line, at_col, sent)
                if not answer and ed.version == version:
                    tally["empty"] += 1
                if not answer and ed.version == version and asks_again:
                    # answered empty (for want of time, or nothing to say): like this project's editor clients,
                    # ask again at the server's rest/suggestionReady (the next key cancels this task)
                    await ed.notice(version, at_line, at_col).wait()
                    tally["asked_again"] += 1
                    answer = await suggestion(at_line, at_col, sent)
            except (Exception, asyncio.CancelledError):  # noqa: BLE001 - cancelled by the next key
                if trace is not None:  # a pause not shown: how long it had (the pause less the debounce)
                    trace.append({"at": ed.lines[at_line][:at_col][-40:], "coming": text[at:at + 40],
                                  "answer": None, "ms": round((time.perf_counter() - t0) * 1000),
                                  "late": True, "cancelled": True})
                return
            ms = (time.perf_counter() - t0) * 1000
            if ed.version != version:
                tally["late"] += 1
            elif answer:
                shown.update(text=answer, latency=ms, at=time.perf_counter())
                appeared.set()
            if trace is not None:
                trace.append({"at": ed.lines[at_line][:at_col][-40:], "coming": text[at:at + 40],
                              "answer": answer, "ms": round(ms),
                              "late": ed.version != version})

        async def rest_cursor(at_line=line, at_col=col):
            await asyncio.sleep(CURSOR_REST_S)
            ed.cursor(at_line, at_col)

        tasks = [asyncio.ensure_future(ask())] if gap > DEBOUNCE_S else []
        if cursor_msgs and gap > CURSOR_REST_S:
            tasks.append(asyncio.ensure_future(rest_cursor()))
        remaining = max(0.0, gap - (time.perf_counter() - t_key))
        if person.legacy or not tasks:  # the old person looked only when their next key was due
            await asyncio.sleep(remaining)
        else:  # a suggestion appearing before the next key stops the person, who reads it
            try:
                await asyncio.wait_for(appeared.wait(), remaining)
            except asyncio.TimeoutError:
                pass
        if patient and tasks and not shown:  # the pause lasts until the answer is there
            await asyncio.wait(tasks[:1], timeout=PATIENCE_S)
        if shown:
            tally["shown"] += 1
            tally["shown_latency"].append(shown["latency"])
            part = acceptable(shown["text"], text[i:])
            keys = accept_keys(part, shown["text"])
            if worth_taking(person, part, sum(body.typed_mask[i:i + len(part)]), keys):
                take, take_keys = part, keys
                # reading the part and pressing its accept keys, counted from when it appeared
                await asyncio.sleep(max(0.0, shown["at"] + accept_s(person, part, shown["text"], rng)
                                        - time.perf_counter()))
            else:  # not worth a key: the person types on when their key was due
                await asyncio.sleep(max(0.0, gap - (time.perf_counter() - t_key)))
        for t in tasks:
            if not t.done():
                t.cancel()
        if cancel and sent and not sent[-1][1].done():
            ed.cancel(sent[-1][0])  # $/cancelRequest: the reply (RequestCancelled) is ignored
        await asyncio.sleep(0)
    tally["typeable"] += sum(body.typed_mask)


def new_tally() -> dict:
    return {"typed": 0, "accepted": 0, "accepts": 0, "accept_keys": 0, "typeable": 0, "pauses": 0, "shown": 0,
            "shown_latency": [], "late": 0, "empty": 0, "asked_again": 0}


@dataclass
class MethodRun:
    """One method's server and what its simulated person did so far."""

    name: str
    options: dict
    server: Server | LlamaServer
    editor_type: Callable[..., Editor | InfillEditor]  # the document as this method's client keeps it
    rng: random.Random
    patient: bool
    ready_s: float
    cpu0: float
    person: Typist = RHYTHMS[DEFAULT]
    tally: dict = field(default_factory=lambda: new_tally())
    trace: list | None = None
    editor: Editor | InfillEditor | None = None
    typing_s: float = 0.0
    per_body: list = field(default_factory=list)


async def start_method(name: str, options: dict, ws: Path, args, log_dir: Path, patient: bool = False,
                       asks_again: bool = True, client: str = "project", tree: Path | None = None) -> MethodRun:
    """tree: serve with the code checked out there instead of this checkout (lsp_client.python_for)."""
    editor = CLIENTS[client]
    server = Server(log_dir / name, tree=tree)
    # False: a client that does not take rest/suggestionReady (rest-noask, a plain client)
    server.suggestion_ready = asks_again and editor.asks_again
    await server.start()
    t0 = time.perf_counter()
    await server.initialize({"persistHistory": False, "cacheDir": str(log_dir / name / "cache"), **options}, [ws])
    st = await server.wait_ready(workspace=True)
    ready_s = time.perf_counter() - t0
    folder = (st.get("datastore") or {}).get("folders", [{}])[0]
    print(f"[{name}] ready in {ready_s:.1f} s (workspace {folder.get('state')}, {folder.get('documents')} files)",
          file=sys.stderr)
    await wait_quiet(server)
    options = {**options, "client": client, **({"tree": str(tree)} if tree else {})}
    return MethodRun(name, options, server, editor, random.Random(args.seed), patient, ready_s,
                     server.cpu_seconds(), RHYTHMS[args.rhythm], trace=[] if args.trace else None)


async def start_peer(name: str, args, log_dir: Path) -> MethodRun:
    """llama.cpp's llama-server with a llama.vim-style client (benchmarks/llama_peer.py)."""
    binary = Path(args.llama_server) if args.llama_server else cache_root() / "llama.cpp" / "llama-server"
    if not binary.is_file():
        raise SystemExit(f"the llama.cpp method needs llama-server: {binary} is missing (bash "
                         "benchmarks/llama_server.sh builds it there), or give --llama-server PATH")
    model = Path(args.llama_model) if args.llama_model else gguf_path()
    server = LlamaServer(binary, model, log_dir / name, threads=args.llama_threads)
    t0 = time.perf_counter()
    await server.start()
    await server.wait_ready()
    ready_s = time.perf_counter() - t0
    print(f"[{name}] ready in {ready_s:.1f} s ({model.name})", file=sys.stderr)
    await wait_quiet(server)
    editor = functools.partial(InfillEditor, n_prefix=args.llama_lines[0], n_suffix=args.llama_lines[1])
    return MethodRun(name, {"server": str(binary), "model": str(model), "lines": args.llama_lines}, server, editor,
                     random.Random(args.seed), False, ready_s, server.cpu_seconds(), RHYTHMS[args.rhythm],
                     trace=[] if args.trace else None)


async def type_next(run: MethodRun, path: Path, opened: str, body: Body, args) -> None:
    """The method's person types one body (opening its file first when it is the next file)."""
    if run.editor is None or run.editor.uri != path.as_uri():
        run.editor = run.editor_type(run.server, path, opened)
    before = {k: run.tally[k] for k in ("typed", "accepted", "pauses", "shown")}
    t0 = time.perf_counter()
    await type_body(run.editor, body, run.rng, not args.no_cancel, not args.no_cursor, run.tally, run.trace,
                    run.patient, run.person)
    run.typing_s += time.perf_counter() - t0
    run.per_body.append({k: run.tally[k] - v for k, v in before.items()})
    t = run.tally
    print(f"[{run.name}] body {len(run.per_body)}: typed {t['typed']}, accepted {t['accepted']}, "
          f"pauses {t['pauses']}, shown {t['shown']}", file=sys.stderr)


async def wait_quiet(server: Server, quiet_s: float = 0.5, cap_s: float = 20.0) -> None:
    """Until the server has used (almost) no CPU for `quiet_s`: a suggestion it still decodes ahead must not run
    while another method's person types."""
    t_end, last = time.perf_counter() + cap_s, server.cpu_seconds()
    while time.perf_counter() < t_end:
        await asyncio.sleep(quiet_s)
        now = server.cpu_seconds()
        if now - last < 0.05 * quiet_s:
            return
        last = now


async def finish_method(run: MethodRun) -> dict:
    await asyncio.sleep(0.5)
    cpu = run.server.cpu_seconds() - run.cpu0
    st = await run.server.stats(last=0)
    await run.server.close()
    tally = run.tally
    lat = tally["shown_latency"]
    chars = tally["typed"] + tally["accepted"]
    return {
        "options": run.options, "bodies": len(run.per_body), "ready_s": round(run.ready_s, 1),
        "typing_s": round(run.typing_s, 1), "per_body": run.per_body,
        "pauses": tally["pauses"], "shown": tally["shown"], "answered_empty": tally["empty"],
        "asked_again": tally["asked_again"],
        "answered_after_the_next_key": tally["late"], "trace": run.trace,
        "shown_rate": round(tally["shown"] / tally["pauses"], 3) if tally["pauses"] else None,
        "shown_latency_ms_p50": pct(lat, 50), "shown_latency_ms_p95": pct(lat, 95),
        "shown_latency_ms_mean": round(statistics.mean(lat), 1) if lat else None,
        "keys_typed": tally["typed"], "chars_accepted": tally["accepted"], "accepts": tally["accepts"],
        "accept_keys": tally["accept_keys"], "chars_total": tally["typeable"],
        "accepted_share": round(tally["accepted"] / tally["typeable"], 3) if tally["typeable"] else None,
        # an accept is a key too (Tab, or accept-word once per word)
        "keys_saved_share": round(1 - (tally["typed"] + tally["accept_keys"]) / chars, 3) if chars else None,
        "cpu_s": round(cpu, 1), "cpu_s_per_typed_char": round(cpu / max(1, tally["typed"]), 3),
        "server": st["totals"] if isinstance(run.server, LlamaServer) else {k: st["totals"].get(k) for k in (
            "requests", "model_calls", "completed", "reused", "cache", "empty", "cancelled", "superseded",
            "predictions", "typing_predictions", "ahead_predictions", "warmups", "warm_tokens", "tokens", "steps", "accepted_per_step",
            "draft_nodes", "forward_ms", "retrieval_ms", "prefill_ms", "interrupted_forwards",
            "prompt_tokens", "reused_prompt_tokens", "computed_prompt_tokens", "accepted_sources",
            "cursor_notifications", "ready_notices",
            "context_selections", "context_select_ms", "context_warm_tokens")},
        # what keystrokes cost the model in prompt: the tokens the runs' prefills computed (a run stopped
        # mid-prompt leaves the rest to the next), the warm-ups', and the new cross-file blocks' computed in the
        # background, per key typed; and the runs' prompt tokens not found in a KV cache when they started
        "prompt_tokens_computed_per_key": None if isinstance(run.server, LlamaServer) else round(
            ((st["totals"].get("computed_prompt_tokens") or 0)
             + (st["totals"].get("warm_tokens") or 0) + (st["totals"].get("context_warm_tokens") or 0))
            / max(1, tally["typed"]), 1),
        "prompt_tokens_missed_per_key": None if isinstance(run.server, LlamaServer) else round(
            ((st["totals"].get("prompt_tokens") or 0) - (st["totals"].get("reused_prompt_tokens") or 0))
            / max(1, tally["typed"]), 1),
        "model": {k: st["model"].get(k) for k in ("name", "precision", "verifier", "layout", "kv_cache")},
        # the cross-file blocks: selections made, new blocks offered and promoted, unchanged, kept (no new definition)
        "cross_file": None if isinstance(run.server, LlamaServer) else {
            k: (st.get("cross_file") or {}).get(k) for k in ("selections", "offered", "promoted", "unchanged", "kept")},
    }


def interleaved(bodies: list, names: list[str]) -> list[tuple[int, str]]:
    """(body index, method) in the order they are typed: each body by every method in turn, the order reversed
    from one body to the next, so that a method never types all its bodies while the machine is faster or slower
    than while the others type theirs."""
    out = []
    for k in range(len(bodies)):
        out += [(k, n) for n in (names if k % 2 == 0 else names[::-1])]
    return out


async def invoked_checks(ws: Path, root: Path, options: dict, log_dir: Path) -> dict:
    """The two Invoked cases of issue 11 over the protocol: a request made while the model loads (answered
    after the load, non-empty), and the first Invoked request in a 1,000-line file opened 10 s earlier, the
    cursor resting at the position for 3 s (rest/cursor, as this project's clients send it)."""
    big = max(python_files(root), key=lambda p: p.read_text(encoding="utf-8").count("\n"))
    text = (ws / big.relative_to(root)).read_text(encoding="utf-8")
    bodies = [b for b in function_bodies(text, 2, 12) if b[0] > 600] or function_bodies(text, 2, 12)
    first, last, indent = bodies[0]
    lines = text.split("\n")
    doc = "\n".join(lines[:first] + [" " * indent] + lines[last + 1:])
    out: dict = {"file": big.name, "lines": doc.count("\n") + 1, "line": first}
    server = Server(log_dir / "invoked")
    await server.start()
    try:
        await server.initialize({"persistHistory": False, "cacheDir": str(log_dir / "invoked" / "cache"), **options},
                                [ws])
        ed = Editor(server, ws / big.relative_to(root), doc)
        t0 = time.perf_counter()
        params = types.InlineCompletionParams(
            context=types.InlineCompletionContext(trigger_kind=types.InlineCompletionTriggerKind.Invoked),
            text_document=types.TextDocumentIdentifier(uri=ed.uri), position=types.Position(first, indent))
        r = await server.client.protocol.send_request_async(types.TEXT_DOCUMENT_INLINE_COMPLETION, params)
        st = await server.stats()
        out["while_loading"] = {"answered_s": round(time.perf_counter() - t0, 2), "load_s": st["model"].get("load_s"),
                                "non_empty": bool(r.items and r.items[0].insert_text)}
        # the same file, another function: opened (again) 10 s before the request, the cursor resting 3 s
        first2, last2, indent2 = bodies[-1]
        doc2 = "\n".join(lines[:first2] + [" " * indent2] + lines[last2 + 1:])
        uri2 = (ws / big.relative_to(root)).with_name("opened_" + big.name).as_uri()
        server.client.text_document_did_open(types.DidOpenTextDocumentParams(
            types.TextDocumentItem(uri=uri2, language_id="python", version=1, text=doc2)))
        await asyncio.sleep(7.0)
        server.client.protocol.notify("rest/cursor", {"textDocument": {"uri": uri2},
                                                      "position": {"line": first2, "character": indent2}})
        await asyncio.sleep(3.0)
        t0 = time.perf_counter()
        params = types.InlineCompletionParams(
            context=types.InlineCompletionContext(trigger_kind=types.InlineCompletionTriggerKind.Invoked),
            text_document=types.TextDocumentIdentifier(uri=uri2), position=types.Position(first2, indent2))
        r = await server.client.protocol.send_request_async(types.TEXT_DOCUMENT_INLINE_COMPLETION, params)
        out["opened_and_rested"] = {"answered_ms": round((time.perf_counter() - t0) * 1000),
                                    "non_empty": bool(r.items and r.items[0].insert_text),
                                    "items": len(r.items or []), "line": first2}
        print(f"invoked: {out}", file=sys.stderr)
    finally:
        await server.close()
    return out


def parse_value(v: str):
    try:
        return json.loads(v)
    except json.JSONDecodeError:
        return v


def method_options(name: str, extra: dict) -> tuple[str, dict]:
    """A method's name without its model and precision, and its server settings: `rest@int8w` is REST with
    `precision: int8w`, `rest+qwen2.5-coder-1.5b@bf16` REST with that model (the `model` setting) in bf16;
    `extra` (--set) applies to every method; settings in brackets apply to this method alone, after `extra`:
    `rest[predictBudgetMs=30;maxLines=1]` beside `rest` compares a setting within one run."""
    name, own = method_settings(name)
    name, _, precision = name.partition("@")
    base, _, model = name.partition("+")
    # -cf: with other files of the repository before the current one in every document (crossFile true; its
    # default selectors), -cfdefs / -cfsib: the definitions / siblings selector alone, -cfall: every selector;
    # -nocf: without; rest and plain: the default ("auto": in a document that fits the prompt's prefix window)
    if base == "ceiling":
        raise SystemExit("`ceiling` is now `patient`: a person who waits for each whole suggestion, not a bound on "
                         "what any method can accept (REST out-accepted it once)")
    methods = {"rest": {"draftBudget": None}, "plain": {"draftBudget": 0}, "patient": PATIENT,
               "rest-noask": {"draftBudget": None}, "rest-nocf": {"draftBudget": None, "crossFile": False},
               "plain-nocf": {"draftBudget": 0, "crossFile": False},
               "rest-cf": {"draftBudget": None, "crossFile": True},
               "rest-cfdefs": {"draftBudget": None, "crossFile": True, "crossFileSelectors": ["definitions"]},
               "rest-cfsib": {"draftBudget": None, "crossFile": True, "crossFileSelectors": ["siblings"]},
               "rest-cfall": {"draftBudget": None, "crossFile": True,
                              "crossFileSelectors": ["definitions", "similar", "recent", "siblings"]}}
    if base not in methods:
        raise SystemExit(f"unknown method {name!r}: one of {', '.join(methods)}, {PEER} (a precision after @)")
    return base, {**methods[base], **extra, **own, **({"precision": precision} if precision else {}),
                  **({"model": model} if model else {})}


def method_names(spec: str) -> list[str]:
    """--methods split at the commas outside brackets: a setting's value may be a JSON list,
    `rest,rest[crossFileSelectors=["similar","siblings"]]` -> ["rest", 'rest[crossFileSelectors=["similar","siblings"]]']."""
    names, depth, start = [], 0, 0
    for i, ch in enumerate(spec):
        depth += {"[": 1, "]": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            names.append(spec[start:i])
            start = i + 1
    names.append(spec[start:])
    return [n for n in names if n]


def method_settings(name: str) -> tuple[str, dict]:
    """A method's name without its bracketed settings, and those settings (values read as JSON where they
    parse): `rest@bf16[predictBudgetMs=30]` -> ("rest@bf16", {"predictBudgetMs": 30})."""
    m = re.fullmatch(r"([^[]*)\[(.*)\]", name)
    if m is None:
        return name, {}
    pairs = [kv for kv in m.group(2).split(";") if kv]
    if any("=" not in kv for kv in pairs):
        raise SystemExit(f"settings in {name!r} must be KEY=VALUE, separated by ';'")
    return m.group(1), {k: parse_value(v) for k, v in (kv.split("=", 1) for kv in pairs)}


def method_tree(name: str, trees: dict[str, Path]) -> tuple[str, Path | None]:
    """A method's name without its source tree, and the tree: `rest~before` is REST served by the code checked out
    at `--tree before=DIR` (a git worktree of another commit, run with this checkout's environment), typed beside
    the same method of this checkout: a before/after comparison within one run."""
    spec, sep, tag = name.rpartition("~")
    if not sep:
        return name, None
    if tag not in trees:
        raise SystemExit(f"unknown tree {tag!r} in {name!r}: give it as --tree {tag}=DIR")
    return spec, trees[tag]


def method_client(name: str, default: str = "project") -> tuple[str, str]:
    """A method's name without its client, and the client: `rest:plain` is REST typed through a plain LSP
    client (PlainEditor), `rest:project` through this project's (Editor); without one, `default` (--client)."""
    spec, sep, client = name.partition(":")
    client = client if sep else default
    if client not in CLIENTS:
        raise SystemExit(f"unknown client {client!r} in {name!r}: one of {', '.join(CLIENTS)}")
    if spec == PEER and sep:
        raise SystemExit(f"{PEER} has its own client (llama.vim's); no :{client}")
    return spec, client


async def main_async(args) -> dict:
    root = fetch_project(args.project)
    work = Path(tempfile.mkdtemp(prefix="rest-lsp-typing."))
    try:
        ws, files = prepare_whole(root, args.whole_file, work) if args.whole_file else \
            prepare(root, args.files, args.limit, args.seed, work)
        extra = dict(kv.split("=", 1) for kv in args.set)
        extra = {k: parse_value(v) for k, v in extra.items()}
        report = {"project": args.project, "files": [str(p.relative_to(ws)) for p, _, _ in files],
                  "command": " ".join(sys.argv), "cancel": not args.no_cancel, "cursor": not args.no_cursor,
                  "rhythm": asdict(RHYTHMS[args.rhythm]), "methods": {}}
        names = method_names(args.methods)
        trees = {tag: Path(d).resolve() for tag, d in (kv.split("=", 1) for kv in args.tree)}
        runs = {}
        for name in names:  # one after another: a server loads and indexes while the others are idle
            spec, tree = method_tree(name, trees)
            spec, client = method_client(spec, args.client)
            if spec == PEER:
                if tree:
                    raise SystemExit(f"{PEER} is not served by this project's code: no ~tree")
                runs[name] = await start_peer(name, args, work / "logs")
                continue
            base, options = method_options(spec, extra)
            runs[name] = await start_method(name, options, ws, args, work / "logs", patient=base == "patient",
                                            asks_again=base != "rest-noask", client=client, tree=tree)
        bodies = [(path, opened, b) for path, opened, bs in files for b in bs][:args.limit]
        for k, name in interleaved(bodies, names):
            await type_next(runs[name], *bodies[k], args)
            await wait_quiet(runs[name].server)
        for name in names:
            report["methods"][name] = await finish_method(runs[name])
        if not args.no_invoked:
            report["invoked"] = await invoked_checks(ws, root, method_options("rest", extra)[1], work / "logs")
        return report
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"kept {work}", file=sys.stderr)


def predictions(server: dict) -> str:
    """Model runs started by keys (typing), by requests and as if a suggestion were accepted (llama.cpp:
    requests, of which speculative)."""
    if "speculative" in server:
        return f"{server['requests']} ({server['speculative']} ahead)"
    return "/".join(str(server.get(k) or 0) for k in ("typing_predictions", "predictions", "ahead_predictions"))


def paired(rest: list[dict], other: list[dict], name: str = "plain", ref: str = "REST") -> str:
    """Body by body (the methods typed each body within a minute of each other): how often the person of `ref`
    (REST) accepted more characters than the other method's, and the mean difference with its standard error."""
    diffs = [a["accepted"] - b["accepted"] for a, b in zip(rest, other)]
    if not diffs:
        return f"no body typed by both {ref} and {name}"
    spread = (f" +- {statistics.stdev(diffs) / len(diffs) ** 0.5:.1f} (standard error, {len(diffs)} bodies)"
              if len(diffs) > 1 else " (1 body: no standard error)")
    more, fewer = sum(d > 0 for d in diffs), sum(d < 0 for d in diffs)
    return (f"body by body, characters accepted {ref} - {name}: mean {statistics.mean(diffs):+.1f}{spread}; "
            f"{ref} more in {more}, {name} more in {fewer}, "
            f"equal in {len(diffs) - more - fewer}")


def table(report: dict) -> str:
    head = (f"{'method':<12} {'pauses':>6} {'shown':>6} {'shown %':>7} {'empty':>5} {'again':>5} {'p50 ms':>7} "
            f"{'p95 ms':>7} {'typed':>6} "
            f"{'accepted':>8} {'accepted %':>10} {'CPU s/char':>10} {'predictions key/req/ahead':>25}")
    rh = report.get("rhythm") or {}
    out = [f"rhythm: {rh.get('name', '?')}" + ("" if rh.get("legacy", True) else
           f" (key mean {1000 * rh['key_mean_s']:.0f} ms, line pause mean {1000 * rh['line_mean_s']:.0f} ms, "
           f"reading {1000 * rh['read_s_per_word']:.0f} ms per word, accepts cost keys)"), head, "-" * len(head)]
    for m, r in report["methods"].items():
        out.append(f"{m:<12} {r['pauses']:>6} {r['shown']:>6} {100 * (r['shown_rate'] or 0):>6.1f}% "
                   f"{r['answered_empty']:>5} {r['asked_again']:>5} "
                   f"{r['shown_latency_ms_p50'] or 0:>7.0f} {r['shown_latency_ms_p95'] or 0:>7.0f} {r['keys_typed']:>6} "
                   f"{r['chars_accepted']:>8} {100 * (r['accepted_share'] or 0):>9.1f}% {r['cpu_s_per_typed_char']:>10.3f} "
                   f"{predictions(r['server']):>25}")
    for m, r in report["methods"].items():  # the decoding itself: what a step verified, cost and gave
        if r.get("accept_keys") is not None:
            out.append(f"{m}: {r['accepts']} accepts for {r['accept_keys']} accept keys; keys saved "
                       f"{100 * (r.get('keys_saved_share') or 0):.1f}% (typed and accept keys against characters "
                       f"entered), {r.get('typing_s')} s typing")
        sv = r["server"]
        if sv.get("steps"):
            out.append(f"{m}: {sv['tokens']} tokens in {sv['steps']} steps (M {sv['tokens'] / sv['steps']:.2f}), "
                       f"{(sv.get('draft_nodes') or 0) / sv['steps']:.1f} draft nodes and "
                       f"{(sv.get('forward_ms') or 0) / sv['steps']:.0f} ms forward per step, "
                       f"{(sv.get('forward_ms') or 0) / sv['tokens']:.0f} ms per token")
        if r.get("prompt_tokens_computed_per_key") is not None:
            cf = r.get("cross_file") or {}
            out.append(f"{m}: {r['prompt_tokens_computed_per_key']} prompt tokens computed per key typed "
                       f"({sv.get('context_warm_tokens') or 0} for {cf.get('promoted') or 0} new cross-file blocks of "
                       f"{cf.get('offered') or 0} offered, in the background; {sv.get('context_selections') or 0} "
                       f"selections in {sv.get('context_select_ms') or 0} ms, {cf.get('unchanged') or 0} unchanged, {cf.get('kept') or 0} kept: no new definition; "
                       f"runs' prompt tokens not in a cache when they started: {r.get('prompt_tokens_missed_per_key')} "
                       f"per key); accepted per source {sv.get('accepted_sources')}")
        if "prompt_n" in sv and sv.get("predicted_n"):
            out.append(f"{m}: {sv['prompt_n']} prompt tokens in {sv['prompt_ms'] / 1000:.1f} s, {sv['predicted_n']} "
                       f"tokens predicted at {sv['predicted_ms'] / sv['predicted_n']:.0f} ms per token; hints from "
                       f"the cache {sv['hints_from_cache']}, typed through {sv['hints_typed_through']}")
    m = report["methods"]
    if "rest" in m and "plain" in m and m["plain"]["chars_accepted"]:
        out.append(f"characters accepted, REST / plain: {m['rest']['chars_accepted'] / m['plain']['chars_accepted']:.2f}x")
    ref = next(iter(m), None)  # the first method against each other one, body by body
    for other in list(m)[1:]:
        out.append(paired(m[ref]["per_body"], m[other]["per_body"], other, "REST" if ref == "rest" else ref))
    if "patient" in m and "plain" in m and m["plain"]["chars_accepted"]:
        ratio = m["patient"]["chars_accepted"] / m["plain"]["chars_accepted"]
        out.append(f"characters accepted, patient / plain: {ratio:.2f}x "
                   "(a person who waits for each whole suggestion; not a bound on other methods)")
    inv = report.get("invoked")
    if inv:
        w, o = inv["while_loading"], inv["opened_and_rested"]
        out.append(f"Invoked while the model loads: answered {w['answered_s']} s after the request (load "
                   f"{w['load_s']} s), non-empty: {w['non_empty']}")
        out.append(f"Invoked in a {inv['lines']}-line file opened 10 s before, cursor resting 3 s: "
                   f"{o['answered_ms']} ms, non-empty: {o['non_empty']}")
    return "\n".join(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--project", default=DEFAULT_PROJECT)
    p.add_argument("--files", type=int, default=2, help="files whose bodies are typed")
    p.add_argument("--limit", type=int, default=12, help="function bodies typed per method")
    p.add_argument("--methods", default="rest,plain", help="rest, plain (draftBudget 0), patient (REST with a person "
                   "who waits for each whole suggestion, predictBudgetMs 0; not a bound), rest-noask (REST "
                   "with a client that does not ask again on rest/suggestionReady), llama.cpp (llama-server with a "
                   "llama.vim-style client: benchmarks/llama_peer.py)")
    p.add_argument("--llama-server", default=None, help="the llama-server binary for the llama.cpp method (default: "
                   "<cache>/llama.cpp/llama-server, where benchmarks/llama_server.sh puts it)")
    p.add_argument("--llama-model", default=None, help="its GGUF (default: the embedded model's own GGUF)")
    p.add_argument("--llama-threads", type=int, default=2)
    p.add_argument("--llama-lines", default=(N_PREFIX, N_SUFFIX),
                   type=lambda v: tuple(int(x) for x in v.split(",")),
                   help=f"lines above,below the cursor the llama.vim client sends (its defaults: {N_PREFIX},{N_SUFFIX})")
    p.add_argument("--whole-file", action="append", default=[], metavar="PATH",
                   help="type this file of the project whole, from an empty file (the rest of the project is the "
                   "workspace), instead of bodies; repeatable")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rhythm", choices=sorted(RHYTHMS), default=DEFAULT,
                   help="the person: human (an average typist, lognormal intervals, pauses at words, brackets and "
                   "line ends, reading and keys to accept; benchmarks/typist.py), fast (the same at 120 ms per key), "
                   "old (60-140 ms per key, accepting free: every typing table before 2026-12-02)")
    p.add_argument("--no-cancel", action="store_true", help="Neovim style: never cancel a request in flight")
    p.add_argument("--no-cursor", action="store_true", help="send no rest/cursor notifications")
    p.add_argument("--client", choices=sorted(CLIENTS), default="project",
                   help="the client of the methods named without one: project (this project's clients: incremental "
                   "changes, rest/cursor, asking again at rest/suggestionReady) or plain (whole-text changes and "
                   "nothing of rest/*, no pause before a body); per method: --methods rest,rest:plain")
    p.add_argument("--set", action="append", default=[], help="a server setting for every method, KEY=VALUE")
    p.add_argument("--tree", action="append", default=[], metavar="TAG=DIR",
                   help="a checkout of other code (git worktree add DIR COMMIT) that methods named NAME~TAG run on")
    p.add_argument("--keep", action="store_true", help="keep the workspace and the server logs")
    p.add_argument("--trace", action="store_true", help="every pause's text, answer and latency in the JSON")
    p.add_argument("--no-invoked", action="store_true", help="leave out the two Invoked checks")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    report = asyncio.run(main_async(args))
    print(table(report))
    if args.json:
        write_json(args.json, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
