"""Per-edit cost that follows the edit: FastTextDocument (rest_lsp/documents.py) against pygls' own
TextDocument on random edits, and LiveBuffer (rest_lsp/service/live.py) re-tokenizing only what an edit
touched, against tokenizing every chunk afresh."""
from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from lsprotocol import types
from pygls.workspace.position_codec import PositionCodec
from pygls.workspace.text_document import TextDocument

from indexer.secrets import clean
from rest_lsp.documents import FastTextDocument, changed_span, column, edit_end, units
from rest_lsp.service.live import CHUNK_CHARS, LONG_LINE, LiveBuffer, split_lines

ALPHABET = st.sampled_from(list("abc xyz\t\n") + ["\r\n", "é", "😀", "中", "ﬀ"])
ENCODINGS = [types.PositionEncodingKind.Utf16, types.PositionEncodingKind.Utf8, types.PositionEncodingKind.Utf32]


def pair(text: str, encoding) -> tuple[TextDocument, FastTextDocument]:
    codec = PositionCodec(encoding)
    return (TextDocument("file:///a.py", text, position_codec=codec),
            FastTextDocument("file:///a.py", text, position_codec=codec))


@st.composite
def edit_in(draw, doc: TextDocument):
    """A change inside the document (pygls clamps positions past a line differently from LSP's rule)."""
    lines = doc.lines or [""]

    def position():
        line = draw(st.integers(0, len(lines) - 1))
        text = lines[line].rstrip("\r\n")
        n = doc.position_codec.client_num_units(text)
        # a position between two code points (never inside a surrogate pair or a UTF-8 sequence)
        cps = draw(st.integers(0, len(text)))
        return types.Position(line, doc.position_codec.client_num_units(text[:cps]) if n else 0)

    a, b = sorted([position(), position()], key=lambda p: (p.line, p.character))
    return types.TextDocumentContentChangePartial(range=types.Range(a, b), text="".join(draw(st.lists(ALPHABET, max_size=8))))


@settings(max_examples=200, deadline=None)
@given(data=st.data(), start=st.lists(ALPHABET, max_size=60), encoding=st.sampled_from(ENCODINGS))
def test_fast_documents_apply_edits_as_pygls_does(data, start, encoding):
    slow, fast = pair("".join(start), encoding)
    for _ in range(6):
        change = data.draw(edit_in(slow))
        slow.apply_change(change)
        fast.apply_change(change)
        assert fast.source == slow.source
        for line, text in enumerate(slow.lines):
            assert fast.line_text(line) == text.rstrip("\r\n")
            n = slow.position_codec.client_num_units(text.rstrip("\r\n"))
            assert fast.columns(types.Position(line, n)) == (line, len(text.rstrip("\r\n")))
            assert units(text, encoding) == slow.position_codec.client_num_units(text)


@settings(max_examples=300, deadline=None)
@given(start=st.lists(ALPHABET, max_size=40), data=st.data())
def test_a_whole_text_change_is_located_by_its_common_prefix_and_suffix(start, data):
    old = "".join(start)
    a = data.draw(st.integers(0, len(old)))
    b = data.draw(st.integers(a, len(old)))
    ins = "".join(data.draw(st.lists(ALPHABET, max_size=8)))
    new = old[:a] + ins + old[b:]
    span = changed_span(old, new)
    if old == new:
        assert span is None and edit_end(old, new) is None
        return
    p, old_end, new_end = span
    assert new == old[:p] + new[p:new_end] + old[old_end:]          # one edit that gives the new text
    assert new_end - p <= len(ins) and old_end - p <= b - a          # never more than what really changed
    if a == b:   # an insertion: the guess is its end, or past it where the text after repeats what was typed
        assert new_end >= a + len(ins) and new[a + len(ins):new_end] == new[a:new_end - len(ins)]
    line, col = edit_end(old, new)
    assert new.count("\n", 0, new_end) == line and new.split("\n")[line][:col] == new[new_end - col:new_end]


def test_where_a_whole_text_change_leaves_the_cursor():
    src = "def f(x):\n    return x\n"
    assert edit_end(src, src.replace("return x", "return x + 1")) == (1, 16)     # typed at the line's end
    assert edit_end(src, src.replace("x):", "xy):")) == (0, 8)                    # in the middle of a line
    assert edit_end(src, src.replace("return x", "return")) == (1, 10)           # deleted: where it was
    assert edit_end(src, src + "\ndef g():\n    pass") == (4, 8)                # a paste of several lines
    assert edit_end("aa", "aaa") == (0, 3)                                       # a repeat: after the run
    assert edit_end("s = '😀'\r\n", "s = '😀😀'\r\n") == (0, 7)                  # code points, as the service
    assert edit_end(src, src) is None
    big = "x = 1\n" * 200_000                                                   # 1.2 MB: cheap to locate
    assert edit_end(big, big[:600_000] + "y" + big[600_000:]) == (100_000, 1)


