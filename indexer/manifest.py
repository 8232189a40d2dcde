"""The msgpack manifest and the writer lock of a datastore directory (files written through restbase.storage)."""
from __future__ import annotations

import hashlib
import re
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import msgpack

from restbase.storage import file_lock, write_bytes_atomic

from .types import CorruptManifest, DatastoreNotFound

FORMAT_VERSION = 2   # 2: the manifest is wrapped with a sha256 of its bytes; 1 (no checksum) is still read
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


# File systems stamp mtimes from a coarse clock (ext4: the kernel's tick, a few ms; FAT: 2 s), so a file written
# again within the tick of the scan's stat, at the same size, looks unchanged to a size-and-mtime comparison. A
# document whose recorded mtime is this close to (or after) the start of the last full scan is racy: the next
# scan compares its content hash (git's racily-clean entries, with a margin for coarse clocks).
RACY_NS = 2_000_000_000


def racy_documents(docs: dict[str, Doc], scanned_ns: int | None) -> set[str]:
    """The documents whose size and mtime cannot vouch for their content: all of them when the manifest does
    not say when it was scanned (written before `scanned_ns` was recorded: they are re-read once)."""
    if scanned_ns is None:
        return set(docs)
    return {p for p, d in docs.items() if d.mtime_ns >= scanned_ns - RACY_NS}


def kind_of(meta: dict) -> str:
    """A shard's kind as its manifest entry says it (one written without a kind is a repository shard)."""
    return meta.get("kind", "repository")


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
    """The manifest of a datastore directory, checked whole: its checksum (format 2) and its structure
    (`check_manifest`). Any damage is a CorruptManifest with a one-line reason, never another exception."""
    f = Path(directory) / MANIFEST
    if not Path(directory).is_dir():
        raise DatastoreNotFound(f"no datastore at {directory} (the directory does not exist)")
    try:
        data = f.read_bytes()
    except FileNotFoundError:
        raise DatastoreNotFound(f"no datastore at {directory} (no {MANIFEST}; build one with rest-index build)") from None
    except OSError as e:
        raise CorruptManifest(f"{f} cannot be read ({e.strerror or e}); rebuild the datastore") from None
    outer = _unpack(data, f)
    if not isinstance(outer, dict) or "format" not in outer:
        raise CorruptManifest(f"{f} is not a rest-index manifest; rebuild the datastore")
    fmt = outer["format"]
    if fmt == FORMAT_VERSION:
        body = outer.get("body")
        if not isinstance(body, bytes) or hashlib.sha256(body).hexdigest() != outer.get("sha256"):
            raise CorruptManifest(f"{f} is damaged (its checksum does not match); rebuild the datastore")
        m = _unpack(body, f)
    elif fmt == 1:   # written before manifests had a checksum: the structure is all that can be checked
        m = outer
    else:
        raise CorruptManifest(f"{f} has format {fmt!r}, this rest-index reads {FORMAT_VERSION}; rebuild the "
                              "datastore")
    problem = check_manifest(m)
    if problem is not None:
        raise CorruptManifest(f"{f} is damaged ({problem}); rebuild the datastore")
    m["format"] = FORMAT_VERSION
    return m


def _unpack(data: bytes, f: Path):
    try:
        return msgpack.unpackb(data, raw=False, strict_map_key=False)
    except Exception as e:  # msgpack raises several types for damaged input
        raise CorruptManifest(f"{f} is not a readable manifest ({type(e).__name__}); rebuild the datastore") from None


def write_manifest(directory: Path, m: dict) -> None:
    """Write `m` atomically, wrapped with the sha256 of its packed bytes (format 2)."""
    m = dict(m)
    m["format"] = FORMAT_VERSION
    m["updated"] = time.time()
    body = msgpack.packb(m, use_bin_type=True)
    write_bytes_atomic(Path(directory) / MANIFEST, msgpack.packb(
        {"format": FORMAT_VERSION, "sha256": hashlib.sha256(body).hexdigest(), "body": body}, use_bin_type=True))


_FILE_NAME = re.compile(r"[A-Za-z0-9._-]+")
_DOC_COLUMNS = {"path": str, "size": int, "mtime_ns": int, "hash": bytes, "shard": str, "start": int, "end": int}


