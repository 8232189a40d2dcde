"""Which files become documents: ignore files (pathspec), excluded folders, secrets, size, languages."""
from __future__ import annotations

from pathlib import Path

import pytest
from idx_helpers import write_files

from indexer.discover import Filters, IgnoreRules, Report, is_document, read_text, walk


def _rel(root: Path, filters=None, report=None) -> set[str]:
    return {str(c.path.relative_to(root)) for c in walk([root], filters or Filters(), report)}


@pytest.fixture()
def tree(tmp_path):
    r = tmp_path / "r"
    write_files(r, {
        ".gitignore": "*.log.py\nbuild_out/\n/only_top.py\n!keep.log.py\n",
        "a.py": "", "x.log.py": "", "keep.log.py": "", "only_top.py": "",
        "sub/only_top.py": "", "sub/.gitignore": "local.py\n!x.log.py\n", "sub/local.py": "", "sub/x.log.py": "",
        "sub/.ignore": "ignored_by_dot_ignore.py\n", "sub/ignored_by_dot_ignore.py": "",
        "build_out/gen.py": "", "node_modules/lib/index.js": "", ".git/hooks/x.py": "",
        "venvlike/pyvenv.cfg": "", "venvlike/lib/site.py": "", "__pycache__/m.py": "",
        "pkg.egg-info/x.py": "",
        ".env": "KEY=1", ".env.local": "KEY=2", "id_rsa": "k", "server.pem": "k", "conf/credentials.json": "{}",
        "main.rs": "", "README.md": "", "data.csv": "", "big.py": "x" * 2000,
    })
    return r


def test_walk_honours_ignores_exclusions_secrets_size_and_languages(tree):
    rep = Report()
    got = _rel(tree, Filters(max_file_size=1000), rep)
    assert got == {"a.py", "keep.log.py", "sub/only_top.py", "sub/x.log.py", "main.rs"}
    assert rep.skipped["too_large"] == 1 and rep.skipped["excluded_dir"] >= 5


def test_language_filter_and_extra_extensions(tree):
    got = _rel(tree, Filters(languages=("rust",), extensions=(".md",)))
    assert got == {"main.rs", "README.md"}
    everything = _rel(tree, Filters(languages=None))
    assert "data.csv" in everything and ".env" not in everything and "id_rsa" not in everything
    with pytest.raises(ValueError, match="unknown language"):
        Filters(languages=("klingon",))


def test_gitignore_can_be_turned_off_and_extra_patterns_added(tree):
    got = _rel(tree, Filters(use_gitignore=False, exclude_paths=("sub/",)))
    assert {"x.log.py", "only_top.py"} <= got and not any(p.startswith("sub/") for p in got)


def test_is_document_agrees_with_walk(tree):
    f = Filters(max_file_size=1000)
    rules = IgnoreRules(f)
    walked = _rel(tree, f)
    for p in tree.rglob("*"):
        if p.is_file() and p.stat().st_size <= 1000:
            ok, _ = is_document(p, [tree], f, rules)
            assert ok == (str(p.relative_to(tree)) in walked), p


def test_ignore_files_are_reread_when_they_change(tree):
    f = Filters()
    rules = IgnoreRules(f)
    assert is_document(tree / "a.py", [tree], f, rules)[0]
    (tree / ".gitignore").write_text("a.py\n")
    assert not is_document(tree / "a.py", [tree], f, rules)[0]


def test_read_text_decodes_counts_and_skips(tmp_path):
    p = tmp_path / "f.py"
    p.write_bytes(b"\xef\xbb\xbfok = 1\n")
    assert read_text(p, 100)[0] == "ok = 1\n"
    p.write_bytes(b"a\xffb\xfe")
    text, _, bad, skip = read_text(p, 100)
    assert skip is None and bad == 2 and text == "a\ufffdb\ufffd"
    p.write_bytes(b"ab\x00cd")
    assert read_text(p, 100)[3] == "binary"
    p.write_bytes(b"x" * 101)
    assert read_text(p, 100)[3] == "too_large"
