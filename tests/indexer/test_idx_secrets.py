"""Secrets by content (indexer/secrets.py): generated AWS, GitHub, database and API credentials and PEM keys
never reach a datastore, by build or by update; key material is skipped whatever the language filter;
masked lines are counted per file, never shown."""
from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
from idx_helpers import source_lines, write_files

import indexer.ingest as ingest
from indexer.build import build_datastore
from indexer.discover import Filters, is_secret_name
from indexer.secrets import KEY_MATERIAL, _detector, clean
from indexer.store import Datastore


def stored_text(ds: Datastore) -> dict[str, str]:
    """Every document as the store holds it, decoded."""
    by_id = {s.id: s for s in ds._shards}
    return {p: ds.tokenizer.decode([int(t) for t in by_id[d.shard].ids(d.start, d.end)])
            for p, d in ds.documents.items()}


def leaks(ds: Datastore, values: dict[str, str]) -> list[tuple[str, str]]:
    texts = stored_text(ds)
    return [(name, p) for p, t in texts.items() for name, v in values.items() if v in t or v[:12] in t]


def repo(root: Path, s) -> None:
    write_files(root, {
        "config.py": s.config_py(),
        "settings_local.py": s.settings_py(),
        "app.py": "from config import region\n\n\ndef main():\n    print(region())\n",
        "keys/deploy_key": s.pem,                        # key material by name
        "private_key.txt": s.pem,                        # key material by name
        "handover.txt": "the deploy key:\n" + s.pem,     # key material by content
        "terraform.tfstate": json.dumps({"resources": [{"secret_key": s.aws_secret}]}),
        "prod.tfvars": f'db_password = "{s.db_password}"\n',
        ".env": f"API_KEY={s.api_key}\n",
        "notes.md": f"token: {s.github_token}\n",
    })


def test_a_build_masks_secret_lines_and_skips_key_material(tmp_path, bpe_tok_path, secrets_sample):
    s = secrets_sample
    repo(tmp_path / "r", s)
    rep = build_datastore([tmp_path / "r"], tmp_path / "ds", tokenizer=bpe_tok_path,
                          filters=Filters(languages=None))      # every extension: --languages all
    ds = Datastore.open(tmp_path / "ds")
    assert leaks(ds, s.values()) == []
    indexed = {Path(p).name for p in ds.documents}
    assert indexed == {"config.py", "settings_local.py", "app.py", "notes.md"}
    assert rep["skipped"][KEY_MATERIAL] == 1                   # handover.txt, by its PEM block
    st = ds.stats()
    by_name = {Path(p).name: n for p, n in st["masked"].items()}
    assert by_name == {"config.py": 4, "settings_local.py": 1, "notes.md": 1}
    assert st["masked_lines"] == 6 == rep["masked_lines"] and st["masked_files"] == 3
    # only the secret lines are gone: the code around them is indexed
    text = stored_text(ds)[str(tmp_path / "r" / "config.py")]
    assert "def region():" in text and text.count("\n") == s.config_py().count("\n")


def test_updates_mask_too_and_key_material_drops_a_file(tmp_path, bpe_tok_path, secrets_sample):
    s = secrets_sample
    write_files(tmp_path / "r", {"a.py": "x = 1\n", "b.py": "def f():\n    return 2\n"})
    ds = Datastore.build([tmp_path / "r"], tmp_path / "ds", tokenizer=bpe_tok_path)
    (tmp_path / "r" / "a.py").write_text(s.config_py())                        # a secret added later
    (tmp_path / "r" / "b.py").write_text('KEY = """\n' + s.pem + '"""\n')     # now holds a private key
    (tmp_path / "r" / "c.py").write_text(s.settings_py())
    summary = ds.update_paths([tmp_path / "r" / n for n in ("a.py", "b.py", "c.py")])
    assert summary["masked_lines"] == 5
    assert leaks(ds, s.values()) == [] and leaks(Datastore.open(tmp_path / "ds"), s.values()) == []
    assert {Path(p).name for p in ds.documents} == {"a.py", "c.py"}
    assert {Path(p).name: n for p, n in ds.stats()["masked"].items()} == {"a.py": 4, "c.py": 1}


def test_rest_index_stats_reports_counts_not_values(tmp_path, bpe_tok_path, secrets_sample):
    repo(tmp_path / "r", secrets_sample)
    build_datastore([tmp_path / "r"], tmp_path / "ds", tokenizer=bpe_tok_path)
    out = subprocess.run([sys.executable, "-m", "indexer.cli", "stats", str(tmp_path / "ds"), "--json"],
                         capture_output=True, text=True, check=True).stdout
    st = json.loads(out)
    assert st["masked_lines"] == 5 and {Path(p).name for p in st["masked"]} == {"config.py", "settings_local.py"}
    assert not any(v in out for v in secrets_sample.values().values())


