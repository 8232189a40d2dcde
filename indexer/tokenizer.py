"""Loading a model's tokenizer as a fast `tokenizers.Tokenizer`, and its fingerprint.

A datastore is only useful in the vocabulary of the model that drafts from it, so nothing here picks a
tokenizer by default: callers pass the model's tokenizer (an object: the daemon and the bench pass the
loaded model's own) or name it. Names, as the command lines take them:
    a tokenizer.json file, or a directory holding only tokenizer files     read as they are
    a model directory, a .gguf file, a Hugging Face hub id                 resolved as the model host loads
                                                                           them (indexer/model_tokenizer.py)
    "embedded"                                                             the embedded default model's
No torch is imported here: transformers, where needed, runs in a child process.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from .types import IndexerError

EMBEDDED_NAME = "embedded:qwen2.5-coder-0.5b"


def _tag(tok, name: str, source: str | None):
    try:
        tok._rest_name = name
        tok._rest_source = source
    except AttributeError:  # pragma: no cover - older tokenizers without attribute support
        pass
    return tok


def load_tokenizer(name_or_path):
    """Return a `tokenizers.Tokenizer` for a tokenizer object or a name (see the module docstring).

    None or "" is an error: the tokenizer must be the model's, so it is always named."""
    from tokenizers import Tokenizer

    if name_or_path is None or not str(name_or_path).strip():
        raise IndexerError("no tokenizer given: a datastore must use the model's own tokenizer; name it (a model "
                           "directory, .gguf file, hub id, tokenizer.json, or 'embedded' for the default model)")
    if not isinstance(name_or_path, (str, os.PathLike)):
        fast = as_fast_tokenizer(name_or_path)
        if fast is name_or_path and getattr(fast, "_rest_name", None):
            return fast   # tagged already (detached_copy, or loaded here): keep its name and source
        return _tag(fast, tokenizer_name(name_or_path), tokenizer_source(name_or_path))
    if str(name_or_path).strip() in (EMBEDDED_NAME, "embedded"):
        from restbase import assets

        from .model_tokenizer import model_tokenizer_json

        # the tokenizer files extracted from the GGUF, loaded as the host loads them (Qwen2's NFC normalizer)
        f = model_tokenizer_json("dir", assets.tokenizer_dir())
        return _tag(Tokenizer.from_file(str(f)), EMBEDDED_NAME, "embedded")
    from .model_tokenizer import model_tokenizer_json

    p = Path(name_or_path).expanduser()
    if p.is_file():
        src = str(p.resolve())
        f = model_tokenizer_json("gguf", p) if p.suffix.lower() == ".gguf" else p
        return _tag(Tokenizer.from_file(str(f)), src, src)
    if p.is_dir():
        src = str(p.resolve())
        model_dir = (p / "tokenizer_config.json").is_file() or (p / "config.json").is_file()
        if not model_dir and (p / "tokenizer.json").is_file():
            return _tag(Tokenizer.from_file(str(p / "tokenizer.json")), src, src)
        return _tag(Tokenizer.from_file(str(model_tokenizer_json("dir", p))), src, src)
    s = str(name_or_path)
    if s.startswith((".", "/", "~")) or s.lower().endswith(".gguf") or not _looks_like_hub_id(s):
        raise IndexerError(f"tokenizer {s}: no such file or directory (nor a hub id like org/name)")
    return _tag(Tokenizer.from_file(str(model_tokenizer_json("hub", s))), s, s)


def _looks_like_hub_id(s: str) -> bool:
    """"org/name" or a bare legacy name ("gpt2")."""
    parts = s.split("/")
    return len(parts) <= 2 and all(parts) and not s.startswith((".", "/", "~")) and "\\" not in s


def as_fast_tokenizer(tok: Any):
    """A `tokenizers.Tokenizer` from itself or from a transformers fast tokenizer (duck-typed)."""
    from tokenizers import Tokenizer

    if isinstance(tok, Tokenizer):
        return tok
    backend = getattr(tok, "backend_tokenizer", None) or getattr(tok, "_tokenizer", None)
    if isinstance(backend, Tokenizer):
        return backend
    raise IndexerError(f"not a fast tokenizer: {type(tok).__name__}")


