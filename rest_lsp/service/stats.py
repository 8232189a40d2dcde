"""Per-request figures and totals for `rest/stats`, and the optional JSONL request log.

Requests and model runs are counted apart: a request may be answered from a prediction already running or
finished (no model call), and a prediction keeps decoding after the request it answered.
"""
from __future__ import annotations

import json
import logging
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

OUTCOMES = ("completed", "reused", "cache", "empty", "cancelled", "superseded", "dropped", "error", "skipped")
SHOWN = ("completed", "reused", "cache")  # outcomes that carry a suggestion
COUNTERS = ("predictions", "ahead_predictions", "typing_predictions", "warmups", "warm_tokens", "warm_forwards",
            "cursor_notifications", "ready_notices", "context_selections", "context_select_ms", "context_warm_tokens")


class Stats:
    def __init__(self, keep: int = 200):
        self._lock = threading.Lock()
        self.recent: deque[dict] = deque(maxlen=keep)
        self.started = time.time()
        self.totals: dict[str, Any] = {
            "requests": 0, "model_calls": 0, "cache_hits": 0, **{o: 0 for o in OUTCOMES},
            **{c: 0 for c in COUNTERS},
            # model runs (predictions, samples): decoded tokens, steps, time, accepted draft tokens per source
            "runs": 0, "tokens": 0, "steps": 0, "draft_nodes": 0, "retrieval_ms": 0.0, "forward_ms": 0.0,
            "prefill_ms": 0.0,
            "prompt_tokens": 0, "reused_prompt_tokens": 0, "computed_prompt_tokens": 0, "accepted_sources": {},
            "wasted_tokens": 0, "wasted_steps": 0,  # decoded by runs stopped before anything was shown
            "interrupted_forwards": 0,  # steps a key made moot, stopped between layers (engine `advance`)
        }
        self._next_id = 0
        self.request_log: Path | None = None
        self.failures: dict[str, int] = {}          # reason -> count, over the requests answered "error"
        self.config_problems: list[str] = []        # settings the loaded model made change or not apply

    def new_id(self) -> int:
        with self._lock:
            self._next_id += 1
            return self._next_id

    def count(self, name: str, n: int = 1) -> None:
        with self._lock:
            self.totals[name] = self.totals.get(name, 0) + n

    def record(self, rec: dict) -> None:
        """One request's outcome (any thread)."""
        with self._lock:
            t = self.totals
            t["requests"] += 1
            t[rec["outcome"]] = t.get(rec["outcome"], 0) + 1
            if rec["outcome"] in ("reused", "cache"):
                t["cache_hits"] += 1
            if rec.get("model_call"):
                t["model_calls"] += 1
            if rec["outcome"] == "error":
                why = str(rec.get("reason") or "unknown")[:160]
                self.failures[why] = self.failures.get(why, 0) + 1
            self.recent.append(rec)
            path = self.request_log
        if path is not None:
            try:
                with open(path, "a", encoding="utf-8") as f:
                    f.write(json.dumps(rec, default=str) + "\n")
            except OSError as exc:
                log.warning("request log %s not writable (%s); disabled", path, exc)
                self.request_log = None

    def record_run(self, figures: dict, *, wasted: bool = False) -> None:
        """One model run that ended (rest_lsp/service/backend.py `figures`)."""
        with self._lock:
            t = self.totals
            t["runs"] += 1
            for k in ("tokens", "steps", "draft_nodes", "retrieval_ms", "forward_ms", "prefill_ms", "prompt_tokens"):
                t[k] += figures.get(k) or 0
            t["reused_prompt_tokens"] += figures.get("reused_tokens") or 0
            t["interrupted_forwards"] += figures.get("interrupted_forwards") or 0
            # what the run's prefill forwards computed: less than prompt - reused when it stopped mid-prompt
            t["computed_prompt_tokens"] += figures.get("computed_tokens") or 0
            for name, n in (figures.get("accepted_sources") or {}).items():
                t["accepted_sources"][name] = t["accepted_sources"].get(name, 0) + n
            if wasted:
                t["wasted_tokens"] += figures.get("tokens") or 0
                t["wasted_steps"] += figures.get("steps") or 0

    def snapshot(self, last: int = 20) -> dict:
        with self._lock:
            t = json.loads(json.dumps(self.totals))  # a deep copy
            failures = dict(self.failures)
            recent = list(self.recent)[-last:] if last else []
            lat = sorted(r["latency_ms"] for r in self.recent if r["outcome"] in SHOWN + ("empty",))
            shown = sorted(r["latency_ms"] for r in self.recent if r["outcome"] in SHOWN)
        t["accepted_per_step"] = round(t["tokens"] / t["steps"], 3) if t["steps"] else None
        served = t["requests"] - t["skipped"] - t["error"]
        t["cache_hit_rate"] = round(t["cache_hits"] / served, 3) if served else None
        t["latency_ms_p50"] = percentile(lat, 50)
        t["latency_ms_p95"] = percentile(lat, 95)
        t["shown_latency_ms_p50"] = percentile(shown, 50)
        t["shown_latency_ms_p95"] = percentile(shown, 95)
        t["uptime_s"] = round(time.time() - self.started, 1)
        t["failures"] = dict(sorted(failures.items(), key=lambda kv: -kv[1])[:20])
        return {"totals": t, "recent": recent, "config_problems": list(self.config_problems)}


def percentile(xs, p: float) -> float | None:
    """The nearest-rank p-th percentile of the latencies `xs`, to 0.1 ms (None for none): what `rest/stats`
    reports, and what the typing benchmarks report of the same latencies (benchmarks/report.py)."""
    if not len(xs):
        return None
    xs = sorted(xs)
    i = min(len(xs) - 1, max(0, round(p / 100 * (len(xs) - 1))))
    return round(xs[i], 1)
