"""precision auto on a CPU: measured once per model and CPU, cached, and the cheaper one kept."""
import json

import pytest
import torch

from rest_lsp.model.int8weight import weight_int8_exact


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

    from rest_lsp.model.precision import as_precision

    assert as_precision(tiny, "fp32") is tiny  # what choose calls with fp32: nothing to convert
    lm = as_precision(copy.deepcopy(tiny), "bf16")
    assert lm.precision == "bf16" and lm.dtype == torch.bfloat16
    assert all(p.dtype == torch.bfloat16 for p in lm.model.parameters())


def _ordered_timing(monkeypatch, precision, step_ms: list[float]):
    """time_forwards as measured, with step_ms replaced in call order (fp32, bf16, int8)."""
    calls = []
    real = precision.time_forwards

    def fake(verifier, vocab):
        calls.append(verifier)
        return {**real(verifier, vocab), "step_ms": step_ms[len(calls) - 1]}

    monkeypatch.setattr(precision, "time_forwards", fake)
    return calls


def test_int8_is_opt_in_for_a_model_without_a_quality_figure(tiny, monkeypatch, tmp_path):
    from rest_lsp.model import fast, precision

    monkeypatch.setattr(fast, "cpu_has_bf16", lambda: True)
    monkeypatch.setattr("rest_lsp.engine.cost.cache_dir", lambda: tmp_path)
    assert tiny.name not in precision.INT8_QUALITY
    calls = _ordered_timing(monkeypatch, precision, [5.0, 4.0, 5.0, 4.0])  # int8, were it timed, never is
    choice, data = precision.choose(tiny)
    assert choice == "bf16" and len(calls) == 2 and "int8" not in data
    # a measured loss beyond INT8_MAX_LOSS keeps it out too
    monkeypatch.setitem(precision.INT8_QUALITY, tiny.name, -(precision.INT8_MAX_LOSS + 1))
    assert precision.choose(tiny, force=True)[0] == "bf16" and len(calls) == 4


def test_int8_chosen_where_its_quality_passed_and_it_is_cheapest(tiny, monkeypatch, tmp_path):
    from rest_lsp.model import fast, precision
    from rest_lsp.model.int8row import is_int8

    monkeypatch.setattr(fast, "cpu_has_bf16", lambda: True)
    monkeypatch.setattr("rest_lsp.engine.cost.cache_dir", lambda: tmp_path)
    monkeypatch.setitem(precision.INT8_QUALITY, tiny.name, -precision.INT8_MAX_LOSS / 2)
    calls = _ordered_timing(monkeypatch, precision, [5.0, 4.0, 1.0, 5.0, 4.0, 9.0])
    choice, data = precision.choose(tiny)
    assert choice == "int8" and set(data) >= {"fp32", "bf16", "int8"} and len(calls) == 3
    assert not is_int8(tiny.model)  # measured on a copy
    assert precision.choose(tiny, force=True)[0] == "bf16"  # int8 dearer now: the cheapest wins


def test_as_int8_converts_the_linear_layers(tiny):
    import copy

    from rest_lsp.model.int8row import is_int8
    from rest_lsp.model.precision import as_precision

    lm = as_precision(copy.deepcopy(tiny), "int8")
    assert lm.precision == "int8" and lm.dtype == torch.float32 and is_int8(lm.model)
    assert not any(isinstance(m, torch.nn.Linear) for m in lm.model.modules())


@pytest.mark.skipif(not weight_int8_exact(), reason="int8w is refused where its kernel is not batch-invariant")
def test_int8w_chosen_where_its_quality_passed_even_without_native_bf16(tiny, monkeypatch, tmp_path):
    from rest_lsp.model import fast, precision
    from rest_lsp.model.int8weight import Int8WeightLinear

    monkeypatch.setattr(fast, "cpu_has_bf16", lambda: False)
    monkeypatch.setattr("rest_lsp.engine.cost.cache_dir", lambda: tmp_path)
    assert precision.choose(tiny)[0] == "fp32"  # no figure for this model: int8w is opt-in
    monkeypatch.setitem(precision.INT8W_QUALITY, tiny.name, -precision.INT8_MAX_LOSS / 2)
    calls = _ordered_timing(monkeypatch, precision, [5.0, 2.0, 5.0, 9.0])  # fp32, int8w (no bf16 on this CPU)
    choice, data = precision.choose(tiny)
    assert choice == "int8w" and set(data) >= {"fp32", "int8w"} and "bf16" not in data and len(calls) == 2
    assert not any(isinstance(m, Int8WeightLinear) for m in tiny.model.modules())  # measured on a copy
    assert precision.choose(tiny, force=True)[0] == "fp32"  # int8w dearer now: the cheapest wins
    monkeypatch.setitem(precision.INT8W_QUALITY, tiny.name, -(precision.INT8_MAX_LOSS + 1))
    assert precision.choose(tiny, force=True)[0] == "fp32" and len(calls) == 4  # a loss too large: not timed


@pytest.mark.skipif(not weight_int8_exact(), reason="int8w is refused where its kernel is not batch-invariant")
def test_as_int8w_converts_the_linear_layers_and_keeps_the_float_ones_for_prompts(tiny):
    import copy

    from rest_lsp.model.int8weight import Int8WeightLinear
    from rest_lsp.model.precision import as_precision

    lm = as_precision(copy.deepcopy(tiny), "int8w")
    assert lm.precision == "int8w" and lm.dtype == torch.float32
    quantized = [m for m in lm.model.modules() if isinstance(m, Int8WeightLinear)]
    assert len(quantized) == 7 * 2 + 1 and all(isinstance(m.wide, torch.nn.Linear) for m in quantized)


def test_int8w_is_refused_where_its_kernel_is_not_batch_invariant(tiny, monkeypatch):
    """The load fails with a clear message, and auto does not offer it, instead of speculating inexactly."""
    from rest_lsp.model import host, int8weight, precision

    monkeypatch.setattr(int8weight, "weight_int8_exact", lambda: False)
    with pytest.raises(host.ModelLoadError, match="int8w.*batch-invariant"):
        host.quantize(tiny.model, "int8w")
    monkeypatch.setitem(precision.INT8W_QUALITY, tiny.name, 0.0)
    assert not precision.int8w_candidate(tiny.name)
