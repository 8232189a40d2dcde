"""The service's rules without a server process: prompt shaping, the completion cache, the worker's
supersession and cancellation, configuration. A fake backend stands in for the model here only; the e2e
tests run the real engine."""
from __future__ import annotations

import asyncio
import threading
import time

import pytest

from rest_lsp.service.cache import CompletionCache
from rest_lsp.service.config import ServerConfig, merge
from rest_lsp.service.core import Attempt, CompletionRequest, CompletionService, ServiceError
from rest_lsp.service.prompt import PositionError, Selected, build_context, shape_completion
from rest_lsp.service.worker import InferenceWorker, JobAborted


# ---- prompt rules -------------------------------------------------------------------------------
def test_single_vs_multi_line_rules():
    text = "def f(x):\n    \n    y = g(x)\n"
    assert build_context(text, 1, 4).multiline                  # empty line
    assert build_context(text, 0, 9).multiline                  # right after a block opener
    assert not build_context(text, 2, 10).multiline             # code follows the cursor: "(x)"
    assert not build_context("x = foo", 0, 7).multiline         # end of an ordinary line
    assert build_context("call(", 0, 5).multiline               # after "(" with nothing following
    assert not build_context("if (a) {}", 0, 8).multiline       # a closer follows the cursor


def test_fim_prefix_suffix_and_positions():
    ctx = build_context("ab\ncd\r\nef", 1, 1)
    assert (ctx.prefix, ctx.suffix) == ("ab\nc", "d\r\nef")
    assert build_context("ab\ncd\r\nef", 1, 99).prefix == "ab\ncd"    # past the line's end: its end
    with pytest.raises(PositionError, match="past the end"):
        build_context("ab\n", 5, 0)
    with pytest.raises(PositionError):
        build_context("ab", 0, -1)


def test_prompt_window_is_stable_while_typing():
    body = "".join(f"line {i} of text\n" for i in range(2000))
    a = build_context(body, 1500, 0).prompt_prefix(6000)
    b = build_context(body + "", 1500, 3).prompt_prefix(6000)
    assert len(a) <= 6000 and a.startswith("line ")
    assert a[:100] == b[:100]          # same start: the KV cache of the shared prefix stays usable


def test_selected_completion_is_applied_and_kept():
    ctx = build_context("x = os.pa", 0, 9, Selected((0, 7), (0, 9), "path"))
    assert ctx.prefix == "x = os.path" and ctx.lead == "path" and ctx.range_start == (0, 7)
    with pytest.raises(PositionError):
        build_context("x = os.pa", 0, 5, Selected((0, 7), (0, 9), "path"))


def test_shaping():
    single = build_context("y = f(", 0, 6)
    single_after = build_context("y = f()", 0, 6)
    assert shape_completion("a, b)\nmore", single_after, max_lines=8, truncated=False) == "a, b"
    multi = build_context("def f():\n    \n    return 1\n", 1, 4)
    out = shape_completion("x = 1\n    y = 2\n    return 1\n    z", multi, max_lines=8, truncated=False)
    assert out == "x = 1\n    y = 2"                         # stops before repeating the suffix's line
    assert shape_completion("a\n    b\n    c\n    d", multi, max_lines=2, truncated=False) == "a\n    b"
    assert shape_completion("x = 1\n    y = 2\n    z = sq", multi, max_lines=8, truncated=True) == \
        "x = 1\n    y = 2"                                   # time budget: cut back to a line boundary
    assert shape_completion("value_one + valu", build_context("x = ", 0, 4), max_lines=8, truncated=True) \
        == "value_one +"
    assert shape_completion("ok\x00\x01garbage", single, max_lines=8, truncated=False) == "ok"
    assert single is not None


# ---- completion cache ---------------------------------------------------------------------------
def test_completion_cache_typing_and_backspace():
    c = CompletionCache()
    c.put("u", "total = su", "\n", "m(values)")
    assert c.get("u", "total = sum", "\n") == "(values)"
    assert c.get("u", "total = sum(v", "\n") == "alues)"
    assert c.get("u", "total = sum(values)", "\n") is None       # nothing left to suggest
    assert c.get("u", "total = sux", "\n") is None               # typed something else
    assert c.get("u", "total = sum", "different suffix") is None
    assert c.get("u", "total = s", "\n") == "um(values)"         # backspace
    assert c.get("other", "total = sum", "\n") is None


