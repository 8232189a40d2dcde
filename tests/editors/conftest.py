"""Fixtures for the editor tests."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("editors-model") / "tiny"
    subprocess.run([sys.executable, "-m", "rest_lsp.model.tiny", str(out)], check=True,
                   capture_output=True, timeout=300)
    return out
