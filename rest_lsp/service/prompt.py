"""From a document and a cursor to what the model sees, and from the model's text to what the editor shows.

Positions here are (line, column) in code points of Python strings; the protocol layer converts the client's
UTF-16 units. Rules:
- single line when anything but whitespace follows the cursor on its line (a closing bracket too: the
  suggestion then has to fit before it), or when the cursor ends a line that does not open a block;
- multi-line when the cursor sits on an empty (whitespace-only) line, or right after a block opener
  (`:` `{` `(` `[` `=>` `do` `then`...).
The text after the cursor is the fill-in-the-middle suffix. A selected completion item (LSP
`selectedCompletionInfo`) is applied to the prefix first, and every result starts with its text.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

BLOCK_OPENER = re.compile(r"(:|\{|\(|\[|=>|\bdo|\bthen|\bbegin)\s*$")
CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\ufffd]")
PREFIX_ANCHOR = 2048  # prefix windows start at multiples of this (then the next line) so the prompt start
                      # stays put while typing and the KV cache of the shared prefix stays reusable


class PositionError(ValueError):
    """A position outside the document (the protocol layer answers InvalidParams)."""


@dataclass(frozen=True)
class Selected:
    """The completion item selected in the editor's popup: replaces [start, end) with text."""
    start: tuple[int, int]
    end: tuple[int, int]
    text: str


