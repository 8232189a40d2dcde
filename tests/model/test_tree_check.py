"""The load-time tree check (rest_lsp/model/verifiers.py check_tree_rows, rest_lsp/service/backend.py): a verifier
whose tree rows round otherwise than plain decoding's single rows is found, and the daemon then decodes plainly
and says why; `device: mps` is refused at load."""
from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import torch

from rest_lsp.engine.verifier import HFVerifier
from rest_lsp.model.probes import bf16_packing_available
from testmodels.tiny import tiny_causal_lm
from rest_lsp.model.verifiers import check_tree_rows, make_verifier_or_eager

TOKENS = list(range(5, 40))


class Skewed:
    """A working verifier made to part from plain decoding in one way: "tree" moves the logits of a forward's
    first row by one ulp where the forward is a tree (as a kernel chosen by row count would), "keep" keeps the
    accepted path without moving it into place (the cache then holds a sibling), "raise" cannot verify a tree."""

    def __init__(self, inner, how: str, kind: str | None = None):
        self.inner, self.how = inner, how
        self._last: torch.Tensor | None = None
        if kind is not None:
            self.kind = kind   # what verifier_kind reports

    def __getattr__(self, name):
        return getattr(self.inner, name)

    @property
    def past_len(self) -> int:
        return self.inner.past_len

    def forward(self, tokens, depths, tree_mask, *, rows=None, prompt=False):
        tree = not torch.equal(tree_mask, torch.ones_like(tree_mask).tril())
        if tree and self.how == "raise":
            raise RuntimeError("no tree masks on this device")
        logits = self.inner.forward(tokens, depths, tree_mask, rows=rows).clone()
        if tree and self.how == "tree":
            logits[0] = torch.nextafter(logits[0], torch.full_like(logits[0], float("inf")))
        self._last = logits
        return logits

    def row_scorer(self, row):
        logits = self._last[row]
        return lambda ids: logits[ids]

    def keep(self, indices):
        if self.how == "keep":
            return self.inner.keep(list(range(len(indices))))
        return self.inner.keep(indices)


def _kinds():
    kinds = ["packed", "static"]
    if bf16_packing_available():
        kinds.append("screened")
    return kinds


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
@pytest.mark.parametrize("kind", _kinds())
def test_the_exact_verifiers_pass_and_are_left_empty(arch, kind):
    verifier = make_verifier_or_eager(tiny_causal_lm(arch, seed=3, vocab_size=96), kind)
    check = check_tree_rows(verifier, TOKENS)
    assert check.exact and check.reason is None, check.reason
    assert verifier.past_len == 0
    assert check.describe() == {"exact": True, "reason": None, "check_ms": round(check.ms, 1)}


@pytest.mark.parametrize("how, where", [("tree", "the tree's root"), ("keep", "the token after the kept path"),
                                        ("raise", "RuntimeError: no tree masks on this device")])
def test_a_verifier_that_parts_from_plain_decoding_is_refused(how, where):
    inner = make_verifier_or_eager(tiny_causal_lm("qwen2", seed=1, vocab_size=96), "packed")
    check = check_tree_rows(Skewed(inner, how), TOKENS)
    assert not check.exact
    assert where in check.reason and check.reason.startswith("the packed verifier on cpu")
    assert inner.past_len == 0   # the daemon's engine starts from an empty cache, even after a failure
    # the same verifier unskewed passes: the check refused the skew, not the model
    assert check_tree_rows(Skewed(inner, "none"), TOKENS).exact


def test_one_ulp_in_a_screened_row_is_found():
    # a screened head's logits are exact only for tokens that could win: those are compared, exactly
    if not bf16_packing_available():
        pytest.skip("no bf16 packing in this torch build: no screened verifier")
    inner = make_verifier_or_eager(tiny_causal_lm("qwen2", seed=2, vocab_size=96), "screened")
    assert inner.exact_logits is False
    check = check_tree_rows(Skewed(inner, "tree"), TOKENS)
    assert not check.exact and "top logits differ" in check.reason


