"""What every benchmark's report needs: a percentile of a few hundred latencies (`pct`: the nearest rank, as
`rest/stats` reports them: rest_lsp/service/stats.py), and a JSON file written atomically (a benchmark killed
while writing leaves the previous report, not half of one). Sub-millisecond kernel timings use numpy's
interpolated percentile instead (rest_lsp/bench/harness.py, bench_indexer.py)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rest_lsp.service.stats import percentile as pct  # the daemon's own definition
from restbase.storage import write_bytes_atomic

__all__ = ["pct", "write_json"]


def write_json(path: str | Path, report: Any, indent: int = 1) -> None:
    write_bytes_atomic(Path(path), json.dumps(report, indent=indent).encode())
