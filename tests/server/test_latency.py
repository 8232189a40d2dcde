"""Latency-first serving with a controllable backend: predictions reused while typing (no model call),
warm-ups pre-empted by completions, prompt and predict budgets, requests made while the model loads, the
prediction as if the shown suggestion were accepted, the worker's queue. The engine's own exactness is in
tests/engine; the e2e tests run the real model over stdio."""
from __future__ import annotations

import asyncio
import threading
import time

import pytest

from rest_lsp.service.config import ModelLimits, ServerConfig
from rest_lsp.service.answering import wait_for_event
from rest_lsp.service.core import CompletionRequest, CompletionService, ServiceError
from rest_lsp.service.prediction import Prediction, answer
from rest_lsp.service.prompt import build_context
from rest_lsp.service.stats import Stats
from rest_lsp.service.worker import AHEAD, INTERACTIVE, WARM, InferenceWorker, Job, JobAborted


class FakeRun:
    def __init__(self, key, text, purpose, prefill_steps, max_chars):
        self.key, self.purpose = key, purpose
        self.full = text[:max_chars] if purpose != "warm" else ""
        self.prefill_left = prefill_steps
        self.text, self.done, self.prefilled, self.stop_reason = "", False, False, None
        self.steps = 0


class FakeBackend:
    """Each advance is one 'forward' of step_s seconds: `prefill_steps` of them for the prompt, then one
    character of the answer (`respond(ctx)`) per step. Logs every forward as (purpose, key)."""

    name = "fake"

    def __init__(self, respond=lambda ctx: "abcdefghij", step_s=0.01, prefill_steps=1):
        self.respond, self.step_s, self.prefill_steps = respond, step_s, prefill_steps
        self.forwards: list[tuple[str, str]] = []
        self.starts: list[tuple[str, str]] = []
        self.interrupted: list[tuple[str, str]] = []  # steps stopped midway by their interrupt
        self.lock = threading.Lock()

    def start(self, key, ctx, config, *, purpose="predict", temperature=0.0, seed=None, anchor=None, repo=None):
        with self.lock:
            self.starts.append((purpose, ctx.prefix))
        text = self.respond(ctx) if purpose != "sample" else f"sampled {seed}"
        return FakeRun(key, text, purpose, self.prefill_steps, config.max_tokens)

    def advance(self, run, interrupt=None):
        """Honours `interrupt` as the engine does in a decoding step: polled during the step, true ends it with
        nothing done."""
        end = time.monotonic() + self.step_s
        while time.monotonic() < end:
            if interrupt is not None and interrupt():
                with self.lock:
                    self.interrupted.append((run.purpose, run.key))
                return
            time.sleep(min(0.005, max(0.0, end - time.monotonic())))
        with self.lock:
            self.forwards.append((run.purpose, run.key))
        run.steps += 1
        if run.prefill_left:
            run.prefill_left -= 1
            if run.prefill_left:
                return
            run.prefilled = True
            if run.purpose == "warm":
                run.done, run.stop_reason = True, "max_tokens"
        if not run.done:
            run.text = run.full[: len(run.text) + 1]
            if len(run.text) == len(run.full):
                run.done, run.stop_reason = True, "eos"

    def stop(self, run, reason):
        if not run.done:
            run.done, run.stop_reason = True, reason

    def figures(self, run):
        return {"tokens": len(run.text), "steps": run.steps, "stop_reason": run.stop_reason if run.done else None,
                "computed_tokens": 0, "forwards": run.steps}

    def limits(self):
        return ModelLimits(context=None)

    def describe(self):
        return {"name": self.name}


def make_service(backend, **cfg) -> CompletionService:
    base = {"time_budget_ms": 0, "prompt_budget_ms": 0, "predict_budget_ms": 0}
    svc = CompletionService(ServerConfig(**{**base, **cfg}), lambda c, r: backend)
    svc.start()
    assert svc.worker.wait_loaded(10)
    return svc