def test_a_document_keeps_the_cursor_of_its_last_whole_text_change():
    doc = FastTextDocument("file:///a.py", "ab\ncd\n")
    doc.apply_change(types.TextDocumentContentChangeWholeDocument(text="ab\ncXd\n"))
    assert doc.source == "ab\ncXd\n" and doc.full_change_end == (1, 2)
    doc.apply_change(types.TextDocumentContentChangePartial(
        range=types.Range(types.Position(0, 0), types.Position(0, 0)), text="z"))
    assert doc.full_change_end is None      # an incremental change says where it is itself


def test_other_line_breaks_keep_pygls_semantics():
    for text in ("a\rb\nc", "a\u2028b\nc", "x\x0cy"):
        slow, fast = pair(text, types.PositionEncodingKind.Utf16)
        change = types.TextDocumentContentChangePartial(
            range=types.Range(types.Position(1, 0), types.Position(1, 1)), text="Z")
        slow.apply_change(change)
        fast.apply_change(change)
        assert fast.source == slow.source and not fast.plain
    # splitting a \r\n with an edit leaves a lone \r: from then on, pygls' semantics
    slow, fast = pair("ab\r\ncd", types.PositionEncodingKind.Utf16)
    change = types.TextDocumentContentChangePartial(range=types.Range(types.Position(0, 2), types.Position(1, 0)),
                                                    text="\rX\n")
    for d in (slow, fast):
        d.apply_change(change)
    assert fast.source == slow.source


def test_columns_past_the_line_and_astral_characters():
    assert column("a😀b", 3, types.PositionEncodingKind.Utf16) == 2
    assert column("a😀b", 9, types.PositionEncodingKind.Utf16) == 3 + 5
    assert column("aé", 3, types.PositionEncodingKind.Utf8) == 2
    assert units("a😀", types.PositionEncodingKind.Utf16) == 3


@pytest.fixture(scope="module")
def tiny_tokenizer():
    from testmodels.tiny import train_tokenizer

    return train_tokenizer()


def counting_encoder(tokenizer):
    calls = []

    def encode(texts):
        calls.append(sum(map(len, texts)))
        return [tokenizer.encode(t, add_special_tokens=False) for t in texts]

    return encode, calls


def test_live_buffer_tokenizes_what_the_edit_touched(tiny_tokenizer):
    rng = random.Random(7)
    lines = [f"def function_{i}(a, b):\n    return a * {i} + b\n\n" for i in range(4000)]
    text = "".join(lines)
    encode, calls = counting_encoder(tiny_tokenizer)
    buf = LiveBuffer("big.py", encode, clean)
    buf.update(text)
    assert calls[-1] == len(text) and "".join(c.text for c in buf.chunks) == text
    for _ in range(60):
        p = rng.randrange(len(text))
        q = min(len(text), p + rng.randrange(0, 30))
        text = text[:p] + rng.choice(["", "x", "\n", "y = 2\n", "(\n)"]) + text[q:]
        buf.update(text)
        # what a fresh tokenization of the same chunks gives, and no more than the edit's chunks retokenized
        assert "".join(c.text for c in buf.chunks) == text
        assert buf.tokenized_chars <= 4 * CHUNK_CHARS
        assert all(c.text.endswith("\n") for c in buf.chunks[:-1])
    expect = [tiny_tokenizer.encode(clean(c.text, "big.py").text, add_special_tokens=False) for c in buf.chunks]
    assert buf.tokens().tolist() == [t for ids in expect for t in ids]


def test_a_one_megabyte_line_costs_no_tokenization(tiny_tokenizer):
    encode, calls = counting_encoder(tiny_tokenizer)
    buf = LiveBuffer("min.js", encode, clean)
    line = "var a=" + ",".join(str(i) for i in range(200_000)) + ";"
    assert len(line) > 1_000_000
    buf.update("// header\n" + line + "\nfunction f() { return 1; }\n")
    assert buf.long_lines == 1
    n = len(calls)
    for k in range(20):
        line = line[:500_000] + str(k) + line[500_000:]
        buf.update("// header\n" + line + "\nfunction f() { return 1; }\n")
        assert buf.tokenized_chars == 0
    assert len(calls) == n
    assert "function f" in tiny_tokenizer.decode(buf.tokens().tolist())


def test_secrets_in_a_buffer_are_masked_per_chunk(tiny_tokenizer, secrets_sample):
    encode, _ = counting_encoder(tiny_tokenizer)
    buf = LiveBuffer("config.py", encode, clean)
    body = "".join(f"x_{i} = {i}\n" for i in range(2000))
    buf.update(body + secrets_sample.config_py())
    assert buf.masked_lines == 4 and not buf.key_material
    decoded = tiny_tokenizer.decode(buf.tokens().tolist())
    assert not any(v in decoded for v in secrets_sample.values().values())
    buf.update(body + secrets_sample.config_py() + secrets_sample.pem)
    assert buf.key_material


def test_split_lines_bounds():
    text = "a\n" * 5000 + "b" * (LONG_LINE + 1) + "\nc\n"
    pieces = split_lines(text)
    assert "".join(t for t, _ in pieces) == text
    assert [lg for _, lg in pieces].count(True) == 1
    assert all(len(t) <= CHUNK_CHARS + 2 for t, lg in pieces if not lg)
