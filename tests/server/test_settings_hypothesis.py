"""No setting value turns completions into internal errors: random settings, sent as a client sends them
(camelCase, any JSON value), each either refused at the door (a problem that names it, the old value kept) or
taken, clamped with a problem where the model cannot serve it as given; then a completion, Automatic and
Invoked, answers without an error. In-process, the real engine with the tiny model."""
from __future__ import annotations

import asyncio

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from rest_lsp.service.config import ServerConfig, describe
from rest_lsp.service.core import CompletionRequest, CompletionService

# the model, its device and precision, and the paths: a reload per example, and the subject of settings that
# name paths (refused from clients unless allowed); the rest is fuzzed
NOT_FUZZED = {"model", "device", "precision", "corpus", "cache_dir", "request_log", "persist_history", "kv_cache_mb"}
FUZZED = [name for name, _ in describe() if name not in NOT_FUZZED]
TEXT = "import os\n\n\ndef read_config(path):\n    with open(path) as f:\n        \n"


def camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(w.title() for w in rest)


ANY = st.one_of(
    st.integers(-3, 20), st.integers(0, 10**6), st.sampled_from([2**31, 10**12, 10**30]),
    st.none(), st.booleans(), st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=6),
    st.sampled_from(["auto", "line", "psm", "spm", "python", "**/*.py"]), st.lists(st.text(max_size=4), max_size=3))


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from testmodels.tiny import make_tiny_model_dir

    tmp = tmp_path_factory.mktemp("settings")
    problems: list[str] = []
    base = ServerConfig(model=str(make_tiny_model_dir(tmp / "model")), device="cpu", precision="fp32",
                        cache_dir=str(tmp / "cache"), persist_history=False, index_workspace=False)
    svc = CompletionService(base, notify=lambda level, msg: problems.append(msg))
    svc.start()
    assert svc.worker.wait_loaded(300) and svc.worker.backend is not None, svc.worker.error
    loop = asyncio.new_event_loop()
    yield svc, loop, {camel(n): getattr(base, n) for n in FUZZED}
    svc.close()
    loop.close()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(values=st.dictionaries(st.sampled_from(FUZZED), ANY, min_size=1, max_size=4))
@example(values={"max_tokens": 100_000})   # was clamped to the context, leaving no room for a prompt: -32603
@example(values={"alternatives": 10**6, "time_budget_ms": 0})   # an Invoked request that never answers
@example(values={"draft_budget": float("inf"), "max_tokens": float("nan")})   # were an OverflowError, a nameless problem
@example(values={"max_lines": 0, "max_prefix_chars": 0, "max_suffix_chars": 0, "middle_lines": 10**6})
@example(values={"draft_budget": 0, "max_tokens": None, "max_lines": None, "server": ""})  # "" is no team server
def test_any_setting_is_refused_or_served(served, values):
    svc, loop, defaults = served
    _, problems = svc.configure(defaults)
    assert problems == []
    before = svc.config
    _, problems = svc.configure({"restLsp": {camel(n): v for n, v in values.items()}})
    for name, value in values.items():
        said = [p for p in problems if name in p or camel(name) in p]
        now = getattr(svc.config, name)
        if not said:   # taken as given (a string for a list setting is a list of one; `server`: "" is none)
            taken = (None,) if (name, value) == ("server", "") else (value, [value])
            assert now in taken, (name, value, now, problems)
        else:          # refused, the old value kept; taken with a warning; or a number clamped down to fit
            assert now in (getattr(before, name), value) or (
                isinstance(now, int) and isinstance(value, (int, float)) and now < value), (name, value, now)
    for automatic in (True, False):
        req = CompletionRequest("file:///w/c.py", TEXT, 5, 8, automatic=automatic, language="python")
        resp = loop.run_until_complete(asyncio.wait_for(svc.complete(req), 120))
        assert resp.record["outcome"] not in ("error",), resp.record