def req(uri, text, line=None, col=None, automatic=True):
    if line is None:
        line = text.count("\n") if not text.endswith("\n") else text.count("\n") - 1
        col = len(text.split("\n")[line])
    return CompletionRequest(uri, text, line, col, automatic=automatic)


# ---- predictions reused while typing -------------------------------------------------------------
async def test_typing_what_was_suggested_is_answered_without_the_model():
    backend = FakeBackend(respond=lambda ctx: "m(values)\n", step_s=0.0)
    # no prediction as if accepted: it starts once the shown one ends, racing the count of starts below
    # (one CI run in about 20 had it start before the last assert)
    svc = make_service(backend, max_tokens=50, predict_ahead=False)
    try:
        r = await svc.complete(req("file:///c.py", "total = su"))
        assert r.items[0].text == "m(values)" and r.record["outcome"] == "completed"
        assert len(backend.starts) == 1
        r = await svc.complete(req("file:///c.py", "total = sum(v"))
        # the prediction may still be decoding past the newline (the worker thread races this coroutine):
        # "reused" then, "cache" once it is done; never a model call
        assert r.items[0].text == "alues)" and r.record["outcome"] in ("cache", "reused")
        assert not r.record["model_call"]
        r = await svc.complete(req("file:///c.py", "total = s"))  # deleted back
        assert r.items[0].text == "um(values)" and r.record["outcome"] in ("cache", "reused")
        assert not r.record["model_call"]
        assert [p for p, _ in backend.starts].count("predict") == 1
        r = await svc.complete(req("file:///c.py", "total = sux"))  # typed something else: a new prediction
        assert r.record["outcome"] == "completed" and [p for p, _ in backend.starts].count("predict") == 2
        with pytest.raises(ServiceError) as e:
            await svc.complete(CompletionRequest("file:///c.py", "x", 3, 0))
        assert e.value.code == "invalid_params"
    finally:
        svc.close()


async def test_a_cancelled_request_leaves_its_prediction_decoding_for_the_next_pause():
    backend = FakeBackend(respond=lambda ctx: "alpha_beta_gamma(1)\n", step_s=0.02)
    svc = make_service(backend, max_tokens=100)
    try:
        first = asyncio.ensure_future(svc.complete(req("file:///a.py", "x = ")))
        await asyncio.sleep(0.12)  # a few characters decided
        first.cancel()  # the next key arrived (VS Code cancels)
        with pytest.raises(asyncio.CancelledError):
            await first
        svc.document_changed("file:///a.py", "x = al", 0, 6)  # the key the model predicted
        r = await svc.complete(req("file:///a.py", "x = al"))
        assert r.items[0].text == "pha_beta_gamma(1)" and r.record["outcome"] in ("reused", "cache")
        assert [p for p, _ in backend.starts] == ["predict"]  # no warm-up, no second prediction
        t = svc.stats.snapshot()["totals"]
        assert t["cancelled"] == 1 and t["model_calls"] == 1
    finally:
        svc.close()


async def test_a_cancellation_that_comes_with_a_decoding_step_is_not_lost():
    # The waits between steps end when the prediction decodes a step; a cancellation in the same turn of the
    # event loop as that step must still cancel the request (Python 3.11's asyncio.wait_for returned the
    # step instead: the cancelled request waited for the whole prediction and was answered normally, CI)
    step = asyncio.Event()
    wait = asyncio.ensure_future(wait_for_event(step, 10.0))
    await asyncio.sleep(0)  # waiting for the step
    step.set()
    wait.cancel()
    with pytest.raises(asyncio.CancelledError):
        await wait


