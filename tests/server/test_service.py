"""The service's pure rules without a server process: prompt shaping and configuration. The scheduling of
predictions, warm-ups and budgets is in test_latency.py; the e2e tests run the real engine."""
from __future__ import annotations

import pytest

from rest_lsp.service.config import ServerConfig, merge
from rest_lsp.service.prompt import PositionError, Selected, build_context, shape_completion


# ---- prompt rules -------------------------------------------------------------------------------
def test_single_vs_multi_line_rules():
    text = "def f(x):\n    \n    y = g(x)\n"
    assert build_context(text, 1, 4).multiline                  # empty line
    assert build_context(text, 0, 9).multiline                  # right after a block opener
    assert not build_context(text, 2, 10).multiline             # code follows the cursor: "(x)"
    assert not build_context("x = foo", 0, 7).multiline         # end of an ordinary line
    assert build_context("call(", 0, 5).multiline               # after "(" with nothing following
    assert not build_context("if (a) {}", 0, 8).multiline       # a closer follows the cursor


def test_fim_prefix_suffix_and_positions():
    ctx = build_context("ab\ncd\r\nef", 1, 1)
    assert (ctx.prefix, ctx.suffix) == ("ab\nc", "d\r\nef")
    assert build_context("ab\ncd\r\nef", 1, 99).prefix == "ab\ncd"    # past the line's end: its end
    with pytest.raises(PositionError, match="past the end"):
        build_context("ab\n", 5, 0)
    with pytest.raises(PositionError):
        build_context("ab", 0, -1)


def test_prompt_window_is_stable_while_typing():
    body = "".join(f"line {i} of text\n" for i in range(2000))
    a = build_context(body, 1500, 0).prompt_prefix(6000)
    b = build_context(body + "", 1500, 3).prompt_prefix(6000)
    assert len(a) <= 6000 and a.startswith("line ")
    assert a[:100] == b[:100]          # same start: the KV cache of the shared prefix stays usable


def test_selected_completion_is_applied_and_kept():
    ctx = build_context("x = os.pa", 0, 9, Selected((0, 7), (0, 9), "path"))
    assert ctx.prefix == "x = os.path" and ctx.lead == "path" and ctx.range_start == (0, 7)
    with pytest.raises(PositionError):
        build_context("x = os.pa", 0, 5, Selected((0, 7), (0, 9), "path"))


def test_shaping():
    single = build_context("y = f(", 0, 6)
    single_after = build_context("y = f()", 0, 6)
    assert shape_completion("a, b)\nmore", single_after, max_lines=8, truncated=False) == "a, b"
    multi = build_context("def f():\n    \n    return 1\n", 1, 4)
    out = shape_completion("x = 1\n    y = 2\n    return 1\n    z", multi, max_lines=8, truncated=False)
    assert out == "x = 1\n    y = 2"                         # stops before repeating the suffix's line
    assert shape_completion("a\n    b\n    c\n    d", multi, max_lines=2, truncated=False) == "a\n    b"
    # the time budget ran out: the line being decoded keeps its whole words, on a later line too ...
    assert shape_completion("x = 1\n    y = 2\n    z = sq", multi, max_lines=8, truncated=True) == \
        "x = 1\n    y = 2\n    z ="
    # ... and is left out when it has none yet, or when it is the start of the code after the cursor
    assert shape_completion("x = 1\n    y = 2\n    zz", multi, max_lines=8, truncated=True) == "x = 1\n    y = 2"
    assert shape_completion("x = 1\n    return 1 ", multi, max_lines=8, truncated=True) == "x = 1"
    assert shape_completion("x = 1\n    return 2 ", multi, max_lines=8, truncated=True) == "x = 1\n    return 2"
    assert shape_completion("x = 1\nprint(", multi, max_lines=8, truncated=True) == "x = 1"  # out of the block
    assert shape_completion("value_one + valu", build_context("x = ", 0, 4), max_lines=8, truncated=True) \
        == "value_one +"
    assert shape_completion("ok\x00\x01garbage", single, max_lines=8, truncated=False) == "ok"
    # partialWords false: every token decided, a word's start too, less a character not wholly decoded
    assert shape_completion("value_one + valu", build_context("x = ", 0, 4), max_lines=8, truncated=True,
                            whole_words=False) == "value_one + valu"
    assert shape_completion("x = 1\n    y = 2\n    zz", multi, max_lines=8, truncated=True, whole_words=False) == \
        "x = 1\n    y = 2\n    zz"
    assert shape_completion("name = \"caf\ufffd", single, max_lines=8, truncated=True, whole_words=False) == \
        "name = \"caf"
    assert shape_completion("x = 1\n    return 1", multi, max_lines=8, truncated=True, whole_words=False) == "x = 1"