# ---- configuration ------------------------------------------------------------------------------
def test_config_merge_camel_case_sections_and_errors():
    cfg, changed, problems = merge(ServerConfig(), {"rest-lsp": {"maxTokens": 10, "timeBudgetMs": 0,
                                                                 "languages": "python", "bogus": 1,
                                                                 "precision": "fp64"}})
    assert cfg.max_tokens == 10 and cfg.time_budget_ms == 0 and cfg.languages == ["python"]
    assert changed == {"max_tokens", "time_budget_ms", "languages"}
    assert any("bogus" in p for p in problems) and any("precision" in p for p in problems)
    cfg2, changed2, _ = merge(cfg, {"max_tokens": -1})
    assert cfg2.max_tokens == 10 and not changed2


# ---- worker and service with a controllable backend --------------------------------------------
class SlowBackend:
    """Emits one character per step, checking should_stop between steps like the engine does."""
    name = "slow"

    def __init__(self, step_s: float = 0.01, text: str = "abcdefghij" * 50):
        self.step_s, self.text = step_s, text
        self.calls = 0
        self.steps_run: list[int] = []

    def generate(self, ctx, config, *, time_budget_s, should_stop, temperature=0.0, seed=None,
                 use_retrieval=True):
        self.calls += 1
        t0 = time.perf_counter()
        out, reason = "", "max_tokens"
        for i in range(min(config.max_tokens, len(self.text))):
            if should_stop():
                reason = "cancelled"
                break
            if time_budget_s is not None and time.perf_counter() - t0 > time_budget_s:
                reason = "time"
                break
            time.sleep(self.step_s)
            out += self.text[i]
        self.steps_run.append(len(out))
        return Attempt(out, reason, len(out), len(out), [1] * len(out), 0.0, 0.0, 0.0, 0.0)

    def describe(self):
        return {"name": self.name}


def make_service(backend, **cfg) -> CompletionService:
    svc = CompletionService(ServerConfig(**{"time_budget_ms": 0, **cfg}), lambda c, r: backend)
    svc.start()
    assert svc.worker.wait_loaded(10)
    return svc


async def test_supersession_without_cancel_and_cancellation():
    backend = SlowBackend(step_s=0.01)
    svc = make_service(backend, max_tokens=400, max_lines=1000)
    try:
        req = CompletionRequest("file:///a.py", "def f():\n    \n", 1, 4)
        older = asyncio.ensure_future(svc.complete(req))
        await asyncio.sleep(0.2)
        newer = asyncio.ensure_future(svc.complete(CompletionRequest("file:///a.py", "def f():\n    \n", 1, 4)))
        r_old = await older
        assert r_old.items == [] and r_old.record["outcome"] == "superseded"
        await asyncio.sleep(0.2)
        newer.cancel()
        with pytest.raises(asyncio.CancelledError):
            await newer
        for _ in range(100):
            if svc.stats.totals["wasted_steps"] >= 2 and not svc.worker.snapshot()["running"]:
                break
            await asyncio.sleep(0.02)
        assert backend.steps_run and all(n < 400 for n in backend.steps_run)   # both stopped early
        t = svc.stats.snapshot()["totals"]
        assert t["superseded"] == 1 and t["cancelled"] == 1
    finally:
        svc.close()


async def test_time_budget_returns_text_cut_at_a_line():
    backend = SlowBackend(step_s=0.005, text="x = 1\n    y = 2\n    zzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzz")
    svc = make_service(backend, max_tokens=400, time_budget_ms=120)
    try:
        r = await svc.complete(CompletionRequest("file:///b.py", "def f():\n    \n", 1, 4))
        assert r.record["stop_reason"] == "time"
        assert r.items and "\n" in backend.text and not r.items[0].text.endswith("z")
        assert r.items[0].text in ("x = 1", "x = 1\n    y = 2")
    finally:
        svc.close()


async def test_cache_answers_without_a_model_call_and_errors_are_clear():
    backend = SlowBackend(step_s=0.0, text="m(values)")
    svc = make_service(backend, max_tokens=50)
    try:
        r = await svc.complete(CompletionRequest("file:///c.py", "total = su\n", 0, 10))
        assert r.items[0].text == "m(values)" and backend.calls == 1
        r = await svc.complete(CompletionRequest("file:///c.py", "total = sum(\n", 0, 12))
        assert r.items[0].text == "values)" and r.record["outcome"] == "cache" and backend.calls == 1
        with pytest.raises(ServiceError) as e:
            await svc.complete(CompletionRequest("file:///c.py", "x", 3, 0))
        assert e.value.code == "invalid_params"
    finally:
        svc.close()


