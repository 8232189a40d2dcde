"""benchmarks/llama_side_by_side.py without llama.cpp: llama-bench's JSON read into costs (a stand-in binary
that answers as llama-bench does for the arguments it is given), llama-server's answers summed, the table."""
import json
import stat
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import llama_side_by_side as S  # noqa: E402

FAKE_BENCH = r'''#!{python}
import json, sys
a = sys.argv
assert a[a.index("-d") + 1] == "300" and a[a.index("-o") + 1] == "json"
ps = [int(x) for x in a[a.index("-p") + 1].split(",")]
n = int(a[a.index("-n") + 1])
rows = [{{"n_prompt": p, "n_gen": 0, "n_depth": 300, "avg_ns": 1, "samples_ns": [1_000_000 * (10 + 2 * p)] * 3, "cpu_info": "Fake CPU"}}
        for p in ps]
rows.append({{"n_prompt": 0, "n_gen": n, "n_depth": 300, "avg_ns": 1_000_000 * 11 * n}})
print(json.dumps(rows))
'''


def test_llama_bench_rows_become_costs(tmp_path):
    fake = tmp_path / "llama-bench"
    fake.write_text(FAKE_BENCH.format(python=sys.executable))
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    costs = S.llama_costs(fake, tmp_path / "m.gguf", 2, 3, lambda s: None)
    assert costs["c_ms"] == {q: 10 + 2 * q for q in S.QS}
    assert costs["decode_ms"] == 11.0  # per token: the 32-token run's time over 32
    assert costs["cpu"] == "Fake CPU"


def test_llama_answers_are_summed_as_ours_are_and_compared_with_ours():
    ar = [[1, 2, 3], [4, 5, 6, 7]]
    rows = [{"tokens": [1, 2, 3], "predicted_n": 3, "predicted_ms": 100.0, "draft_n": 8, "draft_accepted": 2},
            {"tokens": [4, 5, 9, 9], "predicted_n": 4, "predicted_ms": 200.0, "draft_n": 0, "draft_accepted": 0}]
    s = S.summarize_llama(rows, ar)
    # the first token of each comes with the prompt: (3 - 1) + (4 - 1) tokens over 0.3 s
    assert s["tokens_per_s"] == 5 / 0.3
    assert s["tokens"] == 7 and s["identical_to_ours_ar"] == 1
    assert (s["draft_n"], s["draft_accepted"]) == (8, 2)


def test_the_table_puts_ours_against_the_mean_of_the_two_llama_runs():
    llama = {"c_ms": {q: 10.0 for q in S.QS}, "decode_ms": 10.0}
    report = {"model": "m", "gguf": "m.gguf", "threads": 2, "cpu": "c",
              "costs": {"llama_1": llama, "llama_2": {**llama, "decode_ms": 30.0},
                        "ours": {"c_ms": {q: 20.0 for q in S.QS}, "decode_ms": 40.0, "precision": "int4w"}}}
    text = S.table(report)
    assert "| c(1) | 10.0 | 20.0 | 10.0 | 2.00x |" in text
    assert "| decoding, 1 row, per token | 10.0 | 40.0 | 30.0 | 2.00x |" in text
    json.dumps(report)  # the report is written as JSON


def test_a_run_without_the_costs_has_a_table_too():
    """--skip-costs: the HumanEval part alone (a run once lost its report to a table that needed the costs)."""
    h = {"n": 2, "max_new_tokens": 8, "corpus_text": {"datastore_tokens": 10},
         "llama.cpp": {"tokens_per_s": 20.0},
         "methods": {"ours rest (int4w)": {"tokens": 9, "tokens_per_s": 30.0, "accepted": 1.5, "same": 2},
                     "llama.cpp plain": {"tokens": 9, "tokens_per_s": 20.0, "accepted": 1.0, "same": 1}}}
    text = S.table({"model": "m", "gguf": "m.gguf", "threads": 2, "cpu": "c", "humaneval": h})
    assert "| ours rest (int4w) | 9 | 30.00 | 1.50x | 1.5 | 2/2 |" in text and "c(1)" not in text


def test_a_llama_tool_killed_by_a_signal_fails_with_the_rebuild_hint(tmp_path):
    import pytest

    crash = tmp_path / "llama-bench"
    crash.write_text(f"#!{sys.executable}\nimport os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n")
    crash.chmod(crash.stat().st_mode | stat.S_IEXEC)
    with pytest.raises(SystemExit, match="LLAMA_AMX=off") as err:
        S.run([crash], lambda s: None)
    assert "(-11)" in str(err.value)
    fails = tmp_path / "llama-server"
    fails.write_text(f"#!{sys.executable}\nraise SystemExit(3)\n")
    fails.chmod(fails.stat().st_mode | stat.S_IEXEC)
    with pytest.raises(SystemExit) as err:
        S.run([fails], lambda s: None)
    assert "(3)" in str(err.value) and "LLAMA_AMX" not in str(err.value)


def test_two_llama_passes_pool_tokens_over_time_and_the_table_shows_each():
    """llama.cpp's passes before and after ours count as one arm: tokens over time across both (a drift of
    the machine during the run moves both sides alike), each pass's own rate kept for the report."""
    ar = [[1, 2, 3]]
    first = S.summarize_llama([{"tokens": [1, 2, 3], "predicted_n": 3, "predicted_ms": 100.0,
                                "draft_n": 4, "draft_accepted": 1}], ar)
    second = S.summarize_llama([{"tokens": [1, 2, 3], "predicted_n": 3, "predicted_ms": 300.0,
                                 "draft_n": 4, "draft_accepted": 1}], ar)
    p = S.pooled([first, second])
    assert p["passes_tokens_per_s"] == [20.0, 2 / 0.3]
    assert p["tokens_per_s"] == 4 / 0.4  # not the mean of the two rates (13.3)
    assert p["tokens"] == 3 and p["identical_to_ours_ar"] == 1
    assert p["draft_accepted"] == 2 and p["accepted_per_step"] == 1.5  # 6 tokens in 4 steps over both passes
    h = {"n": 1, "max_new_tokens": 3, "corpus_text": {"datastore_tokens": 10}, "llama.cpp": p,
         "methods": {"llama.cpp plain": {"tokens": 3, "tokens_per_s": p["tokens_per_s"], "accepted": 1.0,
                                         "same": 1, "passes": p["passes_tokens_per_s"]}}}
    text = S.table({"model": "m", "gguf": "m.gguf", "threads": 2, "cpu": "c", "humaneval": h})
    assert "| llama.cpp plain | 3 | 10.00 | 1.00x | 1.0 | 1/1 |" in text
    assert "llama.cpp plain 20.00 / 6.67" in text
