"""Naming an embedded model to the model host: by its registry name, alias or title; `auto` is resolved
before loading; an existing directory of the same name stays a path. A tiny model stands in for the real
files (nothing is downloaded)."""
import pytest

from restbase import assets
from rest_lsp.model import host


@pytest.fixture
def converted(monkeypatch, tiny_model_dir):
    """Every embedded model's converted directory is the tiny model's; records which model was asked for."""
    asked = []

    def fake_dir(model=None):
        asked.append(assets.get(model).name)
        return tiny_model_dir

    monkeypatch.setattr(host, "embedded_model_dir", fake_dir)
    return asked


def test_an_embedded_name_loads_that_model_under_its_title(converted, tiny_model_dir):
    lm = host.load_model("qwen2.5-coder-1.5b", device="cpu", precision="fp32")
    assert converted == ["qwen2.5-coder-1.5b"] and lm.name == "Qwen2.5-Coder-1.5B-Instruct"
    # the indexer resolves a directory to the same tokenizer ("embedded" means the default model's)
    assert lm.tokenizer_source == str(tiny_model_dir) and lm.path == tiny_model_dir


@pytest.mark.parametrize("spec", [None, "embedded", "qwen2.5-coder-0.5b", "Qwen2.5-Coder-0.5B-Instruct"])
def test_the_default_keeps_its_name_and_tokenizer_source(converted, spec):
    lm = host.load_model(spec, device="cpu", precision="fp32")
    assert converted == ["qwen2.5-coder-0.5b"] and lm.name == host.EMBEDDED_NAME and lm.tokenizer_source == "embedded"


def test_auto_is_refused_by_the_loader_with_a_clear_error(converted):
    with pytest.raises(host.ModelLoadError, match="model 'auto' is chosen per machine"):
        host.load_model("auto", device="cpu")
    assert converted == []


def test_an_existing_directory_named_like_an_embedded_model_is_a_path(converted, tmp_path, monkeypatch):
    (tmp_path / "qwen2.5-coder-1.5b").mkdir()
    monkeypatch.chdir(tmp_path)
    with pytest.raises(host.ModelLoadError, match="no config.json"):
        host.load_model("qwen2.5-coder-1.5b", device="cpu")
    assert converted == []


def test_a_failed_fetch_is_a_model_load_error(tmp_path, monkeypatch):
    monkeypatch.setenv("REST_LSP_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("REST_LSP_EMBEDDED_WHEELS", str(tmp_path / "no-wheels-here"))
    monkeypatch.setattr(assets, "_installed_parts", lambda m: None)
    with pytest.raises(host.ModelLoadError, match="lacks 22 of the 22 wheels of Qwen2.5-Coder-1.5B-Instruct"):
        host.load_model("qwen2.5-coder-1.5b", device="cpu")
    assert not any(p.suffix == ".gguf" for p in (tmp_path / "cache" / "embedded").iterdir())
