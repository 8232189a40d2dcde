"""An editor-like LSP client: a real `rest-lsp --stdio` process, driven with pygls' LanguageClient (framing,
JSON-RPC, cancellation), plus the server's CPU time read from /proc. The benchmarks drive the daemon with it,
and the end-to-end tests (tests/server/conftest.py) extend it with recorders and timeouts."""
from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

from lsprotocol import types
from pygls.client import run_async
from pygls.lsp.client import LanguageClient


READY = "rest/suggestionReady"


def capabilities(work_done_progress: bool = False, suggestion_ready: bool = True) -> types.ClientCapabilities:
    # pygls' bundled capability snapshots lack inlineCompletion: declare it ourselves. Like this project's editor
    # clients, it asks again on rest/suggestionReady (an Automatic request that got nothing in time)
    return types.ClientCapabilities(
        text_document=types.TextDocumentClientCapabilities(
            inline_completion=types.InlineCompletionClientCapabilities(),
            synchronization=types.TextDocumentSyncClientCapabilities(did_save=True)),
        window=types.WindowClientCapabilities(work_done_progress=work_done_progress),
        workspace=types.WorkspaceClientCapabilities(configuration=False, workspace_folders=True),
        experimental={"restLsp": {"suggestionReady": True}} if suggestion_ready else None,
    )


