"""`model: auto` (rest_lsp/model/choice.py): the largest embedded model whose measured costs answer a typing
pause, from injected measurements; measured through precision auto's own machinery (stand-in timers)."""
import pytest

from rest_lsp.model import choice
from rest_lsp.model.choice import Candidate, decide

SMALL, BIG = "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"


def entry(step_ms: float, per_token_ms: float = 2.7, *, provisional=False, stale=None, precision="bf16") -> dict:
    """A precision auto cache entry as precision.measure_and_store writes it (the fields the rule reads)."""
    data = {"choice": precision, precision: {"step_ms": step_ms, "prompt_ms_per_token": per_token_ms,
                                             "prompt_chunk_ms": per_token_ms * 64},
            "fp32": {"step_ms": step_ms * 1.5, "prompt_ms_per_token": per_token_ms * 1.6,
                     "prompt_chunk_ms": per_token_ms * 1.6 * 64}, "provisional": provisional}
    if stale:
        data["stale"] = {"reason": stale}
    return data


def test_the_pause_cost_is_a_key_forward_and_a_first_lines_steps():
    # on a CPU a key's few tokens cost about a step; a slow prompt rate costs more
    assert choice.pause_ms({"step_ms": 43.5, "prompt_ms_per_token": 2.7}) == pytest.approx(6 * 43.5)
    assert choice.pause_ms({"step_ms": 10.0, "prompt_ms_per_token": 20.0}) == pytest.approx(4 * 20.0 + 5 * 10.0)
    assert choice.PAUSE_BUDGET_MS == 350.0


def test_a_larger_model_that_fits_is_chosen_with_its_reason():
    d = decide([Candidate(SMALL, True, entry(20.0)), Candidate(BIG, True, entry(50.0))])
    assert d["choice"] == BIG and d["pending"] is None
    assert d["models"][BIG] == {"cached": True, "precision": "bf16", "step_ms": 50.0, "pause_ms": 300.0, "state": "fits"}
    assert "300.0 ms at bf16" in d["reason"] and "350 ms budget" in d["reason"]


def test_a_larger_model_that_does_not_fit_leaves_the_default():
    # the team's figures on a 2-core Zen4: 0.5B 43.5 ms a step, 1.5B 124 ms (bf16)
    d = decide([Candidate(SMALL, True, entry(43.5)), Candidate(BIG, True, entry(124.0))])
    assert d["choice"] == SMALL and d["pending"] is None and d["models"][BIG]["state"] == "too slow"
    assert "744.0 ms a pause" in d["reason"] and f"{SMALL} itself takes 261.0 ms" in d["reason"]


def test_the_rule_reads_the_precision_the_model_runs_at():
    e = entry(50.0)   # bf16 fits (300 ms), fp32 (75 ms a step: 450 ms) does not
    assert decide([Candidate(SMALL, True, None), Candidate(BIG, True, e)], "auto")["choice"] == BIG
    assert decide([Candidate(SMALL, True, None), Candidate(BIG, True, e)], "fp32")["choice"] == SMALL
    d = decide([Candidate(SMALL, True, None), Candidate(BIG, True, e)], "int8w")   # never measured at int8w
    assert d["choice"] == SMALL and d["pending"] == BIG and "no int8w figures" in d["models"][BIG]["state"]


@pytest.mark.parametrize("why, e", [
    ("noisy", entry(50.0, provisional=True)),
    ("contradicted by live steps", entry(50.0, stale="live bf16 steps take 130.0 ms, 2.60x the 50.0 ms measured")),
    ("not measured", None),
])
def test_an_untrusted_or_missing_measurement_is_not_chosen_but_measured_when_idle(why, e):
    d = decide([Candidate(SMALL, True, entry(43.5)), Candidate(BIG, True, e)])
    assert d["choice"] == SMALL and d["pending"] == BIG and why in d["models"][BIG]["state"]


def test_a_model_not_in_the_cache_is_never_fetched_or_measured():
    d = decide([Candidate(SMALL, False, None), Candidate(BIG, False, entry(20.0))])
    assert d["choice"] == SMALL and d["pending"] is None and "not in the cache" in d["models"][BIG]["state"]


def test_the_largest_that_fits_wins_and_only_larger_models_are_pending():
    mid = "fake-1b"
    fits, slow = entry(40.0), entry(90.0)
    d = decide([Candidate(SMALL, True, None), Candidate(mid, True, fits), Candidate(BIG, True, slow)])
    assert d["choice"] == mid and d["pending"] is None
    d = decide([Candidate(SMALL, True, None), Candidate(mid, True, fits), Candidate(BIG, True, entry(20.0))])
    assert d["choice"] == BIG
    d = decide([Candidate(SMALL, True, None), Candidate(mid, True, None), Candidate(BIG, True, None)])
    assert d["choice"] == SMALL and d["pending"] == BIG   # the largest first
    d = decide([Candidate(SMALL, True, None), Candidate(mid, True, None), Candidate(BIG, True, fits)])
    assert d["choice"] == BIG and d["pending"] is None   # nothing smaller than the choice needs measuring


