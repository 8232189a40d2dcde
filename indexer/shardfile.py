"""A shard's files: .npy arrays written atomically with their sha256 (hashed while writing), and mapped
read-only after their size, checksum and header are checked; and their pages mapped ahead of a search."""
from __future__ import annotations

import hashlib
import mmap
from pathlib import Path

import numpy as np

from restbase.storage import atomic_file

from .types import CorruptShard


class _HashingWriter:
    def __init__(self, f):
        self.f = f
        self.h = hashlib.sha256()
        self.size = 0

    def write(self, b):
        mv = memoryview(b)
        self.h.update(mv)
        self.size += mv.nbytes
        return self.f.write(mv)


def write_npy_atomic(path: Path, arr: np.ndarray, *, sync_dir: bool = True) -> dict:
    """Write an .npy atomically; returns {"name", "size", "sha256"} (hashed while writing)."""
    with atomic_file(path, sync_dir=sync_dir) as f:
        w = _HashingWriter(f)
        np.lib.format.write_array(w, np.ascontiguousarray(arr), allow_pickle=False)
    return {"name": path.name, "size": w.size, "sha256": w.h.hexdigest()}


def file_sha256(path: Path, chunk: int = 8 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb", buffering=0) as f:
        buf = bytearray(chunk)
        mv = memoryview(buf)
        while True:
            n = f.readinto(buf)
            if not n:
                break
            h.update(mv[:n])
    return h.hexdigest()


def open_npy(path: Path, expect: dict | None, shard_id: str, verify: bool):
    """mmap an .npy read-only; returns (mmap, offset, dtype, length). Size and checksum checked first."""
    try:
        st = path.stat()
    except OSError as e:
        raise CorruptShard(shard_id, path.name, f"missing ({e.strerror})") from e
    if expect is not None:
        if st.st_size != expect["size"]:
            raise CorruptShard(shard_id, path.name, f"size {st.st_size} != {expect['size']} (truncated?)")
        if verify and file_sha256(path) != expect["sha256"]:
            raise CorruptShard(shard_id, path.name, "checksum mismatch")
    with open(path, "rb") as f:
        try:
            major, minor = np.lib.format.read_magic(f)
            if (major, minor) == (1, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
            else:
                shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
        except Exception as e:
            raise CorruptShard(shard_id, path.name, f"bad .npy header ({e})") from e
        off = f.tell()
        n = int(shape[0]) if shape else 0
        if len(shape) != 1 or off + n * dtype.itemsize != st.st_size:
            raise CorruptShard(shard_id, path.name, "array length does not match the file size")
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if st.st_size else b""
    return mm, off, dtype, n


_MADV_POPULATE_READ = getattr(mmap, "MADV_POPULATE_READ", 22)  # Linux >= 5.14; Python 3.11 does not name it


def mapping_of(obj) -> mmap.mmap | None:
    """The mmap under an array or buffer (numpy array -> memoryview -> mmap), or None (in memory)."""
    for _ in range(4):
        if isinstance(obj, mmap.mmap):
            return obj
        obj = getattr(obj, "base", None) if isinstance(obj, np.ndarray) else getattr(obj, "obj", None)
    return None


def prefault(*arrays) -> None:
    """Map every page of the files under these arrays into this process now (from the page cache, or read from
    disk); arrays in memory have nothing to map. A hint: a kernel without MADV_POPULATE_READ (5.14) gets the
    asynchronous MADV_WILLNEED read-ahead instead."""
    for m in {id(m): m for m in map(mapping_of, arrays) if m is not None}.values():
        for advice in (_MADV_POPULATE_READ, getattr(mmap, "MADV_WILLNEED", None)):
            try:
                if advice is not None:
                    m.madvise(advice)
                    break
            except (OSError, ValueError):
                continue
