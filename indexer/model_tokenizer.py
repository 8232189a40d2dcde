"""A model's tokenizer exactly as the model host loads it, for a model named on a command line; no torch here.

The daemon hosts a model through transformers' `AutoTokenizer`, which need not agree with the model's raw
`tokenizer.json`: transformers 5 loads CodeLlama with a Metaspace pre-tokenizer and adds `<FILL_ME>` at id
32016 (so the vocabulary hash and the encoding of text after a space differ), and a GGUF file has no
`tokenizer.json` at all. A datastore has to be built in the vocabulary the daemon checks, so
`rest-index build --tokenizer MODEL` resolves MODEL as the host does: `AutoTokenizer.from_pretrained` in a
child process (in transformers 5, importing transformers imports torch, which the indexer never does; in a
process that already imported transformers it runs in place), saved as a `tokenizer.json` under
`<cache>/tokenizers/<name>-<key>/`. The key covers the model's tokenizer files (paths, sizes, mtimes) and the
transformers version, so an edited or upgraded tokenizer is resolved again.

    model_tokenizer_json(kind, location) -> Path      kind: "dir" (model directory), "gguf" (file), "hub" (id)
"""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from restbase.storage import atomic_dir, cache_root, file_lock

from .types import IndexerError

# files transformers reads to build a tokenizer (and config.json: it can name the tokenizer class)
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                    "tokenizer.model", "vocab.json", "merges.txt", "config.json")

_CHILD = "import sys; sys.path.insert(0, sys.argv[1]); from indexer.model_tokenizer import save_with_transformers; " \
         "save_with_transformers(*sys.argv[2:5])"


def save_with_transformers(kind: str, location: str, out: str) -> None:
    """AutoTokenizer's tokenizer of the model at `location`, saved into `out` (imports transformers: run it
    in a child process unless transformers is loaded already). A GGUF takes the host's own conversion path:
    AutoTokenizer from the GGUF, saved, then loaded again from that directory (rest_lsp/model/host.py loads
    the converted copy)."""
    from transformers import AutoTokenizer

    if kind == "gguf":
        first = AutoTokenizer.from_pretrained(os.path.dirname(location), gguf_file=os.path.basename(location))
        with tempfile.TemporaryDirectory() as tmp:
            first.save_pretrained(tmp)
            AutoTokenizer.from_pretrained(tmp).save_pretrained(out)
    else:
        AutoTokenizer.from_pretrained(location).save_pretrained(out)


def _transformers_version() -> str:
    try:
        from importlib.metadata import version

        return version("transformers")
    except Exception:  # noqa: BLE001 - not installed: the child reports it
        return "none"


def _stamps(paths: list[Path]) -> str:
    out = []
    for p in sorted(paths):
        try:
            st = p.stat()
        except OSError:
            continue
        out.append(f"{p}\0{st.st_size}\0{st.st_mtime_ns}")
    return "\n".join(out)


def _hub_snapshot(repo_id: str) -> Path:
    """The local snapshot of a hub repository's tokenizer files (downloaded where the network allows;
    offline, HF_HUB_OFFLINE=1 and the local cache answer)."""
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(repo_id, allow_patterns=list(_TOKENIZER_FILES)))
    except Exception as e:  # noqa: BLE001 - many error types: offline, unknown repo, gated
        raise IndexerError(f"cannot fetch the tokenizer of {repo_id!r} from the Hugging Face Hub or its local "
                           f"cache ({type(e).__name__}: {e}); pass a local model directory or .gguf file") from e


def _cache_dir(kind: str, location: Path, label: str) -> Path:
    if kind == "gguf":
        stamps = _stamps([location])
    else:
        stamps = _stamps([location / f for f in _TOKENIZER_FILES])
    key = hashlib.sha256(f"{kind}\0{location}\0{stamps}\0{_transformers_version()}".encode()).hexdigest()[:16]
    stem = "".join(c if c.isalnum() or c in "-_." else "_" for c in label)[:40] or "model"
    return cache_root() / "tokenizers" / f"{stem}-{key}"


def model_tokenizer_json(kind: str, location: str | os.PathLike) -> Path:
    """The `tokenizer.json` of the model's tokenizer as transformers loads it (see the module docstring)."""
    label = Path(location).name
    if kind == "hub":
        label = str(location).replace("/", "--")
        location = _hub_snapshot(str(location))
        kind = "dir"
    location = Path(location).expanduser().resolve()
    dest = _cache_dir(kind, location, label)
    if (dest / "tokenizer.json").is_file():
        return dest / "tokenizer.json"
    with file_lock(dest.with_name(dest.name + ".lock")):
        if (dest / "tokenizer.json").is_file():
            return dest / "tokenizer.json"
        with atomic_dir(dest) as tmp:
            if "transformers" in sys.modules:  # already paid for (and torch with it): no child process
                try:
                    save_with_transformers(kind, str(location), str(tmp))
                except Exception as e:  # noqa: BLE001
                    raise IndexerError(f"cannot load the tokenizer of {location}: {type(e).__name__}: {e}") from e
            else:
                root = str(Path(__file__).resolve().parents[1])
                r = subprocess.run([sys.executable, "-c", _CHILD, root, kind, str(location), str(tmp)],
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                if r.returncode != 0:
                    raise IndexerError(f"cannot load the tokenizer of {location} with transformers:\n"
                                       + r.stdout.strip()[-2000:])
            if not (tmp / "tokenizer.json").is_file():
                raise IndexerError(f"transformers wrote no tokenizer.json for {location} (not a fast tokenizer?)")
    return dest / "tokenizer.json"