def proc_cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (/proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def plain(obj):
    """Custom-request results as dicts (pygls hands them over as namedtuple-like objects)."""
    if hasattr(obj, "_asdict"):
        obj = obj._asdict()
    if isinstance(obj, dict):
        return {k: plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [plain(v) for v in obj]
    return obj


def python_for(tree: Path | None) -> tuple[list[str], dict]:
    """The interpreter command and environment that import this project's code, or the tree's when given.
    `python -m` puts the working directory first on sys.path (this checkout, where the benchmarks run), ahead of
    PYTHONPATH; `-P` leaves it out, so that the tree is what the server imports."""
    if tree is None:
        return [sys.executable], {}
    return [sys.executable, "-P"], {"PYTHONPATH": str(tree)}


class Server:
    """`rest-lsp --stdio` in a process of its own, with a client; its log and stderr go to `log_dir`."""

    name = "rest-lsp-bench"
    work_done_progress = False
    suggestion_ready = True

    def __init__(self, log_dir: Path, env: dict | None = None, tree: Path | None = None):
        """tree: serve with the code checked out there (a git worktree) instead of this checkout's."""
        self.log_dir = log_dir
        self.python, tree_env = python_for(tree)
        self.env = {**(env or {}), **tree_env}
        self.log_file = log_dir / "server.log"
        self.stderr_file = log_dir / "server.stderr"
        self.client = LanguageClient(self.name, "0")
        self.proc: asyncio.subprocess.Process | None = None

        @self.client.feature(types.WINDOW_LOG_MESSAGE)
        def _log(params):
            self.on_log(params)

        @self.client.feature(READY)
        def _ready(params):
            self.on_ready(plain(params))

    def on_log(self, params: types.LogMessageParams) -> None:
        """A window/logMessage from the server (dropped here; the tests record them)."""

    def on_ready(self, params: dict) -> None:
        """rest/suggestionReady ({textDocument: {uri, version}, position}): the typing benchmark asks again."""

    async def start(self, env: dict | None = None) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._stderr = open(self.stderr_file, "wb")
        self.proc = await asyncio.create_subprocess_exec(
            *self.python, "-m", "rest_lsp.cli", "--stdio", "--log-file", str(self.log_file),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=self._stderr,
            env={**os.environ, "TRANSFORMERS_VERBOSITY": "error", "HF_HUB_DISABLE_PROGRESS_BARS": "1",
                 **self.env, **(env or {})})
        c = self.client
        c.protocol.set_writer(self.proc.stdin)
        c._async_tasks.append(asyncio.create_task(run_async(
            stop_event=c._stop_event, reader=self.proc.stdout, protocol=c.protocol, logger=None,
            error_handler=c.report_server_error)))
        c._server = self.proc

    async def _wait(self, aw):
        """An answer (the tests put a timeout here)."""
        return await aw

    async def initialize(self, options: dict, folders: list[Path] = ()) -> types.InitializeResult:
        result = await self._wait(self.client.initialize_async(types.InitializeParams(
            capabilities=capabilities(self.work_done_progress, self.suggestion_ready), initialization_options=options,
            workspace_folders=[types.WorkspaceFolder(uri=p.as_uri(), name=p.name) for p in folders] or None,
            root_uri=folders[0].as_uri() if folders else None)))
        self.client.initialized(types.InitializedParams())
        return result

    def open(self, uri: str, text: str, language: str = "python", version: int = 1) -> None:
        self.client.text_document_did_open(types.DidOpenTextDocumentParams(
            types.TextDocumentItem(uri=uri, language_id=language, version=version, text=text)))

    def edit(self, uri: str, version: int, start: tuple[int, int], end: tuple[int, int], text: str) -> None:
        self.client.text_document_did_change(types.DidChangeTextDocumentParams(
            types.VersionedTextDocumentIdentifier(uri=uri, version=version),
            [types.TextDocumentContentChangePartial(
                range=types.Range(types.Position(*start), types.Position(*end)), text=text)]))

    def inline_params(self, uri: str, line: int, character: int, invoked: bool = False,
                      selected: types.SelectedCompletionInfo | None = None) -> types.InlineCompletionParams:
        kind = types.InlineCompletionTriggerKind.Invoked if invoked else types.InlineCompletionTriggerKind.Automatic
        return types.InlineCompletionParams(
            context=types.InlineCompletionContext(trigger_kind=kind, selected_completion_info=selected),
            text_document=types.TextDocumentIdentifier(uri=uri), position=types.Position(line, character))

    async def complete(self, uri: str, line: int, character: int, **kw):
        return await self._wait(self.client.text_document_inline_completion_async(
            self.inline_params(uri, line, character, **kw)))

    async def request(self, method: str, params=None, msg_id=None):
        return await self._wait(self.client.protocol.send_request_async(method, params, msg_id=msg_id))

    async def stats(self, last: int = 0) -> dict:
        return plain(await self.request("rest/stats", {"last": last}))

    async def wait_ready(self, workspace: bool, timeout: float = 1800) -> dict:
        """Until the model is loaded (and the workspace indexed): the moment a person would start typing."""
        for _ in range(int(timeout * 5)):
            st = await self.stats()
            folders = (st.get("datastore") or {}).get("folders") or []
            if st["model"]["state"] == "failed":
                raise RuntimeError(f"the model failed to load: {st['model']['error']}")
            if st["model"]["state"] == "ready" and (not workspace or (folders and all(
                    f["state"] in ("ready", "failed", "disabled") for f in folders))):
                return st
            await asyncio.sleep(0.2)
        raise TimeoutError("the server was not ready in time")

    def cpu_seconds(self) -> float:
        """User + system CPU time of the server process so far."""
        return proc_cpu_seconds(self.proc.pid)

    def server_log(self) -> str:
        out = self.log_file.read_text(errors="replace") if self.log_file.exists() else ""
        return out + (self.stderr_file.read_text(errors="replace") if self.stderr_file.exists() else "")

    async def close(self) -> None:
        try:
            if self.proc.returncode is None:
                await asyncio.wait_for(self.client.shutdown_async(None), 30)
                self.client.exit(None)
                await asyncio.wait_for(self.proc.wait(), 15)   # ends without its stdin being closed
        except Exception:  # noqa: BLE001 - never hang on a stuck server
            if self.proc.returncode is None:
                self.proc.kill()
                await self.proc.wait()
        finally:
            self.client._stop_event.set()
            self._stderr.close()