@pytest.mark.parametrize("name", ["deploy_key", "id_rsa", "id_ed25519.pub", ".env", ".env.local",
                                  "terraform.tfstate", "terraform.tfstate.backup", "prod.tfvars",
                                  "vars.tfvars.json", "server.pem", "api.key", "user.ppk"])
def test_key_material_names(name):
    assert is_secret_name(name) and not Filters(languages=None).name_ok(name)


@pytest.mark.parametrize("name", ["keys.py", "monkey.py", "key_test.go", "tokenizer.json", "state.tf"])
def test_ordinary_names_are_not_key_material(name):
    assert not is_secret_name(name)


def test_the_prefilter_never_hides_a_line_detect_secrets_flags(secrets_sample):
    """The speed-up must not change the outcome: every line detect-secrets' own full scan flags is a
    candidate (real source lines with the generated secrets spread among them)."""
    rng = random.Random(5)
    lines = source_lines()[:1500]
    extra = [ln for text in (secrets_sample.config_py(), secrets_sample.settings_py()) for ln in text.splitlines()]
    extra += [f"    token = '{secrets_sample.github_token}'", f"url = 'https://u:{secrets_sample.db_password}@h/x'",
              'hash = "0123456789abcdef0123456789abcdef"', "password: hunter2-but-longer"]
    for ln in extra:
        lines.insert(rng.randrange(len(lines)), ln)
    text = "\n".join(lines)
    det = _detector()
    starts, pos = [], 0
    for ln in lines:
        starts.append(pos)
        pos += len(ln) + 1
    secret_lines = {i for i, ln in enumerate(lines) if any(v in ln for v in secrets_sample.values().values())}
    for filename in ("config.py", "settings.yaml", "app.js"):
        full = {x.line_number - 1 for x in det.scan(list(enumerate(lines, 1)), filename)}
        if filename == "config.py":
            assert secret_lines <= full and len(secret_lines) == 7
        assert full <= det.candidate_lines(text, starts), filename


def test_clean_keeps_line_numbers_and_counts(secrets_sample):
    c = clean(secrets_sample.config_py(), "config.py")
    assert c.masked_lines == 4 and c.skip is None
    assert c.text.count("\n") == secrets_sample.config_py().count("\n")
    assert clean("x = 1\n", "a.py").text == "x = 1\n"
    assert clean("notes\n" + secrets_sample.pem, "notes.txt").skip == KEY_MATERIAL


def test_big_files_are_tokenized_in_pieces_with_the_same_rules(tmp_path, bpe_tok_path, secrets_sample,
                                                               monkeypatch):
    """Files over STREAM_BYTES go through the streaming path: masked per piece, key material anywhere skips
    the whole file, and the tokens equal the whole file's where the pieces end at unindented lines."""
    from indexer.tokenizer import load_tokenizer

    monkeypatch.setattr(ingest, "STREAM_BYTES", 10_000)
    monkeypatch.setattr(ingest, "STREAM_CHARS", 4_000)
    body = "".join(f"def handler_{i}(event):\n    return event.get({i!r}, None)\n\n\n" for i in range(150))
    big = body * 3 + secrets_sample.config_py() + body
    write_files(tmp_path / "r", {"big.py": big, "bigkey.py": body * 2 + 'K = """' + secrets_sample.pem + '"""\n'})
    tok = load_tokenizer(bpe_tok_path)
    doc = ingest.read_document(tmp_path / "r" / "big.py", 1 << 30, tok)
    assert doc.pieces is not None and len(doc.pieces) > 5 and doc.masked_lines == 4
    whole = ingest.read_document(tmp_path / "r" / "big.py", 1 << 30)    # no tokenizer: the whole text
    assert [int(t) for p in doc.pieces for t in p] == tok.encode(whole.text, add_special_tokens=False).ids
    assert ingest.read_document(tmp_path / "r" / "bigkey.py", 1 << 30, tok).skip == KEY_MATERIAL
    ds = Datastore.build([tmp_path / "r"], tmp_path / "ds", tokenizer=bpe_tok_path)
    assert [Path(p).name for p in ds.documents] == ["big.py"] and leaks(ds, secrets_sample.values()) == []
    assert stored_text(ds)[str(tmp_path / "r" / "big.py")] == whole.text
