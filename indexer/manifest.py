"""The msgpack manifest, atomic file writes and the writer lock of a datastore directory."""
from __future__ import annotations

import fcntl
import os
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import msgpack

from .shard import atomic_file
from .types import CorruptManifest, DatastoreNotFound

FORMAT_VERSION = 1
MANIFEST = "manifest.msgpack"
SHARD_DIR = "shards"
LOCK = ".lock"


@dataclass
class Doc:
    size: int
    mtime_ns: int
    hash: bytes
    shard: str
    start: int  # token span [start, end) inside the shard; a sentinel follows at `end`
    end: int
    masked: int = 0  # lines emptied before tokenization because they carry a secret (a count, never values)


def write_bytes_atomic(path: Path, data: bytes) -> None:
    with atomic_file(path) as f:
        f.write(data)


def pack_docs(docs: dict[str, Doc]) -> dict:
    """Columnar: one list per field (msgpack packs and unpacks lists of scalars fast)."""
    ds = list(docs.values())
    return {
        "path": list(docs),
        "size": [d.size for d in ds],
        "mtime_ns": [d.mtime_ns for d in ds],
        "hash": [d.hash for d in ds],
        "shard": [d.shard for d in ds],
        "start": [d.start for d in ds],
        "end": [d.end for d in ds],
        "masked": [d.masked for d in ds],
    }


def unpack_docs(d: dict) -> dict[str, Doc]:
    masked = d.get("masked") or [0] * len(d["path"])   # stores built before secrets were counted
    return {p: Doc(s, m, h, sh, a, b, k) for p, s, m, h, sh, a, b, k in zip(
        d["path"], d["size"], d["mtime_ns"], d["hash"], d["shard"], d["start"], d["end"], masked)}


def read_manifest(directory: Path) -> dict:
    f = Path(directory) / MANIFEST
    if not Path(directory).is_dir():
        raise DatastoreNotFound(f"no datastore at {directory} (the directory does not exist)")
    try:
        data = f.read_bytes()
    except FileNotFoundError:
        raise DatastoreNotFound(f"no datastore at {directory} (no {MANIFEST}; build one with rest-index build)") from None
    try:
        m = msgpack.unpackb(data, raw=False, strict_map_key=False)
    except Exception as e:
        raise CorruptManifest(f"{f} is not a readable manifest ({e}); rebuild the datastore") from e
    if not isinstance(m, dict) or "format" not in m:
        raise CorruptManifest(f"{f} is not a rest-index manifest; rebuild the datastore")
    if m["format"] != FORMAT_VERSION:
        raise CorruptManifest(f"{f} has format {m['format']}, this rest-index reads {FORMAT_VERSION}; rebuild the datastore")
    return m


def write_manifest(directory: Path, m: dict) -> None:
    m = dict(m)
    m["format"] = FORMAT_VERSION
    m["updated"] = time.time()
    write_bytes_atomic(Path(directory) / MANIFEST, msgpack.packb(m, use_bin_type=True))


def manifest_signature(directory: Path):
    try:
        st = (Path(directory) / MANIFEST).stat()
    except OSError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)


_THREAD_LOCKS: dict[str, threading.RLock] = {}
_THREAD_LOCKS_GUARD = threading.Lock()


@contextmanager
def writer_lock(directory: Path):
    """One writer at a time per directory: a thread lock inside the process, flock across processes
    (released by the kernel if the writer dies)."""
    directory = Path(directory)
    key = str(directory.resolve())
    with _THREAD_LOCKS_GUARD:
        tl = _THREAD_LOCKS.setdefault(key, threading.RLock())
    with tl:
        directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(str(directory / LOCK), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            try:
                fcntl.flock(fd, fcntl.LOCK_UN)
            finally:
                os.close(fd)


def remove_unreferenced(directory: Path, keep: set[str]) -> int:
    """Delete shard files the manifest no longer names and temporary files of interrupted writes
    (only under the writer lock)."""
    n = 0
    sd = Path(directory) / SHARD_DIR
    for p in list(sd.iterdir()) if sd.is_dir() else []:
        if p.name not in keep:
            try:
                p.unlink()
                n += 1
            except OSError:
                pass
    for p in Path(directory).glob(".tmp-*"):
        try:
            p.unlink()
            n += 1
        except OSError:
            pass
    return n
