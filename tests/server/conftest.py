"""A real `rest-lsp --stdio` process driven by pygls' LanguageClient, with the tiny model."""
from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest
from lsprotocol import types
from pygls.client import run_async
from pygls.lsp.client import LanguageClient

# pygls' bundled capability snapshots lack inlineCompletion: declare it (and work-done progress) ourselves
CAPABILITIES = types.ClientCapabilities(
    text_document=types.TextDocumentClientCapabilities(
        inline_completion=types.InlineCompletionClientCapabilities(),
        synchronization=types.TextDocumentSyncClientCapabilities(did_save=True)),
    window=types.WindowClientCapabilities(work_done_progress=True),
    workspace=types.WorkspaceClientCapabilities(configuration=False, workspace_folders=True),
)


class Session:
    """One server process and a client that records what the server sends on its own."""

    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.client = LanguageClient("rest-lsp-tests", "0")
        self.logs: list[types.LogMessageParams] = []
        self.progress: list[types.ProgressParams] = []
        self.messages: list[types.ShowMessageParams] = []
        self.log_file = tmp / "server.log"
        self.stderr_file = tmp / "server.stderr"
        c = self.client

        @c.feature(types.WINDOW_LOG_MESSAGE)
        def _log(params):
            self.logs.append(params)

        @c.feature(types.WINDOW_SHOW_MESSAGE)
        def _show(params):
            self.messages.append(params)

        @c.feature(types.WINDOW_WORK_DONE_PROGRESS_CREATE)
        def _create(params):
            return None

        @c.feature(types.PROGRESS)
        def _progress(params):
            self.progress.append(params)

    async def start(self, env: dict | None = None):
        self._stderr = open(self.stderr_file, "wb")
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "rest_lsp.cli", "--stdio", "--log-file", str(self.log_file),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=self._stderr,
            env={**os.environ, "TRANSFORMERS_VERBOSITY": "error", "HF_HUB_DISABLE_PROGRESS_BARS": "1",
                 **(env or {})})
        c = self.client
        c.protocol.set_writer(proc.stdin)
        c._async_tasks.append(asyncio.create_task(run_async(
            stop_event=c._stop_event, reader=proc.stdout, protocol=c.protocol, logger=None,
            error_handler=c.report_server_error)))
        c._server = proc
        self.proc = proc

    async def initialize(self, options: dict, folders: list[Path] = ()) -> types.InitializeResult:
        result = await self._wait(self.client.initialize_async(types.InitializeParams(
            capabilities=CAPABILITIES, initialization_options=options,
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

    async def _wait(self, aw, timeout: float = 90):
        """Any answer within timeout, or a failure that shows the server's log (never a hung test)."""
        try:
            return await asyncio.wait_for(aw, timeout)
        except asyncio.TimeoutError:
            raise AssertionError(f"no answer in {timeout} s; server log:\n{self.server_log()[-3000:]}")

    async def stats(self, last: int = 50) -> dict:
        r = await self.request("rest/stats", {"last": last})
        return _plain(r)

    async def close(self):
        try:
            if self.proc.returncode is None:
                await asyncio.wait_for(self.client.shutdown_async(None), 20)
                self.client.exit(None)
                await asyncio.wait_for(self.proc.wait(), 10)   # ends without its stdin being closed
        except (asyncio.TimeoutError, Exception):
            if self.proc.returncode is None:
                self.proc.kill()
                await self.proc.wait()
        finally:
            self.client._stop_event.set()
            self._stderr.close()

    def server_log(self) -> str:
        out = self.log_file.read_text(errors="replace") if self.log_file.exists() else ""
        return out + (self.stderr_file.read_text(errors="replace") if self.stderr_file.exists() else "")


def _plain(obj):
    """pygls hands custom-request results back as namedtuple-like objects or dicts: make them dicts."""
    if hasattr(obj, "_asdict"):
        obj = obj._asdict()
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    return obj


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    from rest_lsp.model.tiny import make_tiny_model_dir

    return make_tiny_model_dir(tmp_path_factory.mktemp("tiny-model"))


@pytest.fixture(scope="session")
def shared_cache(tmp_path_factory) -> Path:
    """One cache root for the session: the tiny model's cost calibration is measured once."""
    return tmp_path_factory.mktemp("rest-lsp-cache")


@pytest.fixture
async def session(tmp_path, shared_cache):
    s = Session(tmp_path)
    await s.start(env={"REST_LSP_CACHE": str(shared_cache)})
    yield s
    await s.close()


@pytest.fixture
async def start_session(tmp_path, shared_cache):
    """Start servers one after another (a daemon restart); each gets a folder of its own for its logs."""
    started: list[Session] = []

    async def start() -> Session:
        folder = tmp_path / f"server-{len(started)}"
        folder.mkdir()
        s = Session(folder)
        await s.start(env={"REST_LSP_CACHE": str(shared_cache)})
        started.append(s)
        return s

    yield start
    for s in started:
        await s.close()


@pytest.fixture
async def user_cache_session(tmp_path):
    """A server using the real user cache: the embedded model is assembled and converted there once."""
    s = Session(tmp_path)
    await s.start()
    yield s
    await s.close()


@pytest.fixture(scope="session")
def tiny_codellama(tmp_path_factory) -> Path:
    """The tiny Llama model in CodeLlama's layout (32,016 ids, its infill tokens, hub-style tokenizer files)."""
    from rest_lsp.model.tiny import make_tiny_codellama_dir

    return make_tiny_codellama_dir(tmp_path_factory.mktemp("tiny-codellama") / "model")
