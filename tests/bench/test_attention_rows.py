"""benchmarks/attention_rows.py: every arm timed, the kernel built for narrower vector widths, each build's rows
checked by the same probe as the daemon's."""
import platform
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import attention_rows  # noqa: E402


@pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None, reason="no C++ compiler")
@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="-march=x86-64 is an x86 target")
def test_attention_rows_times_every_arm_on_small_shapes():
    report = attention_rows.main(["--spans", "40,70", "--calls", "2", "--rounds", "2", "--march", "x86-64",
                                  "--dtype", "fp32"])
    assert report["arms"] == ["float64", "fp32 SDPA", "kernel native", "kernel x86-64"]  # no "rows differ!"
    assert [(r["heads"], r["span"]) for r in report["rows"]] == [("0.5B", 40), ("0.5B", 70), ("1.5B", 40),
                                                                  ("1.5B", 70)]
    assert all(ms > 0 for r in report["rows"] for ms in r["ms"].values())
