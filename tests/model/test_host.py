import shutil

import pytest
import torch

from rest_lsp.model import host
from rest_lsp.model.host import LoadedModel, ModelLoadError, convert_gguf, load_model


def test_load_tiny_dir(tiny_model_dir):
    lm = load_model(str(tiny_model_dir), device="cpu")
    assert isinstance(lm, LoadedModel)
    assert lm.precision == "fp32" and lm.dtype == torch.float32 and lm.device.type == "cpu"
    assert lm.fim is not None and lm.fim.name == "qwen"
    assert lm.context_length == 4096
    assert not lm.model.training
    assert lm.tokenizer.eos_token_id in lm.stop_ids
    ids = lm.build_prompt("def f(x):\n", "\n", max_new_tokens=16)
    with torch.no_grad():
        logits = lm.model(torch.tensor([ids])).logits
    assert logits.shape == (1, len(ids), len(lm.tokenizer))
    assert lm.vocab_size == len(lm.tokenizer)


def test_auto_precision_on_cpu(tiny_model_dir):
    if torch.cuda.is_available():
        pytest.skip("auto picks CUDA here")
    lm = load_model(tiny_model_dir)
    assert lm.device.type == "cpu" and lm.precision == "fp32"


def test_int8_per_row_quantization(tiny_model_dir):
    from rest_lsp.model.int8row import Int8RowLinear

    ref = load_model(tiny_model_dir, device="cpu", precision="fp32")
    lm = load_model(tiny_model_dir, device="cpu", precision="int8")
    assert lm.precision == "int8" and lm.dtype == torch.float32
    assert not [m for m in lm.model.modules() if isinstance(m, torch.nn.Linear)], "every nn.Linear is replaced"
    assert isinstance(lm.model.get_output_embeddings(), Int8RowLinear)
    assert lm.vocab_size == ref.vocab_size
    ids = torch.tensor([ref.build_prompt("import os\nimport sys\n")])
    with torch.no_grad():
        a = ref.model(ids).logits
        b = lm.model(ids).logits
    assert torch.isfinite(b).all()
    # int8 weights stay close to the fp32 model on a random tiny model
    assert torch.nn.functional.cosine_similarity(a.flatten(), b.flatten(), dim=0) > 0.95
    out = lm.model.generate(ids, max_new_tokens=4, do_sample=False)
    assert out.shape[1] == ids.shape[1] + 4


def test_bf16_on_cpu_when_asked(tiny_model_dir):
    lm = load_model(tiny_model_dir, device="cpu", precision="bf16")
    assert lm.dtype == torch.bfloat16 and next(lm.model.parameters()).dtype == torch.bfloat16


def test_fim_override(tiny_model_dir):
    assert load_model(tiny_model_dir, device="cpu", fim="none").fim is None
    with pytest.raises(ValueError):
        load_model(tiny_model_dir, device="cpu", fim="codellama")


def test_bad_specs(tmp_path, tiny_model_dir):
    with pytest.raises(ModelLoadError, match="no such model"):
        load_model(str(tmp_path / "missing" / "model"))
    with pytest.raises(ModelLoadError, match="no such model"):
        load_model("./not-here")
    with pytest.raises(ModelLoadError, match="no config.json"):
        load_model(tmp_path)
    f = tmp_path / "weights.bin"
    f.write_bytes(b"x")
    with pytest.raises(ModelLoadError, match="neither a model directory nor a .gguf"):
        load_model(f)
    with pytest.raises(ModelLoadError, match="unknown precision"):
        load_model(tiny_model_dir, precision="int4")
    if not torch.cuda.is_available():
        with pytest.raises(ModelLoadError, match="CUDA is not available"):
            load_model(tiny_model_dir, device="cuda")
    else:
        with pytest.raises(ModelLoadError, match="CPU only"):
            load_model(tiny_model_dir, device="cuda", precision="int8")


def test_hub_id_offline_is_a_clear_error(monkeypatch):
    import transformers

    def offline(*a, **k):
        raise OSError("We couldn't connect to 'https://huggingface.co'")

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", offline)
    with pytest.raises(ModelLoadError, match="Hugging Face Hub"):
        load_model("some-org/some-model")


def _no_partials(d):
    return [p.name for p in d.iterdir() if ".partial" in p.name]


def _fake_gguf(tmp_path, monkeypatch, name: str):
    """A file named .gguf (the loaders below never read it) and a cache of its own."""
    monkeypatch.setenv("REST_LSP_CACHE", str(tmp_path / "cache"))
    gguf = tmp_path / name
    gguf.write_bytes(b"GGUF not really")
    return gguf


