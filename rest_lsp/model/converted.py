"""Checksums of a converted-model cache (a GGUF turned into a safetensors directory, rest_lsp/model/host.py).

A conversion records every file's size and sha256 in CHECKSUMS before the directory is renamed into place.
Each use checks the directory against it: sizes, the sha256 of every file up to FULL_HASH_BYTES (config,
tokenizer, generation settings), and the safetensors headers of the weights (their declared data must fill
the file exactly, which catches a truncated or overwritten weights file without hashing gigabytes at each
start; `problem(folder, full=True)` hashes everything). A damaged cache is then converted again instead
of failing the load with a traceback. A cache converted before checksums existed is checked for
structure alone, then recorded.
"""
from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path

CHECKSUMS = "rest-lsp-checksums.json"
FULL_HASH_BYTES = 64 << 20


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def record(folder: Path) -> None:
    """Write CHECKSUMS for every file in `folder` (atomically: a temporary file renamed into place)."""
    from restbase.storage import write_bytes_atomic

    folder = Path(folder)
    files = {p.relative_to(folder).as_posix(): {"size": p.stat().st_size, "sha256": _sha256(p)}
             for p in sorted(folder.rglob("*")) if p.is_file() and p.name != CHECKSUMS}
    write_bytes_atomic(folder / CHECKSUMS, json.dumps({"files": files}, indent=1).encode())


def _safetensors_problem(path: Path) -> str | None:
    """Does the file hold exactly what its header declares?"""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            return "shorter than its header"
        n = struct.unpack("<Q", head)[0]
        if n > min(size - 8, 100 << 20):
            return "a header longer than the file"
        try:
            header = json.loads(f.read(n))
            end = max((int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"), default=0)
        except (ValueError, KeyError, TypeError, IndexError):
            return "an unreadable header"
    if 8 + n + end != size:
        return f"{size} bytes where its header declares {8 + n + end}"
    return None


def problem(folder: Path, *, full: bool = False) -> str | None:
    """What is wrong with a converted cache (None: nothing found); `full` hashes the weights too."""
    folder = Path(folder)
    try:
        json.loads((folder / "config.json").read_text())
    except (OSError, ValueError) as e:
        return f"config.json: {type(e).__name__}"
    try:
        listed = json.loads((folder / CHECKSUMS).read_text())["files"]
    except FileNotFoundError:
        listed = None
    except (OSError, ValueError, KeyError, TypeError):
        return f"{CHECKSUMS} is unreadable"
    for p in sorted(folder.glob("*.safetensors")):
        why = _safetensors_problem(p)
        if why is not None:
            return f"{p.name}: {why}"
    if listed is None:       # converted before checksums: structure checked above; record it now
        try:
            record(folder)
        except OSError:
            pass
        return None
    for name, meta in listed.items():
        p = folder / name
        try:
            size = p.stat().st_size
        except OSError:
            return f"{name} is missing"
        if size != meta.get("size"):
            return f"{name}: {size} bytes, {meta.get('size')} recorded"
        if (full or size <= FULL_HASH_BYTES) and _sha256(p) != meta.get("sha256"):
            return f"{name}: its checksum does not match"
    return None
