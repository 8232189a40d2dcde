"""Stop rules: lines, the infill's suffix, end of sequence, time, cancellation."""
import types

import pytest

from rest_lsp.engine import ContextSource, Engine, GenerationConfig
from rest_lsp.engine.stops import lines_cut, suffix_cut

from ._models import VOCAB, plain_greedy, random_prompt, tiny_model

ALPHABET = "abcdefgh(): =\n\n\n\n" + "ijklmnopqrstuvwxyz0123456789ABCDEFGHIJKLMNOPQRSTU"[: VOCAB - 17]
assert len(ALPHABET) == VOCAB


class CharTokenizer:
    """Token i is ALPHABET[i]; several ids are newlines so outputs have lines."""

    eos_token_id = None
    bos_token_id = 0

    def decode(self, ids, skip_special_tokens=False):
        return "".join(ALPHABET[i] for i in ids)


def _engine(seed=0, sources=()):
    model = tiny_model("qwen2", seed)
    loaded = types.SimpleNamespace(model=model, tokenizer=CharTokenizer(), device=None, name="tiny", precision="fp32")
    return model, Engine(loaded, sources, eos_token_ids=[])


def test_lines_cut():
    assert lines_cut("ab\ncd\nef", 1) == 2
    assert lines_cut("ab\ncd\nef", 2) == 5
    assert lines_cut("ab\ncd", 3) is None
    assert lines_cut("\n\n  x = 1\ny", 1) == 9  # leading blank lines do not count


def test_suffix_cut_rules():
    # the suffix continues the cursor's line: `print(|)` completed as `"hi")` + newline
    assert suffix_cut('"hi")\nmore', ")\nfoo()") == 4
    assert suffix_cut('"hi")', ")\n") is None  # the line is not complete yet
    # the suffix starts on a later line: the output reaches its first non-blank line
    out = "return x * 2\n\n\ndef g():\n    pass\n"
    assert out[: suffix_cut(out, "\n\ndef g():\n    pass\n")] == "return x * 2"
    assert suffix_cut("return 1\n", "\n\ndef g():\n") is None
    assert suffix_cut("x = 1\n", "   \n\n") is None  # a blank suffix never stops anything
    # a line that merely starts like the suffix's line is not a repeat
    assert suffix_cut("def g(): return 3\n", "\ndef g():\n") is None


def test_max_lines_cuts_text_and_tokens():
    model, engine = _engine(0)
    prompt = random_prompt(0, 8)
    ref = plain_greedy(model, prompt, 60)
    text = CharTokenizer().decode(ref)
    assert lines_cut(text, 2) is not None, "the reference must have lines for this test to mean anything"
    res = engine.generate(prompt, GenerationConfig(max_new_tokens=60, max_lines=2))
    assert res.stop_reason == "max_lines"
    assert res.text == text[: lines_cut(text, 2)]
    assert res.tokens == ref[: len(res.tokens)] and CharTokenizer().decode(res.tokens).startswith(res.text)
    assert sum(res.accepted) == len(res.tokens)


def test_stop_text_stops_where_output_repeats_the_suffix():
    model, engine = _engine(1, [(ContextSource(), 1.0)])
    prompt = random_prompt(1, 8)
    ref = plain_greedy(model, prompt, 80)
    text = CharTokenizer().decode(ref)
    lines = text.split("\n")
    # the suffix is the document after the cursor: a later line of what the model will write
    target = next(i for i, ln in enumerate(lines) if i >= 2 and ln.strip() and i < len(lines) - 1)
    suffix = "\n" + "\n".join(lines[target:])
    res = engine.generate(prompt, GenerationConfig(max_new_tokens=80, stop_text=suffix))
    assert res.stop_reason == "stop_text"
    assert res.text == "\n".join(lines[:target]).rstrip()


def test_eos_is_not_emitted_and_stops():
    model = tiny_model("llama", 2)
    prompt = random_prompt(2, 9)
    ref = plain_greedy(model, prompt, 30)
    eos = ref[7]
    res = Engine(model, [(ContextSource(), 1.0)], eos_token_ids=[eos]).generate(
        prompt, GenerationConfig(max_new_tokens=30, draft_budget=4))
    assert res.stop_reason == "eos" and res.tokens == ref[: ref.index(eos)]


def test_time_budget_and_cancellation():
    model, engine = _engine(3)
    prompt = random_prompt(3, 10)
    ref = plain_greedy(model, prompt, 20)
    res = engine.generate(prompt, GenerationConfig(max_new_tokens=20, time_budget_s=0.0))
    assert res.stop_reason == "time" and res.tokens == ref[:1]
    polls = []

    def should_stop():
        polls.append(1)
        return len(polls) > 3

    res = engine.generate(prompt, GenerationConfig(max_new_tokens=20), should_stop=should_stop)
    assert res.stop_reason == "cancelled" and res.tokens == ref[:4] and res.steps == 4
    # the engine stays usable and exact after a cancellation
    assert engine.generate(prompt, GenerationConfig(max_new_tokens=20)).tokens == ref


def test_text_rules_need_a_tokenizer():
    with pytest.raises(ValueError, match="tokenizer"):
        Engine(tiny_model(), eos_token_ids=[]).generate([1, 2], GenerationConfig(max_lines=1))


def test_stop_text_with_max_lines_and_at_the_end_of_sequence():
    model, engine = _engine(4)
    prompt = random_prompt(4, 8)
    ref = plain_greedy(model, prompt, 60)
    text = CharTokenizer().decode(ref)
    first = text.split("\n")[0]
    assert len(first) >= 3 and "\n" in text
    # the cursor sits before the last 2 characters of the line the model writes: the suffix holds them
    suffix = first[-2:] + "\nrest of file"
    res = engine.generate(prompt, GenerationConfig(max_new_tokens=60, max_lines=1, stop_text=suffix))
    assert res.stop_reason == "stop_text" and res.text == first[:-2]
    # the model ends (eos) right after repeating the suffix's text: the last line counts as complete
    nl = text.index("\n")
    eos_engine = Engine(engine.model, eos_token_ids=[ref[nl]])
    eos_engine.tokenizer = CharTokenizer()
    res = eos_engine.generate(prompt, GenerationConfig(max_new_tokens=60, stop_text=first[-2:]))
    assert res.stop_reason == "stop_text" and res.text == first[:-2]


def test_stop_fn_ends_decoding_where_the_caller_says():
    """A caller's rule (the daemon's block end) stops decoding early and cuts the output at its offset."""
    model, engine = _engine(seed=2)
    prompt = random_prompt(2, 8)
    full = engine.generate(prompt, GenerationConfig(max_new_tokens=30, draft_budget=0))
    cut_at = 5
    res = engine.generate(prompt, GenerationConfig(
        max_new_tokens=30, draft_budget=0, stop_fn=lambda text: cut_at if len(text) > cut_at else None))
    assert res.stop_reason == "stop_fn"
    assert res.text == full.text[:cut_at]
    assert res.tokens == full.tokens[:cut_at]      # one character per token with this tokenizer
    assert res.steps < full.steps                  # decoding ended early, not only the text
