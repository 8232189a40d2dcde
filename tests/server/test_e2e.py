"""End to end over stdio: a real server process, the tiny model, pygls' client."""
from __future__ import annotations

import asyncio

import pytest
from lsprotocol import types
from pygls.exceptions import JsonRpcException

SOURCE = '''import os


def read_config(path):
    """Read a config file."""
    with open(path) as f:
        return f.read()


def main():
    
'''


async def wait_ready(s, timeout=60):
    for _ in range(int(timeout * 10)):
        st = await s.stats()
        if st["model"]["state"] in ("ready", "failed"):
            return st
        await asyncio.sleep(0.1)
    raise AssertionError("model never loaded")


async def test_inline_completion_tiny_model(session, tiny_model, tmp_path):
    result = await session.initialize({"model": str(tiny_model), "timeBudgetMs": 0, "maxTokens": 24,
                                       "cacheDir": str(tmp_path / "cache")})
    assert result.capabilities.inline_completion_provider is not None
    assert result.capabilities.text_document_sync.change == types.TextDocumentSyncKind.Incremental
    uri = (tmp_path / "demo.py").as_uri()
    session.open(uri, SOURCE)
    # multi-line at the empty line inside main(); single line where code follows the cursor
    multi = await session.complete(uri, 10, 4, invoked=True)
    assert multi.items, session.server_log()
    item = multi.items[0]
    assert item.range.start == types.Position(10, 4) and item.range.end == types.Position(10, 4)
    assert len(multi.items) <= 2
    single = await session.complete(uri, 5, 14)            # inside "with open(path) as f:"
    assert all("\n" not in i.insert_text for i in single.items)
    st = await session.stats()
    recent = st["recent"]
    assert [r["mode"] for r in recent[-2:]] == ["multi", "single"]
    assert recent[-2]["trigger"] == "invoked" and recent[-1]["trigger"] == "automatic"
    assert st["totals"]["model_calls"] == 2
    assert recent[-2]["tokens"] > 0 and recent[-2]["steps"] > 0
    assert st["model"]["state"] == "ready" and st["model"]["name"]