@dataclass(frozen=True)
class CompletionContext:
    prefix: str          # whole document before the cursor (selected item applied)
    suffix: str          # whole document after the cursor
    multiline: bool
    line: int            # cursor
    column: int
    range_start: tuple[int, int]   # where returned items start replacing (cursor, or the selected item's start)
    lead: str            # text every returned item must start with (the selected item's text, else "")

    def prompt_prefix(self, max_chars: int) -> str:
        """The tail of the prefix for the prompt, starting at a stable line boundary."""
        if len(self.prefix) <= max_chars:
            return self.prefix
        start = len(self.prefix) - max_chars
        start = -(-start // PREFIX_ANCHOR) * PREFIX_ANCHOR  # round up: stable while typing within a block
        nl = self.prefix.find("\n", start)
        return self.prefix[nl + 1:] if 0 <= nl < len(self.prefix) - 1 else self.prefix[start:]

    def prompt_suffix(self, max_chars: int) -> str:
        if len(self.suffix) <= max_chars:
            return self.suffix
        cut = self.suffix.rfind("\n", 0, max_chars)
        return self.suffix[: cut + 1 if cut > 0 else max_chars]

    def infill_in_line(self) -> bool:
        """Text (not only whitespace) follows the cursor on its line: the completion fills the line's middle."""
        nl = self.suffix.find("\n")
        return bool((self.suffix if nl < 0 else self.suffix[:nl]).strip())

    def ahead_indent(self) -> int:
        """Like block_indent, for decoding past the cursor's line: after an ordinary statement the next lines
        at its indentation still belong to the block."""
        line_before = self.prefix[self.prefix.rfind("\n") + 1:]
        if line_before.strip() and not BLOCK_OPENER.search(line_before):
            return _indent(line_before)
        return self.block_indent()

    def block_indent(self) -> int:
        """Indentation below which a later line has left the cursor's block (one more after a block opener)."""
        line_before = self.prefix[self.prefix.rfind("\n") + 1:]
        return _indent(line_before) if not line_before.strip() else _indent(line_before) + 1

    def stop_text(self) -> str | None:
        """The first non-blank line after the cursor's line: a multi-line infill stops before repeating it."""
        for ln in self.suffix.split("\n", 8)[1:8]:
            if ln.strip():
                return ln.strip()
        return None


_BIG = 1 << 20
_starts_cache: list = [None, None]   # (the text object itself, its line starts): one big document at a time


def _line_start(text: str, line: int) -> int:
    """Offset where a line starts; PositionError past the end. Big documents index their lines once per
    version (a request converts several positions), small ones scan."""
    if len(text) >= _BIG:
        if _starts_cache[0] is not text:
            starts, pos = [0], 0
            for ln in text.split("\n"):
                pos += len(ln) + 1
                starts.append(pos)
            _starts_cache[:] = [text, starts[:-1]]
        starts = _starts_cache[1]
        if line >= len(starts):
            raise PositionError(f"line {line} is past the end of the document ({len(starts)} lines)")
        return starts[line]
    start = 0
    for n in range(line):
        nl = text.find("\n", start)
        if nl < 0:
            raise PositionError(f"line {line} is past the end of the document ({n + 1} lines)")
        start = nl + 1
    return start


def line_offsets(text: str, line: int) -> tuple[int, int]:
    """(start, end) offsets of a line's content without its line break; PositionError past the end."""
    if line < 0:
        raise PositionError(f"line {line} is negative")
    start = _line_start(text, line)
    end = text.find("\n", start)
    end = len(text) if end < 0 else end
    if end > start and text[end - 1] == "\r":
        end -= 1
    return start, end


def offset_of(text: str, line: int, column: int) -> int:
    """Offset of a position; a column past the end of its line means the line's end (as LSP specifies)."""
    if column < 0:
        raise PositionError(f"column {column} is negative")
    start, end = line_offsets(text, line)
    return min(start + column, end)


def build_context(text: str, line: int, column: int, selected: Selected | None = None) -> CompletionContext:
    offset = offset_of(text, line, column)
    column = offset - line_offsets(text, line)[0]
    prefix, suffix = text[:offset], text[offset:]
    range_start, lead = (line, column), ""
    if selected is not None:
        s = offset_of(text, *selected.start)
        e = offset_of(text, *selected.end)
        if not s <= e <= offset:
            raise PositionError("selectedCompletionInfo.range must end at or before the cursor")
        prefix = text[:s] + selected.text
        range_start, lead = selected.start, selected.text
    line_before = prefix[prefix.rfind("\n") + 1:]
    nl = suffix.find("\n")
    line_after = suffix if nl < 0 else suffix[:nl]
    if line_after.strip():
        multiline = False
    else:
        multiline = not line_before.strip() or bool(BLOCK_OPENER.search(line_before))
    return CompletionContext(prefix, suffix, multiline, line, column, range_start, lead)


def _indent(line: str) -> int:
    return len(line.expandtabs(4)) - len(line.expandtabs(4).lstrip())


def block_end_cut(text: str, block_indent: int) -> int | None:
    """Where a multi-line completion has left the cursor's block: the start of the first later line whose
    visible text is indented less than block_indent (the engine's stop_fn, so decoding ends there), or None."""
    offset = 0
    for i, ln in enumerate(text.split("\n")):
        if i > 0 and ln.strip() and _indent(ln) < block_indent:
            return offset
        offset += len(ln) + 1
    return None


def _whole_words(line: str) -> str:
    """`line` up to its last space or punctuation: the words of a line still being decoded that are whole."""
    m = re.search(r"^.*[\s\W]", line)
    return m.group(0) if m else ""


def _decided(line: str) -> str:
    """`line` as decided so far, less a trailing character whose UTF-8 bytes are not all decoded yet."""
    return line.rstrip("\ufffd")


def shape_completion(text: str, ctx: CompletionContext, *, max_lines: int, truncated: bool,
                     whole_words: bool = True) -> str:
    """Cut the model's text to what the editor should show.

    Single line: up to the first line break, without a trailing copy of the text after the cursor.
    Multi-line: at most max_lines, stopping before a line that repeats the next line of the suffix or that
    is indented less than the block the cursor is in (its line's indentation; one more after a block opener).
    truncated (the time budget ran out mid-way): the line still being decoded is cut back to its last word
    boundary, on the first line as on a later one (a later one that has no word yet, or that is the start of
    the code after the cursor, is left out); with whole_words=False it keeps every token decided, a word's
    start too (the model's greedy output goes on from there, so what is shown is never wrong).
    """
    cut = _whole_words if whole_words else _decided
    bad = CONTROL.search(text)       # a control character (NUL, escape codes ...) is never code to insert
    if bad:
        text = text[: bad.start()]
    if not ctx.multiline or (truncated and "\n" not in text):
        text = text.split("\n", 1)[0]
        if truncated:
            text = cut(text)
        after = ctx.suffix.split("\n", 1)[0].strip()
        if after and text.rstrip().endswith(after):
            text = text.rstrip()[: -len(after)]
        return text.rstrip() if text.strip() else ""
    lines = text.split("\n")
    stop = ctx.stop_text()
    if truncated and len(lines) > 1:
        last = cut(lines[-1])                 # the last line is incomplete: its words decided so far
        keep = last.strip() and not (stop and stop.startswith(last.strip()))
        lines[-1:] = [last.rstrip()] if keep else []
    end = block_end_cut("\n".join(lines), ctx.block_indent())
    if end is not None:                       # the block the cursor is in has ended
        lines = "\n".join(lines)[:end].split("\n")
    out: list[str] = []
    for i, ln in enumerate(lines[:max_lines]):
        if i > 0 and stop and ln.strip() == stop:
            break                             # the model reached the code after the cursor
        out.append(ln)
    while out and not out[-1].strip():
        out.pop()
    return "\n".join(out)
