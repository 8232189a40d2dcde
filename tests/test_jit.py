"""The compiled loops' disk cache (restbase/jit.py): one directory per state of the sources, old ones pruned."""
from __future__ import annotations

import os
import time
from pathlib import Path

from restbase import jit


def _tree(root: Path) -> None:
    for rel, text in (("rest_lsp/a.py", "x = 1\n"), ("indexer/b.py", "y = 2\n"), ("docs/c.md", "z\n")):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


def test_the_digest_follows_every_module(tmp_path):
    """A callee's file changed alone must give another cache directory: numba would keep its callers' machine
    code, the old callee inlined."""
    _tree(tmp_path)
    first = jit.sources_digest(tmp_path)
    assert jit.sources_digest(tmp_path) == first
    (tmp_path / "docs/c.md").write_text("not a module\n")
    assert jit.sources_digest(tmp_path) == first
    b = tmp_path / "indexer/b.py"
    b.write_text("y = 3\n")  # same size, another time
    os.utime(b, ns=(b.stat().st_atime_ns, b.stat().st_mtime_ns + 1_000_000))
    second = jit.sources_digest(tmp_path)
    assert second != first
    (tmp_path / "rest_lsp/new.py").write_text("")
    assert jit.sources_digest(tmp_path) not in (first, second)


def test_other_states_are_pruned_when_old(tmp_path, monkeypatch):
    monkeypatch.setattr(jit, "cache_root", lambda: tmp_path)
    base = tmp_path / "numba"
    old = time.time() - 2 * jit.STALE_AFTER_S
    dirs = []
    for i in range(jit.KEEP_SOURCE_STATES + 3):
        d = base / f"state{i}"
        d.mkdir(parents=True)
        os.utime(d, (old + i, old + i))  # state0 the least recently used
        dirs.append(d)
    recent = base / "recent"
    recent.mkdir()
    here = Path(jit._cache_dir())
    assert here.parent == base and here.name == jit.sources_digest() and here.is_dir()
    kept = {d.name for d in base.iterdir()}
    # the newest KEEP_SOURCE_STATES others stay (the recent one among them), the rest were a day old: removed
    assert kept == {here.name, "recent"} | {f"state{i}" for i in range(4, jit.KEEP_SOURCE_STATES + 3)}
    assert recent.is_dir() and not dirs[0].exists()
