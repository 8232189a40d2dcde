"""Fixtures for the editor tests."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("editors-model") / "tiny"
    # testmodels/ (test support) is not installed: python -m finds it from the repository root
    subprocess.run([sys.executable, "-m", "testmodels.tiny", str(out)], check=True, cwd=REPO,
                   capture_output=True, timeout=300)
    return out


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Under scripts/test.sh (REST_LSP_REQUIRE_EDITORS=1), which installed the editors, a skipped editor
    test is a failure: a missing or broken editor must not pass CI as a row of skips. The only exception
    is the Neovim 0.12 download the user turned off (SKIP_NVIM012=1)."""
    outcome = yield
    report = outcome.get_result()
    if not report.skipped or hasattr(report, "wasxfail") or not os.environ.get("REST_LSP_REQUIRE_EDITORS"):
        return
    reason = str(report.longrepr[-1]) if isinstance(report.longrepr, tuple) else str(report.longrepr)
    if os.environ.get("SKIP_NVIM012") and "Neovim 0.12" in reason:
        return
    report.outcome = "failed"
    report.longrepr = f"skipped under REST_LSP_REQUIRE_EDITORS=1 (scripts/test.sh installed the editors): {reason}"