def test_the_eager_fallback_is_checked_off_the_cpu_too(monkeypatch):
    """transformers' forward off the CPU was once taken as exact without a check; now its own rows decide."""
    from rest_lsp.model.verifiers import tree_exactness

    model = tiny_causal_lm("qwen2", seed=4, vocab_size=96)
    on_gpu = SimpleNamespace(device=torch.device("cuda"), model=model)
    check = tree_exactness(Skewed(HFVerifier(model), "tree"), on_gpu, TOKENS)
    assert not check.exact and "the tree's root" in check.reason
    # on a CPU whose kernels round rows alike, an eager verifier that agrees with itself passes; where the
    # kernels do not (an AVX2 CPU), the eager forward is refused even when one small tree happens to agree
    import rest_lsp.model.probes as probes

    on_cpu = SimpleNamespace(device=torch.device("cpu"), model=model)
    # an eager verifier whose tree rows agree (the packed one, reported as eager): only the kernel rule decides
    agreeing = Skewed(make_verifier_or_eager(model, "packed"), "none", kind="eager")
    monkeypatch.setattr(probes, "eager_row_invariant", lambda dtype: False)
    refused = tree_exactness(agreeing, on_cpu, TOKENS)
    assert not refused.exact and "eager_row_invariant" in refused.reason
    monkeypatch.setattr(probes, "eager_row_invariant", lambda dtype: True)
    assert tree_exactness(agreeing, on_cpu, TOKENS).exact


def _patch_verifier(monkeypatch, skew):
    import rest_lsp.model.verifiers as verifiers

    real = verifiers.make_verifier_or_eager

    def make(loaded, kind="auto", **kw):
        return Skewed(real(loaded, kind, **kw), skew)

    monkeypatch.setattr(verifiers, "make_verifier_or_eager", make)


@pytest.mark.parametrize("skew", ["none", "tree"])
def test_the_daemon_decodes_plainly_where_the_check_fails_and_says_why(tmp_path, monkeypatch, caplog, skew):
    from rest_lsp.model.host import load_model
    from testmodels.tiny import make_tiny_model_dir
    from rest_lsp.service.backend import EngineBackend
    from rest_lsp.service.config import ServerConfig, check_against_model
    from rest_lsp.service.datastores import DatastoreSet
    from rest_lsp.service.prompt import build_context

    _patch_verifier(monkeypatch, skew)
    loaded = load_model(make_tiny_model_dir(tmp_path / "m"), device="cpu", precision="fp32")
    with caplog.at_level(logging.WARNING, logger="rest_lsp.service.backend"):
        backend = EngineBackend(loaded, DatastoreSet())
    refused = skew == "tree"
    trees = backend.describe()["trees"]
    assert trees["exact"] is (not refused) and backend.limits().exact_trees is (not refused)
    logged = [r.getMessage() for r in caplog.records if "draft trees refused" in r.getMessage()]
    if refused:
        assert "the tree's root" in trees["reason"] and backend.limits().trees_reason == trees["reason"]
        assert len(logged) == 1 and trees["reason"] in logged[0]
        # what rest/stats and the client are told (config_problems): plain decoding, and the check's finding
        _, problems = check_against_model(ServerConfig(), backend.limits())
        assert len(problems) == 1 and "decodes plainly" in problems[0] and trees["reason"] in problems[0]
    else:
        assert trees["reason"] is None and logged == []
    # the automatic budget: no draft node is verified where trees were refused; a prompt that repeats itself
    # gives the drafter something to propose where they were not
    body = "def add(a, b):\n    return a + b\n\n\n" * 6
    ctx = build_context(body + "def add(a, b):\n    ", 4 * 6 + 1, 4)
    run = backend.start("file:///t.py", ctx, ServerConfig(max_tokens=12, max_lines=1))
    while not run.done:
        backend.advance(run)
    drafted = sum(run.run.result.draft_sizes)
    assert (drafted == 0) if refused else (drafted > 0)
    backend.stop(run, "done")


def test_mps_is_refused_at_load_even_where_it_is_available(tiny_model_dir, monkeypatch):
    from rest_lsp.model.host import ModelLoadError, load_model

    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    with pytest.raises(ModelLoadError, match=r"device 'mps' is not supported: .*float64.*use device 'cpu'"):
        load_model(tiny_model_dir, device="mps")
    with pytest.raises(ModelLoadError, match="device 'xpu' is not supported"):
        load_model(tiny_model_dir, device="xpu")
    assert load_model(tiny_model_dir, device="cpu", precision="fp32").device.type == "cpu"
