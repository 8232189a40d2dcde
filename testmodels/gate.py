"""A gate for the daemon's model runs, for tests that must decide whether a run is still going when a request,
an edit or a cancellation arrives: a tiny model finishes in milliseconds, and a loaded machine can delay the
daemon's own checks by as much, so neither the model's nor the machine's speed may decide such a test.

    env = gate_env(tmp_path / "hook", gate, hold_after=0)   # the server's environment (with os.environ)
    ...                                                      # every run waits before its prompt while `gate` exists
    gate.unlink()                                            # they go on

The hook is a sitecustomize module on the server's PYTHONPATH: a run that has decoded `hold_after` tokens (0:
before its prompt is computed) waits before its next step while the gate file exists, and touches
`<gate>.held` so that the test knows a run is held.
"""
from __future__ import annotations

import os
from pathlib import Path

HOOK = """
import os, time
from rest_lsp.service import backend

_advance = backend.EngineBackend.advance
_gate = os.environ["REST_LSP_TEST_GATE"]
_hold_after = int(os.environ["REST_LSP_TEST_HOLD_AFTER"])


def advance(self, run, *args, **kwargs):
    while len(run.run.tokens) >= _hold_after and os.path.exists(_gate):
        open(_gate + ".held", "a").close()
        time.sleep(0.005)
    return _advance(self, run, *args, **kwargs)


backend.EngineBackend.advance = advance
"""


def gate_env(folder: Path, gate: Path, hold_after: int) -> dict[str, str]:
    """The environment variables a server needs for the gate (the gate file is created here)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(HOOK)
    gate.touch()
    return {"PYTHONPATH": os.pathsep.join(filter(None, [str(folder), os.environ.get("PYTHONPATH")])),
            "REST_LSP_TEST_GATE": str(gate), "REST_LSP_TEST_HOLD_AFTER": str(hold_after)}
