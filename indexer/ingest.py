"""A file's way into a datastore: read it, mask its secrets, and (when it is big) tokenize it in pieces.

Every path that indexes a file (a build, an update from the watcher, a repair) reads it through here, so
none of them can skip the secrets rules (indexer/secrets.py). Files up to STREAM_BYTES are read whole and
tokenized in batches with their neighbours (fastest: the tokenizer's Rust threads share the work). Larger
ones, possible with a raised `--max-file-size`, are read, masked and tokenized STREAM_CHARS at a time, cut at
line breaks: tokenizing a 50 MB string in one call held 9 GB (the tokenizer keeps per-token strings and
offsets), and the pieces keep peak memory to the token array itself plus one piece's worth (a piece's ids
are kept as uint16 when they fit, as a 2-byte store holds them).
"""
from __future__ import annotations

import codecs
import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from . import discover as disc
from .secrets import clean

STREAM_BYTES = 4 << 20       # files larger than this are tokenized in pieces
STREAM_CHARS = 1 << 18       # characters per piece: the tokenizer's working memory grows with a call's text
_READ = 1 << 20


def content_hash(raw: bytes) -> bytes:
    return hashlib.blake2b(raw, digest_size=16).digest()


@dataclass
class Document:
    """A file ready to tokenize (`text`) or already tokenized in pieces (`pieces`), or a reason to skip it."""
    size: int = 0
    hash: bytes = b""
    text: str | None = None
    pieces: list[np.ndarray] | None = None
    undecodable: int = 0                 # characters replaced with U+FFFD
    masked_lines: int = 0                # lines emptied because they carry a secret
    skip: str | None = None              # "too_large", "binary", "key_material"
    notes: list = field(default_factory=list)

    @property
    def tokens(self) -> int:
        return sum(int(p.size) for p in self.pieces) if self.pieces is not None else 0


def read_document(path: Path, max_size: int, tokenizer=None) -> Document:
    """Read and clean one file. With a `tokenizer`, a file over STREAM_BYTES comes back tokenized in
    pieces; without one (or when smaller) as text. OSError propagates (the caller names the file)."""
    size = Path(path).stat().st_size
    if tokenizer is not None and size > STREAM_BYTES:
        return _stream(path, max_size, tokenizer)
    text, raw, bad, skip = disc.read_text(path, max_size)
    if skip is not None:
        return Document(len(raw), skip=skip)
    c = clean(text, str(path))
    if c.skip is not None:
        return Document(len(raw), content_hash(raw), skip=c.skip)
    return Document(len(raw), content_hash(raw), text=c.text, undecodable=bad, masked_lines=c.masked_lines)


def _cut(text: str, limit: int) -> int:
    """Where to end a piece of at most `limit` characters: after a line break followed by an unindented
    line (byte-level pre-tokenizers never merge across one, so the pieces' tokens are the whole text's),
    else after any line break in the second half, else at a space, else anywhere."""
    if len(text) <= limit:
        return len(text)
    m = None
    for m in _UNINDENTED.finditer(text, max(0, limit - 65536), limit):
        pass
    if m is not None:
        return m.start() + 1
    for sep in ("\n", " "):
        i = text.rfind(sep, limit // 2, limit)
        if i >= 0:
            return i + 1
    return limit


_UNINDENTED = re.compile(r"\n(?=[^\s])")


def _stream(path: Path, max_size: int, tokenizer) -> Document:
    from .tokenizer import encode_batch

    h = hashlib.blake2b(digest_size=16)    # over the raw bytes, as content_hash
    decode = codecs.getincrementaldecoder("utf-8-sig")(errors="replace")   # -sig: drops a BOM
    doc = Document(pieces=[])
    pending = ""
    with open(path, "rb") as f:
        while True:
            raw = f.read(_READ)
            if doc.size == 0 and b"\0" in raw[:8192]:
                return Document(len(raw), skip="binary")
            doc.size += len(raw)
            if doc.size > max_size:
                return Document(doc.size, skip="too_large")
            h.update(raw)
            text = decode.decode(raw, final=not raw)
            doc.undecodable += max(0, text.count("\ufffd") - raw.count("\ufffd".encode()))
            pending += text
            while len(pending) >= STREAM_CHARS or (not raw and pending):
                n = _cut(pending, STREAM_CHARS)
                piece, pending = pending[:n], pending[n:]
                c = clean(piece, str(path))
                if c.skip is not None:     # key material anywhere: none of the file is indexed
                    return Document(doc.size, h.digest(), skip=c.skip)
                doc.masked_lines += c.masked_lines
                ids = np.asarray(encode_batch(tokenizer, [c.text])[0], dtype=np.uint32)
                doc.pieces.append(ids.astype(np.uint16) if ids.size and ids.max() < 0xFFFF else ids)
            if not raw:
                break
    doc.hash = h.digest()
    return doc
