"""A real `rest-lsp --stdio` process driven by the editor-like client of the benchmarks
(benchmarks/lsp_client.py), with the tiny model."""
from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest
from lsprotocol import types

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from lsp_client import Server  # noqa: E402


class Session(Server):
    """One server process and a client that records what the server sends on its own, and fails (with the
    server's log) instead of hanging when an answer does not come."""

    name = "rest-lsp-tests"
    work_done_progress = True

    def __init__(self, tmp: Path):
        super().__init__(tmp)
        self.tmp = tmp
        self.logs: list[types.LogMessageParams] = []
        self.progress: list[types.ProgressParams] = []
        self.messages: list[types.ShowMessageParams] = []
        self.ready: list[dict] = []   # rest/suggestionReady notifications
        c = self.client

        @c.feature(types.WINDOW_SHOW_MESSAGE)
        def _show(params):
            self.messages.append(params)

        @c.feature(types.WINDOW_WORK_DONE_PROGRESS_CREATE)
        def _create(params):
            return None

        @c.feature(types.PROGRESS)
        def _progress(params):
            self.progress.append(params)

    def on_log(self, params: types.LogMessageParams) -> None:
        self.logs.append(params)

    def on_ready(self, params: dict) -> None:
        self.ready.append(params)

    async def _wait(self, aw, timeout: float = 90):
        """Any answer within timeout, or a failure that shows the server's log (never a hung test)."""
        try:
            return await asyncio.wait_for(aw, timeout)
        except asyncio.TimeoutError:
            raise AssertionError(f"no answer in {timeout} s; server log:\n{self.server_log()[-3000:]}")

    async def stats(self, last: int = 50) -> dict:
        return await super().stats(last)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    from testmodels.tiny import make_tiny_model_dir

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
    """Start servers one after another (a daemon restart); each gets a folder of its own for its logs (and
    `env`, more environment variables for it)."""
    started: list[Session] = []

    async def start(env: dict | None = None) -> Session:
        folder = tmp_path / f"server-{len(started)}"
        folder.mkdir()
        s = Session(folder)
        await s.start(env={"REST_LSP_CACHE": str(shared_cache), **(env or {})})
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
    from testmodels.tiny import make_tiny_codellama_dir

    return make_tiny_codellama_dir(tmp_path_factory.mktemp("tiny-codellama") / "model")
