"""The embedded default model over LSP, and the one-shot `rest-lsp complete` command."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "inventory.py"


@pytest.mark.embedded
async def test_embedded_model_completes_python(user_cache_session, tmp_path):
    s = user_cache_session
    # no "model" option: the embedded Qwen2.5-Coder-0.5B (converted once into the user cache)
    await s.initialize({"maxTokens": 24, "timeBudgetMs": 0, "promptBudgetMs": 0, "predictBudgetMs": 0,
                        "indexWorkspace": False})  # no budget: the first line whatever the CPU's speed
    uri = (tmp_path / "fib.py").as_uri()
    s.open(uri, 'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n    \n\n\nprint(fibonacci(10))\n')
    r = await s._wait(s.client.text_document_inline_completion_async(s.inline_params(uri, 2, 4)), 600)
    st = await s.stats()
    assert st["model"]["name"].startswith("Qwen2.5-Coder"), st["model"]
    assert r.items, st["recent"]
    code = r.items[0].insert_text
    assert any(w in code for w in ("return", "if n", "fibonacci", "a, b")), code


def run_cli(*args, timeout=300, **kw):
    return subprocess.run([sys.executable, "-m", "rest_lsp.cli", *args], capture_output=True, text=True,
                          timeout=timeout, **kw)


def test_complete_one_shot_json_compare(tiny_model, tmp_path, shared_cache):
    ws = tmp_path / "ws"
    ws.mkdir()
    target = ws / "inventory.py"
    shutil.copy(EXAMPLE, target)
    line = EXAMPLE.read_text().splitlines().index("    def total_value(self) -> float:") + 2
    env = {**__import__("os").environ, "REST_LSP_CACHE": str(shared_cache), "TRANSFORMERS_VERBOSITY": "error"}
    p = run_cli("complete", f"{target}:{line}:9", "--model", str(tiny_model), "--workspace", str(ws),
                "--cache-dir", str(tmp_path / "cache"), "--max-tokens", "16", "--json", "--compare", env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout)
    assert out["line"] == line and out["column"] == 9 and out["mode"] == "multi"
    f = out["figures"]
    assert f["tokens"] > 0 and f["steps"] > 0 and f["time_ms"] > 0
    assert out["workspace"]["state"] == "ready" and out["workspace"]["detail"]["documents"] >= 1
    # greedy REST decoding is exact: plain decoding of the same prompt gives the same text
    assert out["plain"]["same_text"] is True and out["plain"]["tokens"] == f["tokens"]
    assert not (tmp_path / "cache" / "history").exists()  # one-shot runs start cold and leave no history
    # bad input: a clear message and status 2, no traceback
    bad = run_cli("complete", f"{target}:9999:1", "--model", str(tiny_model), env=env)
    assert bad.returncode == 2 and "past the end" in bad.stderr and "Traceback" not in bad.stderr
    bad = run_cli("complete", "no-colons-here", env=env)
    assert bad.returncode == 2 and "PATH:LINE:COL" in bad.stderr


def test_cli_arguments():
    p = run_cli("--stdio", "--tcp", timeout=60)
    assert p.returncode == 2 and "not allowed with" in p.stderr
    p = run_cli("--help", timeout=60)
    assert p.returncode == 0 and "complete" in p.stdout and "--tcp" in p.stdout