@pytest.mark.parametrize("typing", [True, False])
async def test_an_edit_that_contradicts_a_prediction_stops_it_and_warms_the_new_place(typing):
    backend = FakeBackend(respond=lambda ctx: "abcdefghijklmnopqrstuvwxyz", step_s=0.02)
    svc = make_service(backend, max_tokens=100, predict_while_typing=typing)
    try:
        first = asyncio.ensure_future(svc.complete(req("file:///a.py", "x = ")))
        await asyncio.sleep(0.1)
        first.cancel()
        svc.document_changed("file:///a.py", "x = Q", 0, 5)  # not what the model said
        await asyncio.sleep(0.15)
        pred = next(p for p in svc.predictions.of("file:///a.py") if p.prefix == "x = ")
        assert pred.done and pred.aborted == "stale" and len(pred.text) < 26
        # the new place: its prompt computed (and, typing, decoding on from there)
        assert ("typing" if typing else "warm", "x = Q") in backend.starts
    finally:
        svc.close()


async def test_an_edit_that_makes_a_prediction_moot_ends_its_step_in_flight():
    """A step far longer than the test: the contradicting key's prediction starts once the stale prediction's
    step is interrupted (the engine stops a forward between layers), not after the step."""
    backend = FakeBackend(respond=lambda ctx: "abcdefghijklmnopqrstuvwxyz", step_s=30.0)
    svc = make_service(backend, max_tokens=100, predict_while_typing=True)
    try:
        first = asyncio.ensure_future(svc.complete(req("file:///a.py", "x = ")))
        while not backend.starts:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)  # in its first step
        first.cancel()
        svc.document_changed("file:///a.py", "x = Q", 0, 5)  # not what the model said
        for _ in range(500):
            if ("typing", "x = Q") in backend.starts:
                break
            await asyncio.sleep(0.01)
        assert ("typing", "x = Q") in backend.starts and backend.forwards == []  # no step ran to its end
        assert backend.interrupted == [("predict", "file:///a.py")]
        pred = next(p for p in svc.predictions.of("file:///a.py") if p.prefix == "x = ")
        assert pred.done and pred.aborted == "stale" and pred.text == ""
    finally:
        svc.close()


async def test_the_next_pause_is_answered_from_what_was_decoded_since_the_key():
    backend = FakeBackend(respond=lambda ctx: "len(items)\n", step_s=0.01)
    # predictions as if accepted left out: they would race the lists of starts below
    svc = make_service(backend, max_tokens=50, predict_budget_ms=100, predict_ahead=False)
    try:
        svc.document_changed("file:///k.py", "n = ", 0, 4)  # a key; the client's debounce runs
        await asyncio.sleep(0.3)
        r = await svc.complete(req("file:///k.py", "n = "))
        assert r.items[0].text == "len(items)" and r.record["outcome"] in ("reused", "cache")
        assert not r.record["model_call"] and r.record["latency_ms"] < 100
        assert [p for p, _ in backend.starts] == ["typing"]
        svc.document_changed("file:///k.py", "n = le", 0, 6)  # typed what it says: nothing new to compute
        svc.document_changed("file:///k.py", "n = lex", 0, 7)  # not what it says: a new prediction there
        await asyncio.sleep(0.1)
        assert [p for p, _ in backend.starts] == ["typing", "typing"]
        assert svc.stats.snapshot()["totals"]["typing_predictions"] == 2
    finally:
        svc.close()


async def test_a_request_raises_the_prediction_a_key_started_above_other_work():
    backend = FakeBackend(respond=lambda ctx: "value\n", step_s=0.02, prefill_steps=5)
    svc = make_service(backend, max_tokens=20, predict_ahead=False)  # v.py's forwards end with its answer
    try:
        svc.document_changed("file:///w.py", "a = 1\nb = ", 1, 4)  # decoding at low priority ...
        svc.document_changed("file:///v.py", "c = ", 0, 4)  # ... next to another document's
        await asyncio.sleep(0.03)
        r = await svc.complete(req("file:///v.py", "c = "))
        assert r.items[0].text == "value" and r.record["outcome"] == "reused"
        order = [k for _, k in backend.forwards]
        first_v = order.index("file:///v.py")
        done_v = len(order) - 1 - order[::-1].index("file:///v.py")
        # once the request came, the other document's forwards waited until this one's were done
        assert "file:///w.py" not in order[first_v + 2:done_v], order
    finally:
        svc.close()


