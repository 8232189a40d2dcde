"""benchmarks/bench_crossfile.py's line flags: which lines need another file, or text outside the prompt window."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from bench_crossfile import mark_cross  # noqa: E402

HELPERS = "def normalize_weight(w):\n    return w / 100\n\nclass Registry:\n    pass\n"


def _case(ws: Path, doc: str, target: str) -> dict:
    lines = doc.split("\n")
    return {"file": ws / "pkg" / "current.py", "doc": doc, "line": len(lines) - 1, "col": len(lines[-1]),
            "target": target, "kind": "line"}


def test_a_line_needs_another_file_only_for_a_name_its_own_file_never_mentions(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "helpers.py").write_text(HELPERS)
    doc = "import math\n\ndef area(r):\n    "
    (tmp_path / "pkg" / "current.py").write_text(doc)
    needs = _case(tmp_path, doc, "return normalize_weight(math.pi * r * r)")
    known = _case(tmp_path, "from .helpers import normalize_weight\n\ndef area(r):\n    ",
                  "return normalize_weight(math.pi * r * r)")
    local = _case(tmp_path, doc, "return math.pi * r * r")
    builtin = _case(tmp_path, doc, "return len(str(r))")
    mark_cross([needs, known, local, builtin], tmp_path)
    assert needs["cross"] and needs["unseen"] and needs["unseen_repo"]
    assert not known["cross"]                     # the import names it: the prompt shows the name
    assert not local["cross"] and not local["unseen"]
    assert not builtin["cross"] and not builtin["unseen"]


def test_unseen_is_measured_against_the_prompt_window_not_the_whole_file(tmp_path):
    (tmp_path / "pkg").mkdir()
    far = "def far_away_helper(x):\n    return x\n" + "# filler line\n" * 400 + "def f(y):\n    "
    (tmp_path / "pkg" / "current.py").write_text(far)
    case = _case(tmp_path, far, "return far_away_helper(y)")
    mark_cross([case], tmp_path, window=(3000, 300))
    assert case["unseen"] and case["unseen_repo"] and not case["cross"]   # the file defines it, out of sight
    assert case["unseen_own"]
    wide = _case(tmp_path, far, "return far_away_helper(y)")
    mark_cross([wide], tmp_path, window=(len(far), 300))
    assert not wide["unseen"] and not wide["unseen_own"]
    # imported at the top, out of sight: the file's own too; a name only another file defines is not
    imported = "from collections import OrderedDict\n" + "# filler line\n" * 400 + "def f(y):\n    "
    (tmp_path / "pkg" / "helpers.py").write_text(HELPERS)
    own = _case(tmp_path, imported, "return OrderedDict(y)")
    other = _case(tmp_path, imported, "return normalize_weight(y)")
    mark_cross([own, other], tmp_path, window=(3000, 300))
    assert own["unseen"] and own["unseen_own"] and not own["unseen_repo"]
    assert other["unseen"] and other["unseen_repo"] and not other["unseen_own"]


def test_a_new_module_gives_its_lines_with_the_lines_above_and_nothing_below_while_it_fits(tmp_path):
    from bench_crossfile import whole_file_cases
    from bench_typing import prepare_whole

    root = tmp_path / "proj"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "helpers.py").write_text(HELPERS)
    (root / "pkg" / "new.py").write_text("import math\n\n\nclass Area:\n    def f(self, r):\n        return r\n")
    ws, files = prepare_whole(root, ["pkg/new.py"], tmp_path / "work")
    assert (ws / "pkg" / "new.py").read_text() == ""                  # in the workspace, but empty
    cases = whole_file_cases(files, lambda chars: True)
    by_line = {c["line"]: c for c in cases}
    assert sorted(by_line) == [0, 3, 4, 5]                             # blank lines are no case
    assert by_line[0]["doc"] == "" and by_line[0]["target"] == "import math"
    assert by_line[5]["doc"] == "import math\n\n\nclass Area:\n    def f(self, r):\n        "
    assert by_line[5]["col"] == 8 and by_line[5]["target"] == "return r"
    assert all(c["kind"] == "line" for c in cases)
    # only while the document fits the window (`auto`'s block): the later lines' documents are longer
    short = whole_file_cases(files, lambda chars: chars < 20)
    assert sorted(c["line"] for c in short) == [0, 3]


def test_a_configuration_may_carry_its_own_block_budget():
    import pytest
    from bench_crossfile import CONFIGS, config_of

    assert config_of("all", 512) == (CONFIGS["all"], 512)
    assert config_of("definitions@1024", 512) == (("definitions",), 1024)
    assert config_of("none", 512) == ((), 512)
    for bad in ("everything", "all@lots", "all@-5"):
        with pytest.raises(ValueError):
            config_of(bad, 512)