def check_manifest(m) -> str | None:
    """What is structurally wrong with a manifest (None: nothing), so that a damaged one is refused with a
    reason instead of failing later with a KeyError deep in a search, or silently serving nothing."""
    def is_int(v, lo: int = 0) -> bool:
        return isinstance(v, int) and not isinstance(v, bool) and v >= lo

    if not isinstance(m, dict):
        return "not a map"
    if m.get("width") not in (2, 4):
        return f"width {m.get('width')!r} is not 2 or 4"
    tok = m.get("tokenizer")
    if not isinstance(tok, dict) or not is_int(tok.get("vocab_size"), 1):
        return "no tokenizer vocabulary size"
    if not isinstance(m.get("kind", "repository"), str):
        return "kind is not a string"
    roots = m.get("roots", [])
    if not isinstance(roots, list) or not all(isinstance(r, str) for r in roots):
        return "roots are not a list of paths"
    if m.get("filters") is not None:
        from .discover import Filters

        try:
            Filters.from_dict(m["filters"])
        except (AttributeError, TypeError, ValueError) as e:
            return f"bad filters ({e})"
    for key in ("next_shard", "generation", "scanned_ns"):
        if key in m and not is_int(m[key]):
            return f"{key} is not a count"
    shards = m.get("shards")
    if not isinstance(shards, list):
        return "no shard list"
    sizes: dict[str, int] = {}
    for sm in shards:
        if not isinstance(sm, dict) or not isinstance(sm.get("id"), str) or sm["id"] in sizes:
            return "a shard without a unique id"
        sid = sm["id"]
        if not is_int(sm.get("tokens")) or sm.get("token_width", m["width"]) not in (2, 4):
            return f"shard {sid}: bad token count or width"
        if not isinstance(sm.get("kind", ""), str):
            return f"shard {sid}: its kind is not a string"
        files = sm.get("files")
        if not isinstance(files, dict) or "tok" not in files or "sa" not in files:
            return f"shard {sid}: its files are not named"
        for role, fm in files.items():
            if role not in ("tok", "sa", "alpha") or not isinstance(fm, dict) or \
                    not isinstance(fm.get("name"), str) or not _FILE_NAME.fullmatch(fm["name"]) or \
                    not is_int(fm.get("size")) or not isinstance(fm.get("sha256"), str):
                return f"shard {sid}: bad entry for its {role!r} file"
        dead = sm.get("dead", [])
        if not isinstance(dead, list) or not all(
                isinstance(d, (list, tuple)) and len(d) == 2 and is_int(d[0]) and is_int(d[1]) and
                d[0] <= d[1] <= sm["tokens"] for d in dead):
            return f"shard {sid}: bad masked spans"
        sizes[sid] = sm["tokens"]
    docs = m.get("docs")
    if not isinstance(docs, dict):
        return "no document table"
    cols = {k: docs.get(k) for k in _DOC_COLUMNS}
    if not all(isinstance(c, list) for c in cols.values()):
        return "a document column is missing"
    n = len(cols["path"])
    masked = docs.get("masked") or [0] * n
    if any(len(c) != n for c in cols.values()) or not isinstance(masked, list) or len(masked) != n:
        return "the document columns differ in length"
    for k, t in _DOC_COLUMNS.items():
        if not all(isinstance(v, t) and (t is not int or is_int(v)) for v in cols[k]):
            return f"a document's {k} has the wrong type"
    if not all(is_int(v) for v in masked):
        return "a document's masked count has the wrong type"
    if len(set(cols["path"])) != n:
        return "a document is listed twice"
    for sh, a, b in zip(cols["shard"], cols["start"], cols["end"]):
        if sh not in sizes:
            return f"a document names shard {sh!r}, which the manifest does not list"
        if not a <= b < sizes[sh]:
            return f"a document's span [{a}, {b}) is outside shard {sh}"
    return None


def manifest_signature(directory: Path):
    try:
        st = (Path(directory) / MANIFEST).stat()
    except OSError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)


@contextmanager
def writer_lock(directory: Path):
    """One writer at a time per directory (a thread in this process, or another process)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    with file_lock(directory / LOCK):
        yield


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