async def test_a_newer_request_supersedes_an_older_one_that_nobody_cancelled():
    backend = FakeBackend(respond=lambda ctx: "z" * 200, step_s=0.01)
    svc = make_service(backend, max_tokens=400, max_lines=1000)
    try:
        older = asyncio.ensure_future(svc.complete(req("file:///a.py", "def f():\n    \n", 1, 4)))
        await asyncio.sleep(0.1)
        newer = asyncio.ensure_future(svc.complete(req("file:///a.py", "def g():\n    \n", 1, 4)))
        r_old = await older
        assert r_old.items == [] and r_old.record["outcome"] == "superseded"
        r_new = await newer
        assert r_new.items and r_new.items[0].text == "z" * 200
        assert svc.stats.snapshot()["totals"]["superseded"] == 1
    finally:
        svc.close()


# ---- warm-ups --------------------------------------------------------------------------------------
async def test_a_completion_pre_empts_a_warm_up_at_its_next_forward_and_the_warm_up_resumes():
    backend = FakeBackend(respond=lambda ctx: "ok\n", step_s=0.02, prefill_steps=10)
    svc = make_service(backend, max_tokens=10, predict_while_typing=False)
    try:
        svc.document_changed("file:///w.py", "a = 1\nb = ", 1, 4)  # warm b
        await asyncio.sleep(0.07)  # a few warm chunks done
        r = await svc.complete(req("file:///other.py", "c = "))
        assert r.items[0].text == "ok"
        for _ in range(100):
            if not svc.worker.jobs():
                break
            await asyncio.sleep(0.02)
        order = [p for p, _ in backend.forwards]
        first_predict = order.index("predict")
        # the prediction's forwards ran back to back once it arrived; the warm-up finished afterwards
        assert "warm" in order[:first_predict] and "warm" in order[first_predict:]
        run = order[first_predict:first_predict + 13]
        assert run.count("predict") >= 12, order
        assert order.count("warm") == 10  # nothing the warm-up computed was lost
    finally:
        svc.close()


@pytest.mark.parametrize("typing", [True, False])
async def test_a_prediction_that_covers_the_cursor_needs_no_warm_up(typing):
    backend = FakeBackend(respond=lambda ctx: "bcdef\n", step_s=0.0)
    # no prediction as if accepted: whether it starts races the answer (it would be one more "predict")
    svc = make_service(backend, max_tokens=10, predict_while_typing=typing, predict_ahead=False)
    try:
        await svc.complete(req("file:///p.py", "x = a"))
        svc.document_changed("file:///p.py", "x = ab", 0, 6)  # typed what was shown
        await asyncio.sleep(0.05)
        assert [p for p, _ in backend.starts] == ["predict"]
        svc.document_changed("file:///p.py", "x = aZ", 0, 6)
        await asyncio.sleep(0.05)
        assert [p for p, _ in backend.starts] == ["predict", "typing" if typing else "warm"]
    finally:
        svc.close()


# ---- budgets -------------------------------------------------------------------------------------
async def test_prompt_budget_answers_empty_and_the_prompt_goes_on_for_the_next_request():
    backend = FakeBackend(respond=lambda ctx: "value\n", step_s=0.03, prefill_steps=8)  # a 0.24 s prompt
    svc = make_service(backend, max_tokens=20, prompt_budget_ms=100, time_budget_ms=2000)
    try:
        r = await svc.complete(req("file:///b.py", "y = "))
        assert r.items == [] and r.record["answer"] == "prompt_budget" and r.record["latency_ms"] < 230
        await asyncio.sleep(0.3)
        r = await svc.complete(req("file:///b.py", "y = "))
        assert r.items[0].text == "value" and r.record["outcome"] in ("reused", "cache")
        assert [p for p, _ in backend.starts] == ["predict"]
    finally:
        svc.close()


