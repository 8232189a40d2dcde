"""benchmarks/gpu_cost.py, the prepared GPU check, run on the CPU with a tiny shape."""
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import gpu_cost  # noqa: E402


def test_gpu_cost_script_runs_on_a_tiny_shape(tmp_path):
    replay = {"results": [{"policy": "rest", "budget": 3, "mean_accepted": 2.0, "mean_tree_nodes": 3.0},
                          {"policy": "rest", "budget": "auto", "mean_accepted": 1.5, "mean_tree_nodes": 1.0},
                          {"policy": "rest", "budget": 64, "mean_accepted": 2.6, "mean_tree_nodes": 60.0}]}
    (tmp_path / "replay.json").write_text(json.dumps(replay))
    out = tmp_path / "gpu.json"
    report = gpu_cost.main(["--shape", "tiny", "--device", "cpu", "--dtype", "fp32", "--qs", "1,2,4",
                            "--past", "16,40", "--repeats", "1", "--replay", str(tmp_path / "replay.json"),
                            "--json", str(out)])
    assert json.loads(out.read_text())["shape"] == "tiny" and set(report["curves"]) == {"16", "40"}
    assert set(report["curves"]["40"]) == {"eager", "static", "static-lowp"}
    for kind, curve in report["curves"]["40"].items():
        ms = curve["ms"]
        assert set(ms) == {1, 2, 4} and all(v > 0 for v in ms.values()), kind
        rows = {r["budget"]: r for r in curve["projected"]}
        assert set(rows) == {3, "auto"}  # 64 nodes is beyond the measured q = 4: left out, not extrapolated
        assert rows[3]["q"] == 4 and rows[3]["cost_ratio"] == pytest.approx(ms[4] / ms[1])
        assert rows[3]["projected_speedup"] == pytest.approx(2.0 * ms[1] / ms[4])
        assert rows["auto"]["cost_ratio"] == pytest.approx(ms[2] / ms[1])


def test_gpu_cost_refuses_without_cuda(monkeypatch):
    monkeypatch.setattr(gpu_cost.torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match="no CUDA device"):
        gpu_cost.main(["--device", "cuda"])


def test_gpu_cost_rejects_unknown_kinds():
    with pytest.raises(SystemExit, match="--kinds"):
        gpu_cost.main(["--shape", "tiny", "--device", "cpu", "--kinds", "eager,warp"])


def test_gpu_cost_times_the_prefill_of_each_past():
    report = gpu_cost.main(["--shape", "tiny", "--device", "cpu", "--dtype", "fp32", "--qs", "1,2",
                            "--past", "16,40", "--repeats", "1", "--kinds", "static,eager", "--prefill"])
    assert set(report["prefill_ms"]) == {"16", "40"}
    for past in ("16", "40"):
        assert set(report["prefill_ms"][past]) == {"static", "eager"}
        assert all(ms > 0 for ms in report["prefill_ms"][past].values())
    assert "prefill_ms" not in gpu_cost.main(["--shape", "tiny", "--device", "cpu", "--dtype", "fp32", "--qs", "1",
                                              "--past", "16", "--repeats", "1", "--kinds", "static"])
