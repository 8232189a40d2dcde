"""What every benchmark's report needs: a percentile of a few hundred timings, and a JSON file written
atomically (a benchmark killed while writing leaves the previous report, not half of one)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

from restbase.storage import write_bytes_atomic


def pct(xs: Sequence[float], p: float) -> float | None:
    """The nearest-rank p-th percentile, to 0.1 (None for no values)."""
    if not xs:
        return None
    xs = sorted(xs)
    return round(xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))], 1)


def write_json(path: str | Path, report: Any, indent: int = 1) -> None:
    write_bytes_atomic(Path(path), json.dumps(report, indent=indent).encode())