async def test_an_empty_answer_for_want_of_time_is_followed_by_on_ready_once_the_suggestion_is_decided():
    backend = FakeBackend(respond=lambda ctx: "value\n", step_s=0.03, prefill_steps=8)  # a 0.24 s prompt
    svc = make_service(backend, max_tokens=20, prompt_budget_ms=50, time_budget_ms=2000)
    ready: list[tuple[CompletionRequest, float]] = []
    svc.on_ready = lambda r: ready.append((r, time.perf_counter()))
    try:
        asked = req("file:///b.py", "y = ")
        r = await svc.complete(asked)
        assert r.items == [] and r.record["answer"] == "prompt_budget" and r.record["watched"]
        assert ready == []   # nothing decided yet
        for _ in range(100):
            if ready:
                break
            await asyncio.sleep(0.01)
        assert [x[0] for x in ready] == [asked]
        r = await svc.complete(req("file:///b.py", "y = "))  # the client asks again: the prediction answers
        assert r.items[0].text == "value" and r.record["outcome"] in ("reused", "cache")
        assert [p for p, _ in backend.starts] == ["predict"] and svc.stats.totals["ready_notices"] == 1
    finally:
        svc.close()


async def test_a_newer_request_or_a_contradicting_edit_ends_the_watch_without_on_ready():
    backend = FakeBackend(respond=lambda ctx: "value\n", step_s=0.03, prefill_steps=8)
    svc = make_service(backend, max_tokens=20, prompt_budget_ms=50, time_budget_ms=2000)
    ready: list[CompletionRequest] = []
    svc.on_ready = ready.append
    try:
        r = await svc.complete(req("file:///w.py", "y = "))
        assert r.record["watched"]
        # a newer request of the document takes over (its own answer comes back to it, not as a notice)
        r2 = asyncio.ensure_future(svc.complete(req("file:///w.py", "y = ", automatic=False)))
        assert (await asyncio.wait_for(r2, 5)).items[0].text == "value"
        r = await svc.complete(req("file:///w.py", "z = 1\nq = "))
        assert r.record["watched"]
        svc.document_changed("file:///w.py", "z = 1\nq = 7", 1, 5)  # typed something the model did not say
        await asyncio.sleep(0.6)
        assert ready == [] and svc.stats.totals["ready_notices"] == 0
    finally:
        svc.close()


async def test_no_watch_without_a_client_that_asks_again():
    backend = FakeBackend(respond=lambda ctx: "value\n", step_s=0.03, prefill_steps=8)
    svc = make_service(backend, max_tokens=20, prompt_budget_ms=50, time_budget_ms=2000)
    try:
        r = await svc.complete(req("file:///n.py", "y = "))
        assert r.record["answer"] == "prompt_budget" and "watched" not in r.record
    finally:
        svc.close()


async def test_predict_budget_shows_the_words_decided_so_far():
    backend = FakeBackend(respond=lambda ctx: "first second third fourth fifth\n", step_s=0.02)
    svc = make_service(backend, max_tokens=100, predict_budget_ms=150, time_budget_ms=3000)
    try:
        r = await svc.complete(req("file:///p.py", "z = "))
        text = r.items[0].text
        assert r.record["answer"] == "partial" and text.startswith("first") and len(text) < 30
        assert "first second third fourth fifth".startswith(text)
        await asyncio.sleep(0.7)  # the prediction went on: typing what was shown gets the rest at once
        r = await svc.complete(req("file:///p.py", "z = " + text))
        assert r.record["outcome"] == "cache" and (text + r.items[0].text).strip() == "first second third fourth fifth"
    finally:
        svc.close()


async def test_partial_words_off_shows_a_word_still_being_decoded():
    """One character a step (the fake's token): with partialWords false the predict budget shows the start of
    the first word, which whole words never can before the word ends."""
    backend = FakeBackend(respond=lambda ctx: "configuration_value_of_the_parser = 1\n", step_s=0.02)
    svc = make_service(backend, max_tokens=100, predict_budget_ms=100, time_budget_ms=3000, partial_words=False)
    try:
        r = await svc.complete(req("file:///p.py", "z = "))
        text = r.items[0].text
        assert r.record["answer"] == "partial" and 0 < len(text) < len("configuration_value_of_the_parser")
        assert "configuration_value_of_the_parser".startswith(text)
    finally:
        svc.close()


