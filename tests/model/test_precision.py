"""precision auto on a CPU: measured once per model and CPU, cached, and the cheaper one kept."""
import json

import pytest
import torch


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from rest_lsp.model.host import load_model
    from rest_lsp.model.tiny import make_tiny_model_dir

    return load_model(make_tiny_model_dir(tmp_path_factory.mktemp("prec") / "m"), device="cpu", precision="fp32")


def test_without_native_bf16_it_stays_fp32(tiny, monkeypatch):
    from rest_lsp.model import fast, precision

    monkeypatch.setattr(fast, "cpu_has_bf16", lambda: False)
    choice, why = precision.choose(tiny)
    assert choice == "fp32" and "bf16" in why["reason"]


def test_measured_once_and_cached(tiny, monkeypatch, tmp_path):
    from rest_lsp.model import fast, precision

    monkeypatch.setattr(fast, "cpu_has_bf16", lambda: True)
    monkeypatch.setattr("rest_lsp.engine.cost.cache_dir", lambda: tmp_path)
    timed = []
    real = precision.time_forwards

    def fake_timing(verifier, vocab):
        m = real(verifier, vocab)
        timed.append(verifier.dtype if hasattr(verifier, "dtype") else None)
        return {**m, "step_ms": 1.0 if len(timed) == 2 else 5.0}  # the second (bf16) is made cheaper

    monkeypatch.setattr(precision, "time_forwards", fake_timing)
    choice, data = precision.choose(tiny)
    assert choice == "bf16" and len(timed) == 2 and data["fp32"]["step_ms"] == 5.0
    assert next(tmp_path.glob("precision-*.json")).read_text() == json.dumps(data)
    assert precision.choose(tiny) == (choice, data) and len(timed) == 2  # read back, not measured again
    assert next(tiny.model.parameters()).dtype == torch.float32  # the measurement left the model as it was


def test_as_bf16_converts_the_weights(tiny):
    import copy

    from rest_lsp.model.precision import as_bf16

    lm = as_bf16(copy.deepcopy(tiny))
    assert lm.precision == "bf16" and lm.dtype == torch.bfloat16
    assert all(p.dtype == torch.bfloat16 for p in lm.model.parameters())