async def test_model_load_failure_is_reported_and_recoverable():
    def factory(cfg, repo):
        if cfg.model == "broken":
            raise OSError("weights are missing")
        return SlowBackend(step_s=0.0, text="ok")

    svc = CompletionService(ServerConfig(model="broken"), factory)
    svc.start()
    svc.worker.wait_loaded(10)
    try:
        with pytest.raises(ServiceError) as e:
            await svc.complete(CompletionRequest("file:///d.py", "x = ", 0, 4))
        assert e.value.code == "model_unavailable" and "weights are missing" in str(e.value)
        svc.configure({"model": "fixed"})
        svc.worker.wait_loaded(10)
        r = await svc.complete(CompletionRequest("file:///d.py", "x = ", 0, 4))
        assert r.items[0].text == "ok"
    finally:
        svc.close()


def test_bounded_queue_drops_the_oldest():
    gate = threading.Event()
    w = InferenceWorker(queue_size=2)
    w.load(lambda: object())
    assert w.wait_loaded(5)
    blocker = w.submit("busy", lambda b, stop: gate.wait(5))
    time.sleep(0.05)
    jobs = [w.submit(f"doc{i}", lambda b, stop: "done") for i in range(3)]
    with pytest.raises(JobAborted) as e:
        jobs[0].future.result(1)
    assert e.value.reason == "dropped"
    gate.set()
    assert [j.future.result(5) for j in jobs[1:]] == ["done", "done"]
    assert blocker.future.result(5) is True
    w.close()


async def test_request_log_writes_one_json_line_per_request(tmp_path):
    import json

    log = tmp_path / "requests.jsonl"
    svc = make_service(SlowBackend(step_s=0.0, text="pass"), max_tokens=10, request_log=str(log))
    try:
        await svc.complete(CompletionRequest("file:///e.py", "def f():\n    \n", 1, 4))
        rows = [json.loads(line) for line in log.read_text().splitlines()]
        assert len(rows) == 1 and rows[0]["outcome"] == "completed" and rows[0]["mode"] == "multi"
    finally:
        svc.close()


def test_documented_options_match_the_defaults():
    """docs/daemon.md's configuration table lists every option with its real default."""
    import json
    from pathlib import Path

    from rest_lsp.service.config import describe

    doc = (Path(__file__).resolve().parents[2] / "docs" / "daemon.md").read_text()
    rows = {}
    for line in doc.splitlines():
        parts = [p.strip() for p in line.split("|")]
        if len(parts) > 3 and parts[1].startswith("`") and parts[2].startswith("`"):
            rows[parts[1].strip("`")] = json.loads(parts[2].strip("`"))
    assert rows == {name: default for name, default in describe()}


def test_multi_line_stops_where_the_block_ends():
    ctx = build_context("class A:\n    def total(self):\n        \n\n    def other(self):\n        pass\n", 2, 8)
    text = "return sum(self.items)\n\n\ndef main():\n    a = A()"
    assert shape_completion(text, ctx, max_lines=8, truncated=False) == "return sum(self.items)"
    opener = build_context("def f(x):", 0, 9)
    body = "\n    if x:\n        return 1\n    return 2\nprint(f(3))"
    assert shape_completion(body, opener, max_lines=8, truncated=False) == \
        "\n    if x:\n        return 1\n    return 2"


def test_decoding_stops_where_the_block_ends():
    """block_end_cut is the engine's stop_fn for multi-line requests: it must agree with the shaping rule and
    fire only once a later line's indentation is known."""
    from rest_lsp.service.prompt import block_end_cut

    ctx = build_context("class A:\n    def total(self):\n        \n\n    def other(self):\n        pass\n", 2, 8)
    indent = ctx.block_indent()
    assert indent == 8
    assert block_end_cut("return sum(self.items)\n\n    ", indent) is None     # the next line is not known yet
    text = "return sum(self.items)\n\n    def more(self):"
    cut = block_end_cut(text, indent)
    assert text[:cut] == "return sum(self.items)\n\n"
    assert shape_completion(text, ctx, max_lines=8, truncated=False) == "return sum(self.items)"
    assert build_context("def f(x):", 0, 9).block_indent() == 1                 # after an opener: deeper