async def test_never_empty_for_want_of_time_once_a_visible_token_is_decided():
    backend = FakeBackend(respond=lambda ctx: "abcdefghijklmnopqrstuvwxyz" * 3, step_s=0.05)
    svc = make_service(backend, max_tokens=100, time_budget_ms=200)
    try:
        r = await svc.complete(req("file:///t.py", "s = "))
        assert r.items and r.record["answer"] == "time" and r.items[0].text.startswith("abc")
    finally:
        svc.close()


async def test_a_request_made_while_the_model_loads_is_answered_after_the_load():
    backend = FakeBackend(respond=lambda ctx: "loaded_ok\n", step_s=0.01)
    gate = threading.Event()

    def factory(cfg, repo):
        gate.wait(5)
        return backend

    svc = CompletionService(ServerConfig(time_budget_ms=300, prompt_budget_ms=100, predict_budget_ms=50), factory)
    svc.start()
    try:
        pending = asyncio.ensure_future(svc.complete(req("file:///l.py", "v = ", automatic=False)))
        await asyncio.sleep(0.6)  # longer than every budget: they start when the model can work
        assert not pending.done()
        gate.set()
        r = await asyncio.wait_for(pending, 5)
        assert r.items and r.items[0].text == "loaded_ok"
    finally:
        svc.close()


# ---- predicting ahead ----------------------------------------------------------------------------
async def test_a_shown_suggestion_is_followed_by_a_prediction_as_if_it_were_accepted():
    answers = {"x = ": "compute()\n", "x = compute()\n": "y = x + 1\n"}
    backend = FakeBackend(respond=lambda ctx: answers.get(ctx.prefix, ""), step_s=0.0)
    svc = make_service(backend, max_tokens=50)
    try:
        r = await svc.complete(req("file:///h.py", "x = "))
        assert r.items[0].text == "compute()"
        for _ in range(100):
            if len(backend.starts) == 2 and not svc.worker.jobs():
                break
            await asyncio.sleep(0.01)
        # the prediction ahead is started as such: a key contradicting it stops even its prompt's forwards
        assert backend.starts == [("predict", "x = "), ("ahead", "x = compute()\n")]
        # the person accepted the line and pressed Enter: the next line is there already
        r = await svc.complete(req("file:///h.py", "x = compute()\n", 1, 0))
        assert r.items[0].text == "y = x + 1" and r.record["outcome"] == "cache"
        # shown too, so it is followed in turn (the chain goes on only while its suggestions are used)
        for _ in range(100):
            if svc.stats.snapshot()["totals"]["ahead_predictions"] == 2 and not svc.worker.jobs():
                break
            await asyncio.sleep(0.01)
        assert backend.starts[2:] == [("ahead", "x = compute()\ny = x + 1\n")]
    finally:
        svc.close()


async def test_a_suggestion_shown_short_of_its_predictions_end_is_followed_by_no_prediction_ahead():
    """The first line shown of a prediction that decoded two: taking it leaves the cursor short of where a
    prediction ahead would start, and the first key would stop that one, so none is started."""
    backend = FakeBackend(respond=lambda ctx: "compute()\ny = 2\n" if ctx.prefix == "x = " else "", step_s=0.0)
    svc = make_service(backend, max_tokens=50)
    try:
        r = await svc.complete(req("file:///h.py", "x = "))
        assert r.items[0].text == "compute()"
        for _ in range(100):
            if not svc.worker.jobs() and svc.predictions.of("file:///h.py")[0].done:
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)
        assert backend.starts == [("predict", "x = ")]
        assert svc.stats.snapshot()["totals"]["ahead_predictions"] == 0
    finally:
        svc.close()


