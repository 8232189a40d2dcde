"""Completion cache: typing the characters of the suggestion on screen is answered without a model call.

Per document it remembers the last few (text before the cursor, text after the cursor, completion) triples.
A request whose prefix extends a remembered prefix by characters that the completion starts with, with the
same text after the cursor, gets the rest of that completion. Deleting back into a remembered prefix works
the same way in reverse (the deleted characters are put back in front).
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass


@dataclass(frozen=True)
class _Entry:
    prefix: str
    suffix: str
    completion: str


class CompletionCache:
    def __init__(self, per_document: int = 4, documents: int = 64, max_backspace: int = 64):
        self.per_document = per_document
        self.documents = documents
        self.max_backspace = max_backspace
        self._docs: OrderedDict[str, list[_Entry]] = OrderedDict()

    def put(self, uri: str, prefix: str, suffix: str, completion: str) -> None:
        if not completion:
            return
        entries = [e for e in self._docs.pop(uri, []) if not (e.prefix == prefix and e.suffix == suffix)]
        entries.insert(0, _Entry(prefix, suffix, completion))
        self._docs[uri] = entries[: self.per_document]
        while len(self._docs) > self.documents:
            self._docs.popitem(last=False)

    def get(self, uri: str, prefix: str, suffix: str) -> str | None:
        """The rest of a remembered completion that the current text is consistent with, or None."""
        for e in self._docs.get(uri, ()):
            if e.suffix != suffix:
                continue
            if len(prefix) >= len(e.prefix):
                typed = prefix[len(e.prefix):]
                if len(typed) < len(e.completion) and e.completion.startswith(typed) \
                        and prefix.startswith(e.prefix):
                    return e.completion[len(typed):]
            elif len(e.prefix) - len(prefix) <= self.max_backspace and e.prefix.startswith(prefix) \
                    and "\n" not in e.prefix[len(prefix):]:
                return e.prefix[len(prefix):] + e.completion
        return None

    def forget(self, uri: str) -> None:
        self._docs.pop(uri, None)

    def clear(self) -> None:
        self._docs.clear()
