"""benchmarks/daemon_memory.py: a real daemon on the tiny model, measured over the protocol, and the /proc
reading it rests on."""
import asyncio
import os
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import daemon_memory as M  # noqa: E402


def test_process_memory_sees_an_allocation_as_anonymous_memory():
    before = M.process_memory(os.getpid())
    block = np.ones(300 << 20, dtype=np.uint8)   # 300 MiB, every page touched
    after = M.process_memory(os.getpid())
    assert after["anon_gib"] - before["anon_gib"] >= 0.25
    assert after["uss_gib"] >= after["anon_gib"] - 0.05
    del block


def test_a_daemon_is_measured_after_its_model_loads_and_completes(tiny_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("REST_LSP_CACHE", str(tmp_path / "cache"))   # the daemon inherits it: no user cache
    row = asyncio.run(M.measure(str(tiny_dir), "fp32", ROOT / "examples", "inventory.py", (46, 8), tmp_path))
    assert row["completed"] and row["chosen"] == "fp32" and row["verifier"] in ("packed", "screened")
    assert 0.05 < row["anon_gib"] < 4 and row["uss_gib"] > 0
    assert "| " + str(tiny_dir) + " | fp32 (fp32) |" in M.table([row])
