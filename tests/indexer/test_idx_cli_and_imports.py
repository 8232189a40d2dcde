"""`rest-index` commands and their JSON keys; `import indexer` and search never import torch."""
from __future__ import annotations

import json
import subprocess
import sys

from idx_helpers import write_files

from indexer.cli import main


def test_build_query_stats_json(tmp_path, bpe_tok_path, capsys):
    write_files(tmp_path / "r", {"a.py": "def f(x):\n    return x + 1\n", "b.py": "def f(x):\n    return x - 1\n"})
    assert main(["build", str(tmp_path / "r"), "--out", str(tmp_path / "ds"), "--tokenizer", bpe_tok_path, "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["documents"] == 2 and rep["tokens"] > 0 and {"tokenize_s", "sort_s"} <= set(rep)
    assert main(["query", str(tmp_path / "ds"), "--text", "def f(x):\n    return x", "--json"]) == 0
    q = json.loads(capsys.readouterr().out)
    assert set(q) == {"match_len", "count", "continuations"} and q["count"] == 2
    assert all(set(c) == {"tokens", "text", "count"} for c in q["continuations"])
    assert sorted(c["text"][:4] for c in q["continuations"]) == [" + 1", " - 1"]
    toks = ",".join(map(str, q["continuations"][0]["tokens"][:3]))
    assert main(["query", str(tmp_path / "ds"), "--tokens", toks, "--k", "1", "--json"]) == 0
    q2 = json.loads(capsys.readouterr().out)
    assert q2["match_len"] == 3 and sum(c["count"] for c in q2["continuations"]) <= 1
    assert main(["stats", str(tmp_path / "ds"), "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert {"tokens", "documents", "bytes_on_disk", "bytes_per_token", "shards"} <= set(s)
    assert s["documents"] == 2 and s["shards"] == 1


def test_cli_errors_are_messages_not_tracebacks(tmp_path, capsys):
    assert main(["stats", str(tmp_path / "nothing"), "--json"]) == 2
    assert "no datastore" in capsys.readouterr().err
    assert main(["build", "--out", str(tmp_path / "ds")]) == 2
    assert "ROOT" in capsys.readouterr().err


def test_import_and_search_never_import_torch(tmp_path, bpe_tok_path):
    write_files(tmp_path / "r", {"a.py": "alpha beta gamma\n"})
    code = f"""
import sys, indexer
from indexer.store import Datastore
from indexer.cli import main
ds = Datastore.build([{str(tmp_path / 'r')!r}], {str(tmp_path / 'ds')!r}, tokenizer={bpe_tok_path!r})
ds.set_live("buf", [1, 2, 3])
r = ds.search(ds.tokenizer.encode("alpha beta", add_special_tokens=False).ids)
assert r.match_len >= 2, r
bad = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "transformers"))
print("BAD", bad)
sys.exit(1 if bad else 0)
"""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr


def test_corpus_from_env_indexes_the_standard_library(tmp_path, bpe_tok_path, capsys, monkeypatch):
    import sysconfig

    monkeypatch.setenv("REST_LSP_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "corpus"
    assert main(["build", "--corpus-from-env", "--out", str(out), "--tokenizer", bpe_tok_path,
                 "--max-tokens", "30000", "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["kind"] == "corpus" and 30000 <= rep["tokens"] < 400000
    from indexer.store import Datastore

    ds = Datastore.open(out)
    std = sysconfig.get_paths()["stdlib"]
    assert ds.kind == "corpus" and any(p.startswith(std) for p in ds.documents)
    assert all(p.endswith((".py", ".pyi", ".pyx", ".pxd")) for p in ds.documents)
    assert not any("/test/" in p for p in ds.documents)
    from indexer.build import default_corpus_dir

    d = default_corpus_dir(bpe_tok_path)
    assert d.parent == tmp_path / "cache" / "corpus"
