"""benchmarks/report.py: the benchmarks' latency percentile is the daemon's own (one definition)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import report  # noqa: E402

from rest_lsp.service.stats import percentile  # noqa: E402


def test_the_benchmarks_percentile_is_the_one_rest_stats_reports():
    assert report.pct is percentile
    assert percentile([], 50) is None
    assert percentile([5.0, 1.0, 3.0], 50) == 3.0  # unsorted input is sorted first
    xs = [float(x) for x in range(100, 0, -1)]
    assert percentile(xs, 95) == 95.0 and percentile(xs, 50) == 51.0  # nearest rank: round(p/100 * (n - 1))
    assert percentile([0.04, 0.06], 0) == 0.0  # to 0.1 ms