def _copying_loader(model_dir, calls: list):
    """A conversion that copies a ready model directory, noting each call."""
    def good(src, out):
        calls.append(src)
        for p in model_dir.iterdir():
            shutil.copy(p, out / p.name)
    return good


def test_gguf_conversion_is_atomic_and_cached(tmp_path, monkeypatch, tiny_model_dir):
    gguf = _fake_gguf(tmp_path, monkeypatch, "Fake Model.gguf")
    calls = []

    def failing(src, out):
        calls.append(src)
        (out / "model.safetensors").write_bytes(b"half")
        raise RuntimeError("killed mid-way")

    with pytest.raises(ModelLoadError, match="killed mid-way"):
        convert_gguf(gguf, loader=failing)
    dest = host.gguf_cache_dir(gguf)
    assert not dest.exists() and _no_partials(dest.parent) == []

    def interrupted(src, out):
        (out / "config.json").write_text("{}")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        convert_gguf(gguf, loader=interrupted)
    assert not dest.exists() and _no_partials(dest.parent) == []

    good = _copying_loader(tiny_model_dir, calls)
    n = len(calls)
    d = convert_gguf(gguf, loader=good)
    assert d == dest and (d / "config.json").is_file() and len(calls) == n + 1
    assert convert_gguf(gguf, loader=good) == d and len(calls) == n + 1  # cached: no second conversion
    assert _no_partials(dest.parent) == []
    # load_model on the .gguf path uses the converted cache
    lm = load_model(gguf, device="cpu")
    assert lm.path == d and lm.name == "Fake Model.gguf"


def test_loaded_build_prompt_fits_the_context(tiny_model_dir):
    lm = load_model(tiny_model_dir, device="cpu")
    prefix = "".join(f"value_{i} = {i}\n" for i in range(3000))
    ids = lm.build_prompt(prefix, "\nprint(value_1)\n", max_new_tokens=128)
    assert len(ids) <= lm.context_length - 128 - 32
    p, s, m = lm.fim.token_ids(lm.tokenizer)
    assert ids[0] == p and ids[-1] == m and s in ids
    assert lm.tokenizer.decode(ids[:-1]).endswith("\nprint(value_1)\n")
    assert lm.build_prompt("x = 1", None) == lm.tokenizer.encode("x = 1", add_special_tokens=False)


@pytest.mark.parametrize("damage", ["truncate-weights", "flip-config", "drop-tokenizer", "no-checksums"])
def test_a_damaged_conversion_is_converted_again(tmp_path, monkeypatch, tiny_model_dir, capfd, damage):
    """Checksums of the converted cache: damage is one line on stderr and a new conversion, not a failed load
    with a traceback. A cache from before checksums (none recorded) is checked for structure and recorded."""
    from rest_lsp.model import converted

    gguf = _fake_gguf(tmp_path, monkeypatch, "m.gguf")
    calls = []
    good = _copying_loader(tiny_model_dir, calls)
    d = convert_gguf(gguf, loader=good)
    assert (d / converted.CHECKSUMS).is_file() and converted.problem(d, full=True) is None
    capfd.readouterr()
    weights = next(d.glob("*.safetensors"))
    if damage == "truncate-weights":
        weights.write_bytes(weights.read_bytes()[:-1000])
    elif damage == "flip-config":
        raw = bytearray((d / "config.json").read_bytes())
        raw[10] ^= 0x01
        (d / "config.json").write_bytes(bytes(raw))
    elif damage == "drop-tokenizer":
        (d / "tokenizer.json").unlink()
    else:
        (d / converted.CHECKSUMS).unlink()
    again = convert_gguf(gguf, loader=good)
    err = capfd.readouterr().err
    if damage == "no-checksums":
        assert len(calls) == 1 and (d / converted.CHECKSUMS).is_file() and err == ""
    else:
        assert len(calls) == 2 and again == d
        lines = [ln for ln in err.splitlines() if "damaged" in ln]
        assert len(lines) == 1 and str(d) in lines[0] and "Traceback" not in err
    assert converted.problem(d, full=True) is None
    lm = load_model(gguf, device="cpu")
    assert lm.path == d


def test_a_flipped_byte_in_the_weights_is_found_by_the_full_check(tmp_path, tiny_model_dir):
    from rest_lsp.model import converted

    d = tmp_path / "copy"
    shutil.copytree(tiny_model_dir, d)
    converted.record(d)
    weights = next(d.glob("*.safetensors"))
    raw = bytearray(weights.read_bytes())
    raw[-100] ^= 0x40
    weights.write_bytes(bytes(raw))
    assert converted.problem(d, full=True) is not None and "checksum" in converted.problem(d, full=True)