# ---- configuration ------------------------------------------------------------------------------
def test_config_merge_camel_case_sections_and_errors():
    cfg, changed, problems = merge(ServerConfig(), {"rest-lsp": {"maxTokens": 10, "timeBudgetMs": 0,
                                                                 "languages": "python", "bogus": 1,
                                                                 "precision": "fp64"}})
    assert cfg.max_tokens == 10 and cfg.time_budget_ms == 0 and cfg.languages == ["python"]
    assert changed == {"max_tokens", "time_budget_ms", "languages"}
    assert any("bogus" in p for p in problems) and any("precision" in p for p in problems)
    cfg2, changed2, _ = merge(cfg, {"max_tokens": -1})
    assert cfg2.max_tokens == 10 and not changed2


def test_documented_options_match_the_defaults():
    """docs/daemon.md's configuration table lists every option with its real default."""
    import json
    from pathlib import Path

    from rest_lsp.service.config import describe

    doc = (Path(__file__).resolve().parents[2] / "docs" / "daemon.md").read_text()
    rows = {}
    for line in doc.splitlines():
        parts = [p.strip() for p in line.split("|")]
        if len(parts) > 3 and parts[1].startswith("`") and parts[2].startswith("`"):
            rows[parts[1].strip("`")] = json.loads(parts[2].strip("`"))
    assert rows == {name: default for name, default in describe()}


def test_every_precision_is_accepted_and_offered_by_the_vs_code_extension():
    """One list of precisions (rest_lsp.model.PRECISIONS): the daemon's settings take each, and the VS Code
    extension's setting offers exactly those."""
    import json
    from pathlib import Path

    from rest_lsp.model import PRECISIONS

    for p in PRECISIONS:
        cfg, changed, problems = merge(ServerConfig(), {"precision": p})
        assert cfg.precision == p and not problems
    package = Path(__file__).resolve().parents[2] / "editors" / "vscode" / "package.json"
    props = json.loads(package.read_text())["contributes"]["configuration"]["properties"]
    assert props["restLsp.precision"]["enum"] == list(PRECISIONS)


def test_multi_line_stops_where_the_block_ends():
    ctx = build_context("class A:\n    def total(self):\n        \n\n    def other(self):\n        pass\n", 2, 8)
    text = "return sum(self.items)\n\n\ndef main():\n    a = A()"
    assert shape_completion(text, ctx, max_lines=8, truncated=False) == "return sum(self.items)"
    opener = build_context("def f(x):", 0, 9)
    body = "\n    if x:\n        return 1\n    return 2\nprint(f(3))"
    assert shape_completion(body, opener, max_lines=8, truncated=False) == \
        "\n    if x:\n        return 1\n    return 2"


def test_decoding_stops_where_the_block_ends():
    """block_end_cut is the engine's stop_fn for multi-line requests: it must agree with the shaping rule and
    fire only once a later line's indentation is known."""
    from rest_lsp.service.prompt import block_end_cut

    ctx = build_context("class A:\n    def total(self):\n        \n\n    def other(self):\n        pass\n", 2, 8)
    indent = ctx.block_indent()
    assert indent == 8
    assert block_end_cut("return sum(self.items)\n\n    ", indent) is None     # the next line is not known yet
    text = "return sum(self.items)\n\n    def more(self):"
    cut = block_end_cut(text, indent)
    assert text[:cut] == "return sum(self.items)\n\n"
    assert shape_completion(text, ctx, max_lines=8, truncated=False) == "return sum(self.items)"
    assert build_context("def f(x):", 0, 9).block_indent() == 1                 # after an opener: deeper
