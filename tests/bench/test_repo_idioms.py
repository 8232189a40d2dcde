"""benchmarks/bench_repo_idioms.py without a model or a download: the held-out bodies, what each row's daemon
holds (the repository's other files, the open document and which source drafts from it), and the report."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import bench_repo_idioms as B  # noqa: E402

MODULE = '''def area(w, h):
    """The area."""
    total = w * h
    return total


def twice(x):
    y = x + x
    return y
'''


@pytest.fixture()
def project(tmp_path):
    root = tmp_path / "proj"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "shapes.py").write_text(MODULE)
    (root / "pkg" / "other.py").write_text("def sibling_idiom_marker(a):\n    b = a\n    return b\n")
    (root / "setup.py").write_text("def setup_only():\n    x = 1\n    return x\n")  # not in a package
    return root


def test_held_out_bodies_leave_one_indented_line_with_the_cursor_at_its_end(project):
    bodies = B.held_out(project, functions=10, per_file=6, seed=0)
    assert {b.file for b in bodies} == {"pkg/shapes.py", "pkg/other.py"}
    area = next(b for b in bodies if b.id == "pkg/shapes.py:3")
    lines = area.document.split("\n")
    assert lines[area.line] == "    " and area.column == 4
    assert lines[:area.line] == MODULE.split("\n")[:2]  # the signature and the docstring stay
    assert "total" not in area.document and "def twice(x):" in area.document
    assert len(B.held_out(project, functions=1, per_file=6, seed=0)) == 1


@pytest.mark.parametrize("indexed,document,live,buffer", [
    (True, "repository", True, False),   # the daemon: the open buffer in the indexed folder's live shard
    (False, "repository", False, True),  # no indexed folder: the buffer feeds the context source
    (True, "context", False, True),
    (True, "both", True, True),
])
def test_prepare_puts_the_document_where_the_daemon_would(project, tiny_dir, tmp_path, indexed, document, live,
                                                          buffer):
    from rest_lsp.engine.drafter import Drafter
    from rest_lsp.engine.policy import make_sources

    bodies = [b for b in B.held_out(project, functions=10, per_file=6, seed=0) if b.file == "pkg/shapes.py"]
    ws = B.Workspace(project, bodies, str(tiny_dir), tmp_path / "stores")
    drafter = Drafter(make_sources("rest", repository=ws))
    rec = type("Rec", (), {"id": bodies[0].id})()
    ws.prepare(rec, drafter, indexed, document)
    context = next(s for s, _ in drafter.sources if s.name == "context")
    store = ws.stores["pkg/shapes.py"]
    tok = store.tokenizer
    assert ("edited" in store.live_names()) == live
    assert ("edited" in context.buffers) == buffer
    # the repository holds the project's other files, never the held-out one
    marker = tok.encode("def sibling_idiom_marker(a", add_special_tokens=False).ids
    area = tok.encode("def area(w, h", add_special_tokens=False).ids
    full = min(len(marker), 16)
    if indexed:
        assert ws.search_rows(marker, n_max=16, n_min=2, k=8, max_len=4).match_len == full
        # the held-out file only through the open document in the live shard
        assert (ws.search_rows(area, n_max=16, n_min=2, k=8, max_len=4).match_len == min(len(area), 16)) == live
    else:
        assert ws.search_rows(marker, n_max=16, n_min=2, k=8, max_len=4).match_len == 0  # an empty workspace set
    ws.prepare(rec, drafter, True, "repository")  # the next record starts clean
    assert "edited" in store.live_names() and "edited" not in context.buffers


def test_format_table_lists_every_row(tmp_path):
    def row(name, b, m):
        return {"name": name, "budget": b, "mean_accepted": m, "covered_mean_accepted": 3.0,
                "retrieval_ms_p50": 1.0, "retrieval_ms_p99": 2.0, "accepted_tokens_by_source": {"context": 5}}

    report = {"projects": {"p==1": {"functions": 2, "held_out_files": ["a.py"], "output_tokens": 9, "results": [
        row("with repository", 4, 2.0), row("with repository", 64, 2.5),
        row("without repository", 4, 1.9), row("without repository", 64, 2.4)]}}}
    table = B.format_table(report)
    assert "M@4" in table and "M@64" in table
    assert "  2.000   2.500" in table and "  1.900   2.400" in table and "1.00 / 2.00" in table
