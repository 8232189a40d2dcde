"""int4w's packed layers kept on disk, so that a start reads them instead of decoding the GGUF again.

    key = cache_key(gguf, model, kernel)    # None where the model's weights are not files to fingerprint
    kept = load(gguf, key)                  # {module name: Stored(kind, blocks)}; None: missing or damaged
    save(gguf, key, {name: layer})          # Int4WeightLinear / BlockLinear layers by module name

Why: building int4w from a GGUF took 18 s of every 0.5B load on a 2-core Xeon with AMX (gguf's reader parses
the tokenizer's 151k metadata strings, 6.5 s; each tensor's blocks are decoded, checked against the model's
weights and packed, 8 s), 46 s of the 1.5B's (docs/cpu.md). What that builds depends only on the GGUF, the
model's weight files and dtype (which layers decode exactly to them), the packing code, torch and the kernel:
the key is made of them, so an entry holds what the check accepted when it was written. One entry per GGUF
file (a new key replaces the old entry), at most KEPT_FILES and KEPT_BYTES in all. Written atomically; a
damaged entry is rebuilt.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any, NamedTuple

import torch

from restbase.storage import cache_root, fsync_dir, tmp_name

log = logging.getLogger(__name__)

FORMAT = 1
KEPT_BYTES = 3 << 30  # the entries kept in all, least recently used removed first (the 1.5B's is 1.1 GB, the
KEPT_FILES = 16       # 0.5B's 0.4 GB; the tests' tiny models' a few kB)
_CODE = ("int4weight.py", "gguf_amx.py", "packed_cache.py", "kernels/gguf_amx.cpp")


class Stored(NamedTuple):
    kind: str  # "int4" (Int4WeightLinear) | "blocks" (BlockLinear)
    blocks: tuple  # what Int4WeightLinear takes: a QBlocks, Q6Blocks, Q32Blocks or (packed, scale_zeros)


def _stat(p: Path) -> list:
    st = p.stat()
    return [str(p.resolve()), st.st_size, st.st_mtime_ns]


def _code_digest() -> str:
    here = Path(__file__).parent
    h = hashlib.sha256()
    for name in _CODE:
        h.update((here / name).read_bytes())
    return h.hexdigest()


def cache_key(gguf: str | os.PathLike, model: Any, kernel: str) -> str | None:
    """A digest of the GGUF file, the model's weight files (the directory transformers loaded), the packing
    code, torch and `kernel` (int4weight.kernel_name()); None where the weights are not in a directory."""
    src = Path(getattr(model.config, "_name_or_path", "") or "")
    weights = sorted(p for p in src.iterdir() if p.suffix in (".safetensors", ".bin")) if src.is_dir() else []
    if not weights:
        return None
    dtypes = sorted({str(p.dtype) for p in model.parameters()})  # the check compared against these weights
    parts = [FORMAT, _stat(Path(gguf)), [_stat(p) for p in weights], dtypes, kernel, torch.__version__,
             _code_digest()]
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:20]


def _entry(gguf: str | os.PathLike, key: str | None = None) -> Path:
    """cache_root()/packed/<gguf stem>-<its path's digest>-<key>.safetensors (key None: the glob of all keys)."""
    g = Path(gguf).resolve()
    stem = f"{g.stem[:40]}-{hashlib.sha256(str(g).encode()).hexdigest()[:8]}"
    return cache_root() / "packed" / f"{stem}-{key if key else '*'}.safetensors"


def _blocks_types() -> dict[str, type]:
    from .gguf_amx import Q6Blocks, Q32Blocks, QBlocks

    return {"QBlocks": QBlocks, "Q6Blocks": Q6Blocks, "Q32Blocks": Q32Blocks}


def save(gguf: str | os.PathLike, key: str, layers: dict[str, Any]) -> Path | None:
    """Write the layers' blocks as the GGUF's entry (replacing older entries of it); None where it could not
    be written (the layers still serve: only the next start pays again)."""
    from safetensors.torch import save_file

    tensors: dict[str, torch.Tensor] = {}
    meta: dict[str, list] = {}
    for name, layer in layers.items():
        blocks = layer.blocks
        kind = "blocks" if type(layer).__name__ == "BlockLinear" else "int4"
        btype = type(blocks).__name__ if layer.amx else "torch"
        meta[name] = [kind, btype, getattr(blocks, "kind", None)]
        for i, t in enumerate(t for t in blocks if isinstance(t, torch.Tensor)):
            tensors[f"{name}/{i}"] = t.contiguous()
    path = _entry(gguf, key)
    tmp = tmp_name(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        save_file(tensors, str(tmp), metadata={"layers": json.dumps(meta), "key": key})
        os.chmod(tmp, 0o644)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_dir(path.parent)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        log.warning("int4w: could not keep the packed layers in %s (%s); the next start decodes the GGUF again",
                    path.parent, e)
        return None
    for old in path.parent.glob(_entry(gguf).name):
        if old != path:
            old.unlink(missing_ok=True)
    _trim(path)
    return path


def _trim(keep: Path) -> None:
    """Remove the least recently used entries beyond KEPT_FILES or KEPT_BYTES (never `keep`)."""
    entries = []
    for p in keep.parent.glob("*.safetensors"):
        try:
            st = p.stat()
        except OSError:  # removed meanwhile by another process
            continue
        entries.append((p != keep, -st.st_mtime_ns, st.st_size, p))
    files = total = 0
    for newer, _, size, p in sorted(entries):  # `keep` first, then the most recently used
        if newer and (files >= KEPT_FILES or total + size > KEPT_BYTES):
            p.unlink(missing_ok=True)
        else:
            files, total = files + 1, total + size


def load(gguf: str | os.PathLike, key: str) -> dict[str, Stored] | None:
    """The GGUF's entry for `key` as {module name: Stored}; None where there is none or it is damaged."""
    from safetensors import safe_open

    path = _entry(gguf, key)
    if not path.is_file():
        return None
    types = _blocks_types()
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            if meta.get("key") != key:
                raise ValueError("its key is not the one in its name")
            out, names = {}, set(f.keys())
            for name, (kind, btype, fmt) in json.loads(meta["layers"]).items():
                parts = []
                i = 0
                while f"{name}/{i}" in names:
                    parts.append(f.get_tensor(f"{name}/{i}"))
                    i += 1
                blocks = tuple(parts) if btype == "torch" else types[btype](*parts, *([fmt] if fmt else []))
                out[name] = Stored(kind, blocks)
    except Exception as e:  # a torn or foreign file: decoded from the GGUF again, and rewritten
        log.warning("int4w: the packed layers in %s are unreadable (%s: %s); decoding the GGUF again",
                    path, type(e).__name__, e)
        return None
    try:
        os.utime(path)  # recently used: kept before the others
    except OSError:
        pass
    return out