def test_a_suggestion_taken_reaches_the_end_of_its_prediction_but_for_blanks():
    from rest_lsp.service.scheduler import reaches

    assert reaches("x = compute()", "x = compute()\n") and reaches("x = f()", "x = f()")
    assert not reaches("x = compute()", "x = compute()\ny = 2\n") and not reaches(None, "x = ")
    assert not reaches("x = other()", "x = compute()\n")


def test_answer_rules_single_and_multi_line():
    single = build_context("q = ", 0, 4)
    assert answer("foo(a, b", single, done=False, max_lines=8, partial=False) is None
    assert answer("foo(a, b", single, done=False, max_lines=8, partial=True) == "foo(a,"
    assert answer("foo(a, b)\nnext", single, done=False, max_lines=8, partial=False) == "foo(a, b)"
    multi = build_context("def f():\n    \n", 1, 4)
    assert answer("a = 1\n    b = 2", multi, done=False, max_lines=8, partial=False) is None
    # the line being decoded shows its whole words ("2" may be the start of "20")
    assert answer("a = 1\n    b = 2", multi, done=False, max_lines=8, partial=True) == "a = 1\n    b ="
    assert answer("a = 1\n    bb", multi, done=False, max_lines=8, partial=True) == "a = 1"
    assert answer("a = 1\n    b = 2\n", multi, done=False, max_lines=2, partial=False) == "a = 1\n    b = 2"
    assert answer("a = 1\nx = 0", multi, done=False, max_lines=8, partial=False) == "a = 1"  # block ended


def test_prediction_views():
    p = Prediction("u", build_context("ab = c\n", 0, 6))
    p.publish("ount + 1", prefilled=True)
    assert p.view(build_context("ab = cou\n", 0, 8)).rest == "nt + 1"
    assert p.view(build_context("ab = cX\n", 0, 7)).status == "diverged"
    assert p.view(build_context("ab = count + 1 and\n", 0, 18)).status == "pending"  # it may still say " and"
    p.finish("eos")
    assert p.view(build_context("ab = count + 1 and\n", 0, 18)).status == "diverged"  # it did not
    p = Prediction("u", build_context("ab = c\n", 0, 6))
    p.publish("ount + 1", prefilled=True)
    assert p.view(build_context("ab = \n", 0, 5)).rest == "count + 1"  # deleted back
    assert p.view(build_context("ab = c\nmore", 0, 6)).status == "unrelated"  # other text after the cursor
    p.publish("ouX", prefilled=True)
    assert p.view(build_context("ab = coun\n", 0, 9)).status == "diverged"  # the output disagrees
    q = Prediction("u", build_context("ab = c\n", 0, 6))
    q.publish("o", prefilled=True)
    assert q.view(build_context("ab = coun\n", 0, 9)).status == "pending"  # typed past the output so far


# ---- the worker ----------------------------------------------------------------------------------
def test_worker_runs_the_most_urgent_job_one_step_at_a_time():
    w = InferenceWorker(queue_size=8)
    order = []
    gate = threading.Event()

    def steps(name, n):
        def fn(backend):
            for i in range(n):
                order.append(name)
                yield
            return name
        return fn

    w.load(lambda: gate.wait(5) or object())
    ahead = w.submit(Job("a", steps("ahead", 3), kind="predict", priority=AHEAD))
    warm = w.submit(Job("b", steps("warm", 3), kind="warm", priority=WARM))
    now = w.submit(Job("c", steps("now", 2), kind="predict", priority=INTERACTIVE))
    gate.set()
    assert [j.future.result(5) for j in (now, warm, ahead)] == ["now", "warm", "ahead"]
    assert order == ["now", "now", "warm", "warm", "warm", "ahead", "ahead", "ahead"]
    w.close()


