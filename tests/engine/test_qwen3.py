"""A Qwen3-architecture model (per-head RMSNorm of the queries and keys) runs on the fast CPU verifier, not
on transformers' forward: loaded from a directory, with Qwen's FIM tokens, REST's output is an independent
plain greedy run's (no KV cache: the whole sequence recomputed for every token); and
`rest-lsp complete --compare` says the same over the one-shot path."""
import json
import os
import subprocess
import sys

import pytest

from rest_lsp.engine import ContextSource, Engine, GenerationConfig

from ._models import plain_greedy

PREFIX = "def total(items):\n    result = 0\n    for item in items:\n        "
SUFFIX = "\n    return result\n"
N = 32


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from testmodels.tiny import make_tiny_model_dir

    return make_tiny_model_dir(tmp_path_factory.mktemp("q3") / "model", seed=1, arch="qwen3")


def test_rest_on_the_fast_verifier_is_plain_greedy(model_dir):
    from rest_lsp.model.fast import FastVerifier
    from rest_lsp.model.host import load_model
    from rest_lsp.model.verifiers import make_verifier_or_eager

    lm = load_model(model_dir, device="cpu")
    assert lm.model.config.model_type == "qwen3" and lm.fim is not None and lm.fim.name == "qwen"
    verifier = make_verifier_or_eager(lm, "auto")
    assert isinstance(verifier, FastVerifier)  # before Qwen3 support: transformers' forward
    ids = lm.build_prompt(PREFIX, SUFFIX, max_new_tokens=N)
    want = plain_greedy(lm.model, ids, N, set(lm.stop_ids))
    assert len(want) >= 12 and len(set(want)) >= 5, "degenerate tiny model: exactness would not discriminate"
    source = ContextSource()
    source.set_buffer("earlier", ids + want)  # an open buffer that already holds this completion: long drafts
    engine = Engine(lm, [(source, 1.0)], verifier=verifier)
    r = engine.generate(ids, GenerationConfig(max_new_tokens=N, draft_budget=8))
    assert r.tokens == want
    assert r.accepted_sources.get("context", 0) > len(want) // 2 and r.steps < len(want) // 2, r
    # a second call on a longer prompt reuses the KV cache and stays exact
    ids2 = ids + want[:5]
    r2 = engine.generate(ids2, GenerationConfig(max_new_tokens=12, draft_budget=8))
    assert r2.reused_tokens > 0 and r2.tokens == plain_greedy(lm.model, ids2, 12, set(lm.stop_ids))

def test_complete_compare_with_a_qwen3_model(model_dir, tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    target = ws / "calc.py"
    target.write_text(PREFIX + "\n" + SUFFIX)
    env = {**os.environ, "REST_LSP_CACHE": str(tmp_path / "cache"), "TRANSFORMERS_VERBOSITY": "error"}
    p = subprocess.run([sys.executable, "-m", "rest_lsp.cli", "complete", f"{target}:4:9", "--model", str(model_dir),
                        "--workspace", str(ws), "--max-tokens", "16", "--json", "--compare"],
                       capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout)
    assert out["verifier"] in ("packed", "screened"), out["verifier"]
    assert out["figures"]["tokens"] > 0 and out["plain"]["same_text"] is True