def detached_copy(tok: Any, *, name: str, source: str | None):
    """An independent `tokenizers.Tokenizer` with the same vocabulary and pipeline as `tok` (a transformers
    fast tokenizer or a Tokenizer): no truncation, no padding, special tokens matched as the default does,
    and none of the original's state shared (threads can encode with both at once)."""
    from tokenizers import Tokenizer

    copy = Tokenizer.from_str(as_fast_tokenizer(tok).to_str())
    copy.no_truncation()
    copy.no_padding()
    return _tag(copy, name, source)


def tokenizer_name(tok: Any) -> str:
    n = getattr(tok, "_rest_name", None)
    if n:
        return n
    n = getattr(tok, "name_or_path", None)
    if n:
        return str(n)
    backend = getattr(tok, "backend_tokenizer", None)
    n = getattr(backend, "_rest_name", None)
    return n or "unnamed"


def tokenizer_source(tok: Any) -> str | None:
    """What `load_tokenizer` needs to load this tokenizer again (None: unknown)."""
    if hasattr(tok, "_rest_source"):
        return tok._rest_source
    n = getattr(tok, "name_or_path", None)
    return str(n) if n else None


_FP_CACHE: dict[int, tuple[Any, dict]] = {}


def fingerprint(tok: Any) -> dict:
    """{"name", "vocab_hash", "vocab_size", "encoding_hash"}: vocab_hash is a sha256 over the sorted (token,
    id) pairs including added tokens, so the same vocabulary loaded two ways (tokenizer.json, transformers)
    agrees; encoding_hash covers what else decides the ids of a text (normalizer, pre-tokenizer, the model's
    merges and settings, how added tokens match). One vocabulary can encode text two ways: transformers 5 loads
    a Qwen2 tokenizer.json with Qwen's split regex and NFC, CodeLlama's with Metaspace instead of its file's
    normalizer, and a store in the other encoding would never match the prompt's ids."""
    key = id(tok)
    hit = _FP_CACHE.get(key)
    if hit is not None and hit[0] is tok:
        return dict(hit[1])
    fast = as_fast_tokenizer(tok)
    vocab = fast.get_vocab(with_added_tokens=True)
    h = hashlib.sha256()
    for t, i in sorted(vocab.items(), key=lambda kv: kv[1]):
        h.update(i.to_bytes(4, "little"))
        h.update(t.encode("utf-8", "surrogatepass"))
        h.update(b"\0")
    size = max(fast.get_vocab_size(with_added_tokens=True), (max(vocab.values()) + 1) if vocab else 0)
    fp = {"name": tokenizer_name(tok), "vocab_hash": h.hexdigest(), "vocab_size": int(size),
          "encoding_hash": _encoding_hash(fast)}
    _FP_CACHE[key] = (tok, fp)
    return dict(fp)


def _encoding_hash(fast) -> str:
    spec = json.loads(fast.to_str())
    model = {k: v for k, v in (spec.get("model") or {}).items() if k != "vocab"}   # the vocabulary: vocab_hash
    added = [{k: t.get(k) for k in ("id", "content", "special", "normalized", "lstrip", "rstrip", "single_word")}
             for t in spec.get("added_tokens") or []]
    canon = {"normalizer": spec.get("normalizer"), "pre_tokenizer": spec.get("pre_tokenizer"), "model": model,
             "added_tokens": added}
    return hashlib.sha256(json.dumps(canon, sort_keys=True, ensure_ascii=False).encode()).hexdigest()


def same_vocabulary(a: dict, b: dict) -> bool:
    """The same vocabulary, and the same encoding where both fingerprints record it (stores built before
    encoding_hash existed are checked by vocabulary alone)."""
    if a.get("vocab_hash") != b.get("vocab_hash") or a.get("vocab_size") != b.get("vocab_size"):
        return False
    return not (a.get("encoding_hash") and b.get("encoding_hash")) or a["encoding_hash"] == b["encoding_hash"]


def encode_batch(tok: Any, texts: list[str]) -> list[list[int]]:
    """Token ids of each text, without special tokens, batched (the Rust side runs them in parallel)."""
    fast = as_fast_tokenizer(tok)
    enc = getattr(fast, "encode_batch_fast", None) or fast.encode_batch  # _fast: no offsets (~1.4x)
    return [e.ids for e in enc(texts, add_special_tokens=False)]


def decode(tok: Any, ids) -> str:
    fast = as_fast_tokenizer(tok)
    return fast.decode(list(ids), skip_special_tokens=False)
