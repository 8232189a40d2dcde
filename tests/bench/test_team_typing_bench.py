"""benchmarks/bench_team_typing.py without servers: how bodies are dealt to typists, each typist's document,
and the figures and verdicts it reports."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import bench_team_typing as B  # noqa: E402
from test_typing_bench import prepared, type_all  # noqa: E402


def test_bodies_are_dealt_round_robin_each_typist_top_down_without_repeats():
    assert B.deal(4, 2, 8) == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert B.deal(1, 3, 8) == [[0, 1, 2]]
    # fewer bodies than typists x bodies: round again, still in order and once each per typist
    assert B.deal(3, 2, 4) == [[0, 3], [0, 1], [1, 2]]
    assert B.deal(2, 3, 2) == [[0, 1], [0, 1]]   # the wrap's repeats replaced: as many bodies as there are
    assert B.deal(2, 1, 0) == [[], []]


def test_each_typist_types_their_bodies_into_their_own_document_and_ends_with_the_original(tmp_path):
    root, ws, files = prepared(tmp_path)
    n_bodies = sum(len(b) for _, _, b in files)
    assert n_bodies >= 6
    for n in (1, 3, 4):
        typed = set()
        for plan in B.plans(files, n, per_typist=3):
            docs = {}
            for path, doc, _ in plan:
                assert docs.setdefault(path, doc) == doc   # one document per file per typist
            for path, doc in docs.items():
                mine = [b for p, _, b in plan if p == path]
                original = (root / path.relative_to(ws)).read_text()
                assert doc != original
                assert type_all(doc, mine) == original   # each body at the line its Body names
            typed |= {(p, b.line) for p, _, b in plan}
        assert len(typed) == min(n_bodies, n * 3)   # different typists, different bodies


def typist(pauses, shown_ms, answered_ms, typed=10, accepted=5):
    return {"pauses": pauses, "shown": len(shown_ms), "shown_ms": shown_ms, "answered_ms": answered_ms,
            "keys_typed": typed, "chars_accepted": accepted, "chars_total": typed + accepted}


def test_the_summary_pools_the_typists_pauses():
    a = typist(4, [100.0, 300.0], [100.0, 300.0, 900.0])
    b = typist(6, [50.0, 60.0, 70.0, 2000.0], [50.0, 60.0, 70.0, 2000.0])
    s = B.summarize([a, b], cpu_s=12.0, wall_s=30.0, tokens=90)
    assert s["typists"] == 2 and s["pauses"] == 10 and s["shown"] == 6 and s["shown_rate"] == 0.6
    assert s["shown_ms_p50"] == 70.0 and s["shown_ms_p95"] == 2000.0   # nearest rank over all six
    assert s["worst_typist_shown_ms_p95"] == 2000.0
    assert s["answered_ms_p95"] == 2000.0
    assert s["typed"] == 20 and s["accepted"] == 10
    assert s["shown_per_cpu_s"] == 0.5 and s["tokens_per_s"] == 3.0
    none = B.summarize([typist(3, [], [])], cpu_s=0.0, wall_s=1.0, tokens=None)
    assert none["shown_ms_p95"] is None and none["shown_per_cpu_s"] is None and none["tokens_per_s"] is None


def run(n, p95, per_cpu, typists=None, shown_rate=0.97):
    return {"typists": typists or n, "shown_ms_p95": p95, "shown_per_cpu_s": per_cpu, "shown_rate": shown_rate}


def test_the_targets_say_met_and_not_met():
    runs = {"team": {"1": run(1, 200.0, 1.0), "8": run(8, 390.0, 2.0)},
            "daemons": {"1": run(1, 150.0, 1.5), "8": run(8, 900.0, 1.0, typists=6)}}
    latency, efficiency = B.targets(runs)
    assert "1.95x" in latency and latency.endswith("met (<= 2x)") and "NOT" not in latency
    assert "2.00x" in efficiency and "only 6 daemons fitted" in efficiency and "NOT" not in efficiency
    runs["team"]["8"] = run(8, 450.0, 0.5)
    latency, efficiency = B.targets(runs)
    assert "NOT met" in latency and "NOT met" in efficiency
    runs["team"]["8"] = run(8, 390.0, 2.0, shown_rate=0.01)   # met, but over the few answers that came in time
    latency, caveat, _ = B.targets(runs)
    assert latency.endswith("met (<= 2x)") and "8 typists 1.0% of pauses shown" in caveat
    assert "1 typist " not in caveat and "not every pause" in caveat
    runs["team"]["8"] = {**run(8, None, 0.0), "pauses": 900, "shown": 0}   # every answer after the next key
    latency, _ = B.targets(runs)
    assert "no suggestion shown at any of 900 pauses" in latency and latency.endswith("NOT met (<= 2x)")
    only_daemons = B.targets({"daemons": {"1": run(1, 1.0, 1.0)}})
    assert only_daemons == ["efficiency: not measured (needs both arms at the same N)"]


def test_the_markdown_table_has_a_row_per_arm_and_n():
    report = {"cpu": "Some CPU", "cores": 2, "runs": {
        "team": {"8": {**B.summarize([typist(4, [100.0], [100.0])], 2.0, 10.0, 50), "pss_gib": 3.1, "note": None},
                 "1": {**B.summarize([typist(4, [80.0], [80.0])], 1.0, 10.0, 20), "pss_gib": 3.0, "note": None}}}}
    report["runs"]["team"]["8"]["typists"] = 8
    text = B.markdown(report)
    rows = [line for line in text.splitlines() if line.startswith("| team")]
    assert [r.split("|")[2].strip() for r in rows] == ["1", "8"]   # by N, not by insertion
    assert "| 80 / 80 |" in text and "| - / - |" not in text
    assert "Some CPU, 2 cores" in text and "latency: team server, 8 typists" in text
