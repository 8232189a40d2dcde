"""Prompt layouts: what a keystroke changes in the prompt, per FIM family, and token healing's cut."""
from __future__ import annotations

import pytest

from rest_lsp.model.prompts import FIM_FORMATS, build_prompt
from rest_lsp.service.layout import prompt_parts, resolve_layout, strip_lead
from rest_lsp.service.prompt import build_context

BODY = "import os\n\n\ndef read(path):\n    with open(path) as f:\n        data = f.read()\n"
AFTER = "\n\n\ndef write(path, data):\n    pass\n"


def parts_at(typed: str, layout: str = "line"):
    text = BODY + typed + AFTER
    prefix = BODY + typed
    line = prefix.count("\n")
    ctx = build_context(text, line, len(prefix) - prefix.rfind("\n") - 1)
    return prompt_parts(ctx, layout, 3000, 300)


def test_line_layout_keeps_everything_before_the_cursor_line_and_the_suffix():
    p = parts_at("        return da")
    assert p.prefix == BODY and p.suffix == AFTER and p.order == "psm"
    # the last word, with its space, is left out: the output must start with it
    assert (p.middle, p.lead) == ("        return", " da")
    assert (parts_at("        return ").middle, parts_at("        return ").lead) == ("        return", " ")
    assert (parts_at("        ").middle, parts_at("        ").lead) == ("       ", " ")
    assert (parts_at("        x.ite").middle, parts_at("        x.ite").lead) == ("        x.", "ite")
    assert (parts_at("        f(").middle, parts_at("        f(").lead) == ("        f(", "")


def test_typing_a_word_leaves_the_prompt_unchanged_and_psm_changes_at_every_key():
    line = [parts_at("        return d" + "ata"[:k]) for k in range(4)]
    assert len({(p.prefix, p.suffix, p.middle) for p in line}) == 1  # one prompt for the whole word
    assert [p.lead for p in line] == [" d", " da", " dat", " data"]
    psm = [parts_at("        return d" + "ata"[:k], "psm") for k in range(4)]
    assert len({p.prefix for p in psm}) == 4


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    from testmodels.tiny import make_tiny_model_dir

    return make_tiny_model_dir(tmp_path_factory.mktemp("layout") / "m")


@pytest.fixture
def tokenizer(tiny_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_dir))


@pytest.mark.parametrize("family", ["qwen", "starcoder", "deepseek"])
def test_a_keystroke_changes_only_the_prompt_end_in_every_family(tokenizer, family):
    """With the tiny tokenizer standing in for each family's (its markers added as special tokens)."""
    fim = FIM_FORMATS[family]
    tokenizer.add_special_tokens({"additional_special_tokens": [fim.prefix_token, fim.suffix_token, fim.middle_token]})
    a, b = parts_at("        data = f.re"), parts_at("        data = f.read(")
    ids_a = build_prompt(tokenizer, a.prefix, a.suffix, fim, middle=a.middle)
    ids_b = build_prompt(tokenizer, b.prefix, b.suffix, fim, middle=b.middle)
    shared = next((i for i, (x, y) in enumerate(zip(ids_a, ids_b)) if x != y), min(len(ids_a), len(ids_b)))
    assert shared > 0.9 * len(ids_a) and len(ids_b) - shared <= 6  # only the cursor line's new tokens change
    p, s, m = fim.token_ids(tokenizer)
    assert ids_b.index(m) < len(ids_b) - 1 and ids_b.index(p) < ids_b.index(s) < ids_b.index(m)


def test_auto_is_line_and_spm_needs_a_family_trained_on_it():
    assert resolve_layout("auto") == "line"
    assert resolve_layout("spm", ("psm",)) == "line"
    assert resolve_layout("spm", ("psm", "spm")) == "spm"
    with pytest.raises(ValueError):
        resolve_layout("sideways")


def test_strip_lead():
    assert strip_lead(" return x", " ret") == "urn x"
    assert strip_lead(" re", " ret") == ""  # still spelling it out
    assert strip_lead(" if x", " ret") == ""  # not what was typed: nothing to show
    assert strip_lead("abc", "") == "abc"


def test_an_anchor_keeps_the_lines_typed_below_it_in_the_middle():
    from rest_lsp.service.layout import next_anchor

    def ctx_at(typed):
        text = BODY + typed + AFTER
        prefix = BODY + typed
        return build_context(text, prefix.count("\n"), len(prefix) - prefix.rfind("\n") - 1)

    first = ctx_at("        x = 1")
    a = next_anchor(first, None, max_lines=3, max_chars=1000)
    assert a.offset == len(BODY)  # the cursor line's start
    later = ctx_at("        x = 1\n        y = 2\n        z")
    assert next_anchor(later, a, max_lines=3, max_chars=1000) == a  # kept: two lines below it
    p = prompt_parts(later, "line", 3000, 300, anchor=a.offset)
    assert p.prefix == BODY and p.middle == "        x = 1\n        y = 2\n       " and p.lead == " z"
    # the suffix and everything before the anchor are the same for every keystroke and every new line
    assert (p.prefix, p.suffix) == (parts_at("        x = 1", "line").prefix, AFTER)
    far = ctx_at("        x = 1\n        y = 2\n        z = 3\n        w = 4\n        v")
    moved = next_anchor(far, a, max_lines=3, max_chars=1000)
    assert moved.offset == len(far.prefix) - len("        v")  # past max_lines: the cursor line again
    edited = build_context("import sys\n" + BODY[10:] + "        x = 1\n        y" + AFTER, 7, 9)
    assert next_anchor(edited, a, max_lines=3, max_chars=1000) != a  # the text before it changed


def test_spm_puts_the_suffix_first_and_heals_the_end_of_the_text_before_the_cursor():
    p = parts_at("        return da", "spm")
    assert p.order == "spm" and p.suffix == AFTER
    assert p.prefix == BODY + "        return" and p.lead == " da" and p.middle == ""
