"""Open documents whose edits cost what the edit costs, not what the document costs.

pygls' TextDocument applies an incremental change by splitting the whole text into lines and converting
the change's UTF-16 columns one character at a time in Python, and the server converted each request's
position the same way: on a 1 MB single-line buffer that was 2-4 s per keystroke. `FastTextDocument` keeps
the line starts in a numpy array that each edit updates (the line breaks it removes or adds, and one vector
shift), and converts columns with the codecs (C speed, and only on lines holding characters outside the
Basic Multilingual Plane). A document that breaks lines anywhere but at \\n and \\r\\n (pygls' splitlines()
also breaks at a lone \\r, \\v, \\f, \\x1c-\\x1e, \\x85, U+2028 and U+2029) keeps pygls' own code, so positions
mean exactly what they meant before.
"""
from __future__ import annotations

import re
from typing import Any

import numpy as np
from lsprotocol import types
from pygls.workspace.text_document import TextDocument

_OTHER_BREAKS = re.compile("\r(?!\n)|[\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]")
_ASTRAL = re.compile("[\U00010000-\U0010ffff]")


def units(text: str, encoding: str) -> int:
    """Length of `text` in the client's position units (UTF-16 code units unless negotiated otherwise)."""
    if encoding == types.PositionEncodingKind.Utf8:
        return len(text.encode("utf-8"))
    if encoding == types.PositionEncodingKind.Utf32 or _ASTRAL.search(text) is None:
        return len(text)
    return len(text.encode("utf-16-le")) // 2


def column(line: str, n: int, encoding: str) -> int:
    """The code-point column `n` client units into `line` (past its end by as much as `n` is)."""
    if encoding == types.PositionEncodingKind.Utf32 or (encoding != types.PositionEncodingKind.Utf8
                                                        and _ASTRAL.search(line) is None):
        return n
    if encoding == types.PositionEncodingKind.Utf8:
        raw = line.encode("utf-8")
        return len(raw[:n].decode("utf-8", "ignore")) + max(0, n - len(raw))
    raw = line.encode("utf-16-le")
    return len(raw[:2 * n].decode("utf-16-le", "ignore")) + max(0, n - len(raw) // 2)


def _common_prefix(a: str, b: str, limit: int) -> int:
    """Length of the common prefix of a and b, at most `limit`: a binary search over slice comparisons, so the
    characters are compared at C speed (a 1 MB buffer in well under a millisecond) instead of one at a time."""
    lo, hi = 0, limit
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _common_suffix(a: str, b: str, limit: int) -> int:
    lo, hi = 0, limit
    na, nb = len(a), len(b)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[na - mid:na - lo] == b[nb - mid:nb - lo]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def changed_span(old: str, new: str) -> tuple[int, int, int] | None:
    """The one edit that turns `old` into `new`, as (start, old end, new end) offsets: new[start:new end]
    replaced old[start:old end]; None when the texts are equal. Found from the common prefix and then the
    common suffix of what is left, so where a typed character repeats its neighbour ("aa") the insertion is
    placed after the run, where the cursor is."""
    if old == new:
        return None
    p = _common_prefix(old, new, min(len(old), len(new)))
    s = _common_suffix(old, new, min(len(old), len(new)) - p)
    return p, len(old) - s, len(new) - s


def edit_end(old: str, new: str) -> tuple[int, int] | None:
    """Where the cursor most likely is after a whole-text change from `old` to `new`: the end of the text it
    inserted (a deletion: where the deleted text was), as (line, code-point column) with lines broken at
    \n; None when nothing changed. A client that sends the whole text says nothing else about the cursor."""
    span = changed_span(old, new)
    if span is None:
        return None
    end = span[2]
    line_start = new.rfind("\n", 0, end) + 1
    return new.count("\n", 0, end), end - line_start


class FastTextDocument(TextDocument):
    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._starts: np.ndarray | None = None     # offsets where lines start; None: not known yet
        self._plain: bool | None = None            # lines break at \n (or \r\n) only; None: not known yet
        # the cursor guessed from the last whole-text change (edit_end), None after any other change: what
        # the server warms and predicts at for a client that sends only whole texts
        self.full_change_end: tuple[int, int] | None = None

    @property
    def _encoding(self) -> str:
        return self.position_codec.encoding or types.PositionEncodingKind.Utf16

    @property
    def plain(self) -> bool:
        if self._plain is None:
            self._plain = _OTHER_BREAKS.search(self.source) is None
        return self._plain

    def _line_starts(self) -> np.ndarray:
        if self._starts is None:
            self._starts = np.array([0] + [m.end() for m in re.finditer("\n", self.source)], dtype=np.int64)
        return self._starts

    def line_text(self, line: int) -> str | None:
        """A line without its line break (None past the last line), as pygls' `lines` would hold it."""
        if not self.plain:
            lines = self.lines
            return lines[line].rstrip("\r\n") if 0 <= line < len(lines) else None
        starts = self._line_starts()
        if not 0 <= line < len(starts):
            return None
        src = self.source
        a = int(starts[line])
        b = int(starts[line + 1]) - 1 if line + 1 < len(starts) else len(src)
        return src[a:b - 1] if b > a and src[b - 1] == "\r" else src[a:b]

    def columns(self, pos: types.Position) -> tuple[int, int]:
        """(line, code-point column) of a client position; a column past its line stays past it."""
        text = self.line_text(pos.line)
        if text is None:
            return pos.line, pos.character
        return pos.line, column(text, pos.character, self._encoding)

    def client_units(self, text: str) -> int:
        return units(text, self._encoding)

    def _offset(self, pos: types.Position) -> int:
        starts = self._line_starts()
        if pos.line >= len(starts):
            return len(self.source)
        text = self.line_text(pos.line)
        return int(starts[pos.line]) + min(column(text, pos.character, self._encoding), len(text))

    def _apply_incremental_change(self, change: types.TextDocumentContentChangePartial) -> None:
        self.full_change_end = None
        text = change.text
        if not self.plain or _OTHER_BREAKS.search(text) is not None:
            super()._apply_incremental_change(change)     # pygls' line semantics, at pygls' cost
            self._starts = self._plain = None
            return
        src = self.source
        a, b = self._offset(change.range.start), self._offset(change.range.end)
        if b < a:
            a, b = b, a
        self._source = new = src[:a] + text + src[b:]
        starts = self._line_starts()
        i0, i1 = np.searchsorted(starts, [a, b], side="right")
        added = np.array([a + m.end() for m in re.finditer("\n", text)], dtype=np.int64)
        self._starts = np.concatenate([starts[:i0], added, starts[i1:] + (len(text) - (b - a))])
        end = a + len(text)
        # a \r\n split by the edit leaves a lone \r: a line break to pygls, so its semantics from now on
        if any(0 < i <= len(new) and new[i - 1] == "\r" and new[i:i + 1] != "\n" for i in (a, end)):
            self._starts = self._plain = None

    def _apply_full_change(self, change) -> None:
        old = self.source
        super()._apply_full_change(change)
        self._starts = self._plain = None
        self.full_change_end = edit_end(old, self.source)


def install(workspace) -> None:
    """Make `workspace` (pygls) create FastTextDocuments for the documents opened from now on."""
    def create(doc_uri: str, source: str | None = None, version: int | None = None,
               language_id: str | None = None) -> TextDocument:
        return FastTextDocument(doc_uri, source=source, version=version, language_id=language_id,
                                sync_kind=workspace._sync_kind, position_codec=workspace.position_codec)

    workspace._create_text_document = create
