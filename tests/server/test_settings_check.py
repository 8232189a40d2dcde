"""Settings checked against the loaded model, and every failed request counted with its reason.

In-process with stand-in backends (the e2e test in test_robustness_e2e.py runs the real one)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from rest_lsp.service.config import MIN_PROMPT_TOKENS, ModelLimits, ServerConfig, check_against_model
from rest_lsp.service.core import CompletionRequest, CompletionService, ServiceError


def test_max_tokens_is_fitted_to_the_context():
    limits = ModelLimits(context=4096, tree_reserve=40, fim=True)
    cfg, problems = check_against_model(ServerConfig(max_tokens=4096), limits)
    assert cfg.max_tokens == 4096 - 40 - MIN_PROMPT_TOKENS
    assert len(problems) == 1 and "maxTokens 4096" in problems[0] and str(cfg.max_tokens) in problems[0]
    same, none = check_against_model(ServerConfig(max_tokens=64), limits)
    assert same.max_tokens == 64 and none == []
    tiny, problems = check_against_model(ServerConfig(max_tokens=500), ModelLimits(context=200, tree_reserve=40))
    assert tiny.max_tokens == 1 and problems          # a context too small for any prompt: one token


def test_windows_against_the_prompt_format():
    cfg = ServerConfig(max_suffix_chars=300, max_prefix_chars=10**7)
    _, problems = check_against_model(cfg, ModelLimits(context=2048, fim=False))
    assert any("fill-in-the-middle" in p and "maxSuffixChars" in p for p in problems)
    assert any("maxPrefixChars 10000000" in p for p in problems)
    _, problems = check_against_model(ServerConfig(max_suffix_chars=300), ModelLimits(context=2048, fim=True))
    assert problems == []


def test_a_verifier_that_rounds_tree_rows_otherwise_is_said():
    # transformers' own forward on a CPU whose kernels round a row differently among others (AVX2-only)
    _, problems = check_against_model(ServerConfig(), ModelLimits(context=2048, exact_trees=False))
    assert len(problems) == 1 and "decodes plainly" in problems[0]   # the automatic budget: no drafts
    _, problems = check_against_model(ServerConfig(draft_budget=8), ModelLimits(context=2048, exact_trees=False))
    assert len(problems) == 1 and "draftBudget 8" in problems[0] and "can differ from plain decoding" in problems[0]
    _, problems = check_against_model(ServerConfig(draft_budget=0), ModelLimits(context=2048, exact_trees=False))
    assert problems == []   # plain decoding verifies no trees
    _, problems = check_against_model(ServerConfig(), ModelLimits(context=2048))
    assert problems == []


def test_an_engine_backend_states_its_limits(tmp_path, monkeypatch):
    from rest_lsp.model.host import load_model
    from testmodels.tiny import make_tiny_model_dir
    from rest_lsp.service.backend import EngineBackend
    from rest_lsp.service.datastores import DatastoreSet

    backend = EngineBackend(load_model(make_tiny_model_dir(tmp_path / "m"), device="cpu", precision="fp32"),
                            DatastoreSet())
    limits = backend.limits()
    assert limits.fim and limits.context == backend.engine.max_positions
    assert limits.tree_reserve == backend.engine.drafter.draft_len + backend.engine.drafter.max_draft_nodes + 1
    assert backend.verifier_kind != "eager" and limits.exact_trees   # the fast path: rows round alike
    # where transformers' forward verifies (an architecture the fast paths do not run), it depends on the CPU
    import rest_lsp.model.probes as probes

    from rest_lsp.model.verifiers import trees_verify_exactly

    for invariant in (False, True):
        monkeypatch.setattr(probes, "eager_row_invariant", lambda dtype, v=invariant: v)
        assert trees_verify_exactly("eager", backend.loaded) is invariant
        assert trees_verify_exactly("packed", backend.loaded)
    # where trees are not exact, the automatic budget decodes plainly; an explicit one still drafts
    from rest_lsp.service.prompt import build_context

    ctx = build_context("def f(x):\n    return x\n\n\ndef g(y):\n    ", 5, 4)
    for exact, budget, want in ((True, None, None), (False, None, 0), (False, 6, 6), (True, 0, 0)):
        backend.trees_exact = exact
        run = backend.start("file:///t.py", ctx, ServerConfig(draft_budget=budget, max_tokens=4))
        assert run.run.config.draft_budget == want, (exact, budget)
        backend.stop(run, "cancelled")
    backend.trees_exact = False
    assert backend.limits().exact_trees is False   # and so the service states it (check_against_model)


class Backend:
    """A stand-in model: one forward per step, one character per decoding step (or a failure)."""

    name = "stand-in"

    def __init__(self, fail: Exception | None = None):
        self.fail = fail
        self.seen_max_tokens: list[int] = []

    def start(self, key, ctx, config, *, purpose="predict", temperature=0.0, seed=None, anchor=None, repo=None):
        if self.fail is not None:
            raise self.fail
        self.seen_max_tokens.append(config.max_tokens)
        return SimpleNamespace(done=purpose == "warm", prefilled=True, text="", full="x = 1\n")

    def advance(self, run, interrupt=None):
        run.text = run.full[: len(run.text) + 1]
        run.done = run.text == run.full

    def stop(self, run, reason):
        run.done = True

    def figures(self, run):
        return {"tokens": len(run.text), "steps": len(run.text), "stop_reason": "eos" if run.done else None}

    def limits(self):
        return ModelLimits(context=1024, tree_reserve=16, fim=True)

    def describe(self):
        return {"name": self.name}


def service(backend: Backend, **cfg) -> tuple[CompletionService, list]:
    said: list[tuple[str, str]] = []
    svc = CompletionService(ServerConfig(time_budget_ms=0, **cfg), lambda c, r: backend,
                            notify=lambda level, msg: said.append((level, msg)))
    svc.start()
    assert svc.worker.wait_loaded(10)
    return svc, said


async def test_settings_too_big_for_the_model_are_fitted_and_shown():
    backend = Backend()
    svc, said = service(backend, max_tokens=5000)
    try:
        expected = 1024 - 16 - MIN_PROMPT_TOKENS
        assert svc.config.max_tokens == expected
        assert any(level == "problem" and "maxTokens 5000" in msg for level, msg in said)
        r = await svc.complete(CompletionRequest("file:///a.py", "x = ", 0, 4))
        assert r.record["outcome"] == "completed" and backend.seen_max_tokens == [expected]
        changed, problems = svc.configure({"maxTokens": 100000})   # after the load: checked at once
        assert svc.config.max_tokens == expected and problems and "max_tokens" not in changed
        assert svc.snapshot()["config_problems"] == problems
    finally:
        svc.close()


@pytest.mark.parametrize("exc", [ValueError("max_new_tokens=9000 leaves no room in a 4096-token context"),
                                 RuntimeError("CUDA out of memory"), KeyError("past_key_values")])
async def test_every_failure_is_counted_with_its_reason_and_no_traceback(exc):
    svc, _ = service(Backend(fail=exc))
    try:
        for _ in range(2):
            with pytest.raises(ServiceError) as e:
                await svc.complete(CompletionRequest("file:///b.py", "y = ", 0, 4))
            assert e.value.code == "internal" and type(exc).__name__ in str(e.value)
            assert "Traceback" not in str(e.value) and "\n" not in str(e.value)
        snap = svc.snapshot()
        assert snap["totals"]["error"] == 2 and snap["recent"][-1]["outcome"] == "error"
        (reason, count), = snap["totals"]["failures"].items()
        assert count == 2 and reason.startswith(type(exc).__name__)
    finally:
        svc.close()
