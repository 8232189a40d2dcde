"""benchmarks/gpu_check.sh: its CPU smoke mode runs every step with a tiny shape; without CUDA it refuses."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


def run(*args, tmp_path):
    # WHEELS: an empty folder, not a checkout's .whl/ (wheels fetched for a GPU machine's Python, not this one's)
    (tmp_path / "no-wheels").mkdir(exist_ok=True)
    env = {**os.environ, "PYTHON": sys.executable, "REST_LSP_CACHE": str(tmp_path / "cache"),
           "WHEELS": str(tmp_path / "no-wheels")}
    return subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_check.sh"), *args], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=900)


def test_cpu_smoke_runs_every_step(tmp_path):
    p = run("--cpu-smoke", str(tmp_path / "out"), tmp_path=tmp_path)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    out = tmp_path / "out"
    cost = json.loads((out / "gpu-cost.json").read_text())
    assert cost["shape"] == "tiny" and set(cost["curves"]["16"]) == {"eager", "static", "static-lowp"}
    assert cost["curves"]["16"]["static"]["projected"]   # M / (c(q)/c(1)) from the committed replay report
    exact = json.loads((out / "exact.json").read_text())
    assert exact["static_exact"] and {r["family"] for r in exact["rows"]} == {"qwen2", "codellama"}
    assert all(r["rest_identical_to_plain"] == r["prompts"] for r in exact["rows"] if r["verifier"] == "static")
    summary = (out / "summary.md").read_text()
    assert "projected" in summary and "REST = plain" in summary


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA machine would run the whole check")
def test_refuses_without_cuda(tmp_path):
    p = run(str(tmp_path / "out"), tmp_path=tmp_path)
    assert p.returncode == 2 and "no CUDA device" in p.stderr and "--cpu-smoke" in p.stderr