def test_resolve_reads_the_cache_and_does_not_measure_off_the_cpu(monkeypatch):
    monkeypatch.setattr(choice, "gather", lambda: pytest.fail("nothing is read off the CPU"))
    d = choice.resolve("cuda")
    assert d["choice"] == SMALL and "cuda" in d["reason"]


# ---------------------------------------------------------------------------------------- measured
@pytest.fixture
def machine(tmp_path, monkeypatch, tiny_model_dir):
    """A CPU with native bf16, the caches in tmp, and both embedded models 'converted' there: loading either
    loads the tiny model (under the embedded model's name), and the precision timings are a stand-in's."""
    import dataclasses

    from restbase import assets
    from rest_lsp.model import host, probes

    monkeypatch.setenv("REST_LSP_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(probes, "cpu_has_bf16", lambda: True)
    monkeypatch.setattr("rest_lsp.engine.cost.cache_dir", lambda: tmp_path / "cost")
    for name in (SMALL, BIG):
        d = assets.converted_dir(name)
        d.mkdir(parents=True)
        (d / "config.json").write_text("{}")

    def load(name, **kw):
        loaded = host.load_model(tiny_model_dir, **kw)
        return dataclasses.replace(loaded, name=assets.get(name).title)

    timings: dict[str, list[float]] = {}   # the k-th round of a candidate (model/precision) takes timings[..][k]
    seen: dict[str, int] = {}

    def timer(model_title):
        def make(name, verifier, vocab_size):
            key = f"{model_title}/{name}"

            def one_round():
                k = seen[key] = seen.get(key, 0) + 1
                seq = timings[key]
                return {"prompt_chunk_ms": 64 * 2.7, "step_ms": seq[min(k - 1, len(seq) - 1)]}
            return one_round
        return make

    return load, timer, timings


def _measure(load, timer, name):
    from restbase import assets
    from rest_lsp.model.precision import run_to_end

    return run_to_end(choice.measure(name, load=load, timer=timer(assets.get(name).title)))


def test_a_model_measured_to_fit_is_chosen_from_the_next_start(machine):
    load, timer, timings = machine
    assert choice.resolve("cpu")["pending"] == BIG   # cached, never measured
    timings.update({"Qwen2.5-Coder-1.5B-Instruct/fp32": [70.0], "Qwen2.5-Coder-1.5B-Instruct/bf16": [45.0]})
    after = _measure(load, timer, BIG)
    assert after["choice"] == BIG and after["measured"] == {"model": BIG, "precision": "bf16", "provisional": False,
                                                            "step_ms": {"fp32": 70.0, "bf16": 45.0}}
    again = choice.resolve("cpu")   # the next start reads it back from the cache
    assert again["choice"] == BIG and again["pending"] is None and again["models"][BIG]["pause_ms"] == 270.0


def test_a_model_measured_too_slow_is_not_chosen(machine):
    load, timer, timings = machine
    timings.update({"Qwen2.5-Coder-1.5B-Instruct/fp32": [190.0], "Qwen2.5-Coder-1.5B-Instruct/bf16": [124.0]})
    after = _measure(load, timer, BIG)
    assert after["choice"] == SMALL and after["pending"] is None and after["models"][BIG]["state"] == "too slow"


def test_a_noisy_measurement_is_rejected_until_a_quiet_one(machine):
    """A start that shared the CPU: the 1.5B's rounds disagree in every attempt (a burst of load made some
    look fast); its entry is provisional, so auto keeps the default and measures it again; the quiet
    re-measurement finds it too slow."""
    from rest_lsp.model import precision

    load, timer, timings = machine
    noisy = [30.0, 130.0] * (precision.ROUNDS * precision.MAX_ATTEMPTS)
    timings.update({"Qwen2.5-Coder-1.5B-Instruct/fp32": noisy, "Qwen2.5-Coder-1.5B-Instruct/bf16": noisy})
    after = _measure(load, timer, BIG)
    assert after["measured"]["provisional"] and after["choice"] == SMALL and after["pending"] == BIG
    # its figures would have fitted: the rule rejects them for their noise, not their value
    assert "noisy" in after["models"][BIG]["state"] and after["models"][BIG]["pause_ms"] <= choice.PAUSE_BUDGET_MS
    timings.update({"Qwen2.5-Coder-1.5B-Instruct/fp32": [190.0], "Qwen2.5-Coder-1.5B-Instruct/bf16": [124.0]})
    after = _measure(load, timer, BIG)
    assert not after["measured"]["provisional"] and after["choice"] == SMALL and after["pending"] is None