def test_bounded_queue_drops_the_oldest_least_urgent():
    gate = threading.Event()
    w = InferenceWorker(queue_size=2)
    w.load(lambda: object())
    assert w.wait_loaded(5)
    blocker = w.submit(Job("busy", lambda b: gate.wait(5)))
    time.sleep(0.05)
    jobs = [w.submit(Job(f"doc{i}", lambda b: "done", priority=WARM)) for i in range(3)]
    with pytest.raises(JobAborted) as e:
        jobs[0].future.result(1)
    assert e.value.reason == "dropped"
    gate.set()
    assert [j.future.result(5) for j in jobs[1:]] == ["done", "done"]
    assert blocker.future.result(5) is True
    w.close()


def test_a_stopped_job_closes_its_generator_on_the_worker_thread():
    w = InferenceWorker()
    w.load(lambda: object())
    closed_on = []

    def fn(backend):
        try:
            while True:
                yield
        finally:
            closed_on.append(threading.current_thread().name)

    job = w.submit(Job("x", fn))
    time.sleep(0.05)
    w.stop(job, "stale")
    with pytest.raises(JobAborted):
        job.future.result(2)
    time.sleep(0.05)
    assert closed_on == ["rest-lsp-inference"]
    w.close()


# ---- stats, log, failures ------------------------------------------------------------------------
async def test_model_load_failure_is_reported_and_recoverable():
    def factory(cfg, repo):
        if cfg.model == "broken":
            raise OSError("weights are missing")
        return FakeBackend(respond=lambda ctx: "ok", step_s=0.0)

    svc = CompletionService(ServerConfig(model="broken"), factory)
    svc.start()
    svc.worker.wait_loaded(10)
    try:
        with pytest.raises(ServiceError) as e:
            await svc.complete(req("file:///d.py", "x = "))
        assert e.value.code == "model_unavailable" and "weights are missing" in str(e.value)
        svc.configure({"model": "fixed"})
        svc.worker.wait_loaded(10)
        r = await svc.complete(req("file:///d.py", "x = "))
        assert r.items[0].text == "ok"
    finally:
        svc.close()


async def test_request_log_writes_one_json_line_per_request(tmp_path):
    import json

    log = tmp_path / "requests.jsonl"
    svc = make_service(FakeBackend(respond=lambda ctx: "pass", step_s=0.0), max_tokens=10, request_log=str(log))
    try:
        await svc.complete(req("file:///e.py", "def f():\n    \n", 1, 4))
        rows = [json.loads(line) for line in log.read_text().splitlines()]
        assert len(rows) == 1 and rows[0]["outcome"] == "completed" and rows[0]["mode"] == "multi"
    finally:
        svc.close()


async def test_a_prediction_stopped_before_it_ran_still_answers_its_request():
    gate = threading.Event()
    backend = FakeBackend(respond=lambda ctx: "x\n", step_s=0.0)
    svc = make_service(backend, max_tokens=10)
    try:
        blocker = svc.worker.submit(Job("busy", lambda b: gate.wait(5)))  # the model is busy elsewhere
        waiting = asyncio.ensure_future(svc.complete(req("file:///s.py", "a = ")))
        await asyncio.sleep(0.1)
        pred = svc.predictions.of("file:///s.py")[0]
        svc.document_closed("file:///s.py")  # stops it before its first step
        r = await asyncio.wait_for(waiting, 2)
        assert r.items == [] and r.record["outcome"] == "superseded" and pred.done
        gate.set()
        blocker.future.result(5)
    finally:
        svc.close()


def test_run_totals_add_up_the_decoding_figures():
    # what the typing benchmark divides: tree size and forward time per step, over every model run
    st = Stats()
    st.record_run({"tokens": 7, "steps": 5, "draft_nodes": 20, "forward_ms": 100.0})
    st.record_run({"tokens": 3, "steps": 3, "draft_nodes": 0, "forward_ms": 45.5}, wasted=True)
    t = st.snapshot()["totals"]
    assert (t["runs"], t["tokens"], t["steps"], t["draft_nodes"], t["forward_ms"]) == (2, 10, 8, 20, 145.5)
    assert (t["wasted_tokens"], t["wasted_steps"], t["accepted_per_step"]) == (3, 3, 1.25)
