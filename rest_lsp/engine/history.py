"""The model's earlier output kept across processes: `HistorySource`'s tokens in one msgpack file.

A daemon that restarts (or a benchmark that starts from an earlier run's output) keeps drafting from what the
model wrote before: completions repeat their idioms across sessions, and on HumanEval a history of the model's
output on other prompts adds 0.22 tokens per step at 5 draft nodes and 0.34 at 64 (docs/engine.md).

The file holds token ids, so it is tied to one tokenizer: `model` names it, and a file written for another
model is refused. Writes are atomic (a temporary file renamed over the old one); a file that does not read
back whole (truncated, bit rot: a sha256 guards the tokens) raises `HistoryError`, and is set aside, never
written over (`set_aside`).
"""
from __future__ import annotations

import hashlib
import time
from pathlib import Path

import msgpack
import numpy as np

from restbase.storage import write_bytes_atomic

from .sources import HistorySource

SEPARATOR = HistorySource.SEPARATOR
FORMAT = "rest-lsp-history"
VERSION = 1


class HistoryError(ValueError):
    """A history file that cannot be used: missing, unreadable, corrupted or written for another model."""


def save_history(path: Path, tokens: np.ndarray, model: str) -> None:
    """Write `tokens` (int, -1 separates generations) for `model` to `path`, atomically."""
    data = np.ascontiguousarray(tokens, dtype="<i4").tobytes()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_bytes_atomic(path, msgpack.packb({"format": FORMAT, "version": VERSION, "model": model,
                                            "tokens": data, "sha256": hashlib.sha256(data).hexdigest()},
                                           use_bin_type=True))


def load_history(path: Path, model: str) -> np.ndarray:
    """The tokens saved for `model` at `path` (int64). `model` may be a bare model name (what a replay
    record knows), which matches that model's key with any vocabulary."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise HistoryError(f"no history file at {path}") from None
    except OSError as e:
        raise HistoryError(f"history file {path} cannot be read: {e}") from e
    try:
        m = msgpack.unpackb(raw, raw=False)
    except Exception as e:  # msgpack raises several types for damaged input
        raise HistoryError(f"{path} is not a readable history file ({type(e).__name__}: {e})") from None
    if not isinstance(m, dict) or m.get("format") != FORMAT:
        raise HistoryError(f"{path} is not a rest-lsp history file")
    if m.get("version") != VERSION:
        raise HistoryError(f"{path} has history version {m.get('version')}, this rest-lsp reads {VERSION}")
    if m.get("model") != model and not str(m.get("model")).startswith(model + "/"):
        raise HistoryError(f"{path} holds token ids of model {m.get('model')!r}, not of {model!r}")
    data = m.get("tokens")
    if not isinstance(data, bytes) or len(data) % 4 or hashlib.sha256(data).hexdigest() != m.get("sha256"):
        raise HistoryError(f"{path} is corrupted (its tokens do not match their checksum)")
    return np.frombuffer(data, dtype="<i4").astype(np.int64)


def set_aside(path: Path) -> Path:
    """Move a history file that could not be read out of the way, next to it (`<name>.unreadable-<time>`),
    so that it is kept for inspection and never written over. OSError when it cannot be moved."""
    path = Path(path)
    stem = f"{path.name}.unreadable-{int(time.time())}"
    aside, n = path.with_name(stem), 0
    while aside.exists():
        n += 1
        aside = path.with_name(f"{stem}-{n}")
    path.replace(aside)
    return aside


def _stamp(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size


class HistoryFile:
    """A HistorySource kept in a file that several processes of one model may share (two editor windows,
    two daemons): saving keeps what another process saved since this one last read or wrote the file."""

    def __init__(self, path: Path, model: str, source: HistorySource):
        self.path, self.model, self.source = Path(path), model, source
        self._synced = source.total  # the source's tokens up to this position are in the file
        self._stamp: tuple[int, int] | None = None  # the file as this process last read or wrote it
        self.error: str | None = None  # why a file found at a save could not be read (it was set aside)

    def load(self) -> int:
        """Add the file's tokens to the source (HistoryError when it cannot be used); returns how many."""
        tokens = load_history(self.path, self.model)
        self.source.extend(tokens)
        self._synced, self._stamp = self.source.total, _stamp(self.path)
        return int((tokens >= 0).sum())

    @property
    def dirty(self) -> bool:
        """The source holds output the file does not."""
        return self.source.total != self._synced

    def save(self) -> None:
        """Write the source's tokens atomically (OSError when the file cannot be written). When another process
        wrote the file since, its tokens come first and this process's new ones after them, in the file and in
        the source, so neither process erases the other's output. A file that changed and cannot be read now
        (damaged, another model's, a newer format) is set aside first, never written over; OSError when it
        cannot be moved, and then nothing is written."""
        stamp = _stamp(self.path)
        if stamp is not None and stamp != self._stamp:
            try:
                theirs = load_history(self.path, self.model)
            except HistoryError as exc:
                aside = set_aside(self.path)
                self.error = f"{exc} (moved to {aside.name})"
                theirs = None
            if theirs is not None:
                ours = self.source.since(self._synced)
                gap = [SEPARATOR] if len(ours) and ours[0] != SEPARATOR else []
                self.source.reset(np.concatenate([theirs, gap, ours]).astype(np.int64))
        save_history(self.path, self.source.tokens(), self.model)
        self._synced, self._stamp = self.source.total, _stamp(self.path)


def history_model_key(loaded) -> str:
    """What ties a history file to a tokenizer: the model's name and the tokenizer's size."""
    return f"{loaded.name}/{len(loaded.tokenizer)}"
