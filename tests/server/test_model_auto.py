"""`model: auto` and the embedded models' names in the daemon: the settings take them, and the backend
chooses, says why (rest/stats' model description), measures a larger cached model when idle and applies the
new choice from the next start. The tiny model stands in for both embedded models; precision timings are a
stand-in's; nothing is downloaded."""
import argparse

import pytest

from rest_lsp.service.config import ServerConfig, merge

SMALL, BIG = "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"


@pytest.mark.parametrize("value", [BIG, SMALL, "embedded", "auto", "Qwen2.5-Coder-1.5B-Instruct"])
def test_the_model_setting_takes_the_embedded_names_and_auto(value):
    for settings in ({"model": value}, {"rest-lsp": {"model": value}}):
        config, changed, problems = merge(ServerConfig(), settings)
        assert problems == [] and changed == {"model"} and config.model == value


def test_the_command_line_takes_them_too():
    from rest_lsp.cli import _add_model_options, _settings

    p = argparse.ArgumentParser()
    _add_model_options(p)
    assert _settings(p.parse_args(["--model", BIG])) == {"model": BIG}
    assert _settings(p.parse_args(["--model", "auto"])) == {"model": "auto"}
    assert _settings(p.parse_args([])) == {}   # unset: the default model, as before


@pytest.fixture
def machine(tmp_path, monkeypatch, tiny_model):
    """Both embedded models converted in a tmp cache (each loads the tiny model under its own title), a CPU
    with native bf16, precision timings from `figures` (per precision, whichever model is timed)."""
    from restbase import assets
    from rest_lsp.model import host, precision, probes

    monkeypatch.setenv("REST_LSP_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(probes, "cpu_has_bf16", lambda: True)
    monkeypatch.setattr("rest_lsp.engine.cost.cache_dir", lambda: tmp_path / "cost")
    monkeypatch.setattr(host, "embedded_model_dir", lambda model=None: tiny_model)
    for name in (SMALL, BIG):
        d = assets.converted_dir(name)
        d.mkdir(parents=True)
        (d / "config.json").write_text("{}")
    figures = {"fp32": 66.2, "bf16": 43.5, "int8w": 90.0, "int8": 90.0}   # int8w, int8: where this CPU offers them
    monkeypatch.setattr(precision, "round_timer", lambda name, verifier, vocab: lambda: {
        "prompt_chunk_ms": 64 * 2.7, "step_ms": figures[name]})
    monkeypatch.setattr(precision, "machine_allows", lambda model_bytes: None)

    def start():
        from rest_lsp.service.backend import load_backend

        return load_backend(ServerConfig(model="auto", precision="auto", cache_dir=str(tmp_path),
                                         persist_history=False))

    return start, figures


def test_auto_starts_on_the_default_measures_the_larger_model_when_idle_and_switches_next_start(machine,
                                                                                                 monkeypatch):
    from rest_lsp.model import precision
    from rest_lsp.model.precision import run_to_end

    start, figures = machine
    backend = start()
    d = backend.describe()
    assert d["name"] == "Qwen2.5-Coder-0.5B-Instruct" and backend.model_spec == SMALL
    mc = d["model_choice"]
    assert mc["choice"] == SMALL and mc["pending"] == BIG and "not measured" in mc["models"][BIG]["state"]
    assert "no larger embedded model is measured to fit" in mc["reason"]
    # a busy machine postpones it: nothing loaded, asked again later
    monkeypatch.setattr(precision, "machine_allows", lambda model_bytes: "the machine is busy (load 3.0)")
    assert backend.idle_work() is None
    assert "postponed (the machine is busy" in backend.describe()["model_choice"]["measuring"]
    monkeypatch.setattr(precision, "machine_allows", lambda model_bytes: None)
    figures.update(fp32=70.0, bf16=45.0)   # the 1.5B's steps on a machine where it fits
    work = backend.idle_work()
    assert work is not None
    run_to_end(work)
    mc = backend.describe()["model_choice"]
    assert mc["measuring"] == f"{BIG}: measured" and mc["next_start"]["choice"] == BIG
    assert backend.loaded.name == "Qwen2.5-Coder-0.5B-Instruct"   # this daemon keeps its model
    assert backend.idle_work() is None   # once per daemon
    nxt = start()
    mc = nxt.describe()["model_choice"]
    assert nxt.loaded.name == "Qwen2.5-Coder-1.5B-Instruct" and mc["choice"] == BIG and mc["pending"] is None
    assert "answers a typing pause in 270.0 ms at bf16" in mc["reason"]
    assert nxt.model_spec == BIG   # what the live check's re-measurement loads again


def test_auto_keeps_the_default_where_the_larger_model_is_too_slow(machine):
    from rest_lsp.model.precision import run_to_end

    start, figures = machine
    backend = start()
    figures.update(fp32=190.0, bf16=124.0)
    run_to_end(backend.idle_work())
    assert backend.describe()["model_choice"]["next_start"]["choice"] == SMALL
    nxt = start()
    mc = nxt.describe()["model_choice"]
    assert nxt.loaded.name == "Qwen2.5-Coder-0.5B-Instruct" and mc["models"][BIG]["state"] == "too slow"
    assert mc["pending"] is None and nxt.idle_work() is None
