"""The model host: load a causal LM, pick device and precision, attach its FIM prompt format.

    load_model(spec=None, device="auto", precision="auto") -> LoadedModel

`spec` is one of
    None                 the embedded Qwen2.5-Coder-0.5B-Instruct (restbase/assets.py assembles its GGUF)
    an embedded name     "qwen2.5-coder-0.5b" (also "embedded"), "qwen2.5-coder-1.5b": restbase/assets.py MODELS
                         (an existing directory of that name wins: it is what a path means)
    a directory          a Hugging Face checkpoint (config.json + weights + tokenizer)
    a .gguf file         converted once into a safetensors directory in the user cache, then loaded from there
    a hub id             "org/name", fetched by transformers where the network allows

Device "auto" is CUDA when available, else CPU. Precision "auto" is bf16 on CUDA (fp16 where the GPU has
no bf16) and fp32 on CPU; "int8" (CPU only) replaces the decoder's nn.Linear layers and the LM head by per-row
W8A8 int8 products (rest_lsp/model/int8row.py: batch-invariant, so speculation stays exact), activations fp32;
"int8w" (CPU only) by weight-only int8 with bf16 products (rest_lsp/model/int8weight.py: a quarter of fp32's
bytes per step, activations otherwise fp32, batch-invariant too); "int4w" (CPU only, a GGUF model) by the
GGUF's own Q4_K blocks as 4-bit products, its other layers as int8w (rest_lsp/model/int4weight.py).
"""
from __future__ import annotations

import hashlib
import os
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from rest_lsp.filenames import safe_filename
from restbase.storage import atomic_dir, cache_root, file_lock

from . import PRECISIONS
from .prompts import (FimFormat, RepoContext, build_prompt, context_limit, decode_as_continuation, resolve_fim,
                      stop_token_ids)

_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "int8": torch.float32,
           "int8w": torch.float32, "int4w": torch.float32}
EMBEDDED_NAME = "Qwen2.5-Coder-0.5B-Instruct"   # the default embedded model's title (restbase/assets.py MODELS)


class ModelLoadError(RuntimeError):
    """A model could not be found, fetched, converted or loaded; the message says which and why."""


@dataclass
class LoadedModel:
    model: Any                     # transformers PreTrainedModel, eval mode
    tokenizer: Any                 # transformers PreTrainedTokenizerBase
    device: torch.device
    dtype: torch.dtype             # activation dtype (fp32 for int8: norms, attention, embeddings)
    precision: str                 # "fp32" | "int8" | "int8w" | "int4w" | "bf16" | "fp16"
    name: str
    fim: FimFormat | None
    path: Path | None = None       # the directory the weights were loaded from (None: hub cache)
    context_length: int | None = None
    stop_ids: list[int] = field(default_factory=list)   # eos + the FIM family's end-of-infill tokens
    # what indexer.tokenizer.load_tokenizer resolves to this tokenizer ("embedded", a directory, a hub id):
    # for `rest-index build --tokenizer` and records; in process, datastores take `indexer_tokenizer`
    tokenizer_source: str | None = None
    gguf: Path | None = None       # the GGUF the weights were converted from (int4w reads its blocks)

    def build_prompt(self, prefix: str, suffix: str | None = None, *, middle: str = "", order: str = "psm",
                     max_new_tokens: int = 0, fim: bool = True, reserve: int = 32,
                     repo: RepoContext | None = None) -> list[int]:
        """Prompt ids for the cursor between prefix + middle and suffix (`middle`, `order` "psm"/"spm": see
        rest_lsp.model.prompts.build_prompt; `self.fim.orders` lists the orders the family supports), fitted
        to the context minus max_new_tokens and `reserve` positions for draft trees (so the engine never has
        to cut the prompt, FIM markers included). `repo`: other files of the repository before the prefix."""
        budget = None if self.context_length is None else max(1, self.context_length - max_new_tokens - reserve)
        return build_prompt(self.tokenizer, prefix, suffix, self.fim if fim else None, middle=middle,
                            order=order, max_tokens=budget, repo=repo)

    @property
    def indexer_tokenizer(self):
        """The model's own tokenizer for the datastores (workspace, live buffers, corpus): a `tokenizers`
        copy of it, so the indexing threads never share the transformers object's mutable state (truncation,
        special-token splitting) with the inference thread. Same vocabulary, same fingerprint."""
        tok = self.__dict__.get("_indexer_tokenizer")
        if tok is None:
            from indexer.tokenizer import detached_copy

            tok = detached_copy(self.tokenizer, name=self.tokenizer_source or self.name, source=self.tokenizer_source)
            self.__dict__["_indexer_tokenizer"] = tok
        return tok

    @property
    def vocab_size(self) -> int:
        head = self.model.get_output_embeddings()
        # out_features first: a head whose weight the packed verifier released (FastVerifier.release_model_copies)
        return int(head.out_features) if hasattr(head, "out_features") else int(head.weight.shape[0])


# ---------------------------------------------------------------------------------------- device
def resolve_device(device: str = "auto") -> torch.device:
    if device in (None, "auto"):
        if torch.cuda.is_available():
            return torch.device("cuda")
        return torch.device("cpu")
    d = torch.device(device)
    if d.type == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError(f"device {device!r} requested but CUDA is not available")
    if d.type == "mps":
        # refused even where MPS is available: REST's output is plain greedy decoding's only where a draft
        # tree's rows round as single rows do, which the static verifier gets from float64 attention (not
        # run on MPS) and nothing here has checked for transformers' forward on Apple GPUs
        raise ModelLoadError(f"device {device!r} is not supported: the exact tree verifier attends in float64, "
                             "which MPS does not run; use device 'cpu' (or 'cuda')")
    if d.type not in ("cpu", "cuda"):
        raise ModelLoadError(f"device {device!r} is not supported; use 'auto', 'cpu', 'cuda' or 'cuda:N'")
    return d


def resolve_precision(precision: str, device: torch.device) -> str:
    if precision not in PRECISIONS:
        raise ModelLoadError(f"unknown precision {precision!r}; one of {', '.join(PRECISIONS)}")
    if precision == "auto":
        if device.type == "cuda":
            return "bf16" if torch.cuda.is_bf16_supported() else "fp16"
        return "fp32"
    if precision in ("int8", "int8w", "int4w") and device.type != "cpu":
        raise ModelLoadError(f"precision {precision} (int8 products on the CPU) runs on the CPU only; "
                             f"use bf16/fp16 on {device.type}")
    return precision


# ---------------------------------------------------------------------------------------- GGUF cache
def gguf_cache_dir(gguf: Path) -> Path:
    """Where a GGUF's converted safetensors copy lives: keyed by its resolved path, size and mtime."""
    gguf = Path(gguf).resolve()
    st = gguf.stat()
    key = hashlib.sha256(f"{gguf}\0{st.st_size}\0{st.st_mtime_ns}".encode()).hexdigest()[:16]
    stem = safe_filename(gguf.stem)[:60]
    return cache_root() / "converted" / f"{stem}-{key}"


def _default_gguf_loader(gguf: Path, out: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    # the dequantized weights are plain tensors: drop the GGUF quantizer so save_pretrained writes them
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(str(out))
    tok.save_pretrained(str(out))


def convert_gguf(gguf: str | Path, dest: Path | None = None, *,
                 loader: Callable[[Path, Path], None] = _default_gguf_loader) -> Path:
    """Convert a GGUF file into a safetensors model directory once; return the directory.

    Atomic: the conversion writes into a temporary sibling directory that is renamed into place only when
    complete, under a file lock, so a killed or failed conversion never leaves a half-written cache entry.
    The directory's checksums (rest_lsp/model/converted.py) are checked at each use: a damaged cache is
    converted again, with one line on stderr saying why."""
    from . import converted

    gguf = Path(gguf).expanduser().resolve()
    if not gguf.is_file():
        raise ModelLoadError(f"no such GGUF file: {gguf}")
    dest = Path(dest) if dest is not None else gguf_cache_dir(gguf)
    if dest.is_dir() and converted.problem(dest) is None:
        return dest
    with file_lock(dest.with_name(dest.name + ".lock")):
        damage = converted.problem(dest) if dest.is_dir() else "absent"
        if damage is None:
            return dest
        if damage != "absent":   # a checksum or size mismatch: convert again instead of failing the load
            print(f"rest-lsp: the converted model cache {dest} is damaged ({damage}); converting {gguf.name} "
                  "again", file=sys.stderr, flush=True)
        with atomic_dir(dest) as tmp:
            print(f"rest-lsp: converting {gguf.name} into a safetensors cache (once; about 100 s on a "
                  "small CPU)", file=sys.stderr, flush=True)
            try:
                loader(gguf, tmp)
            except ModelLoadError:
                raise
            except Exception as e:
                raise ModelLoadError(f"could not convert GGUF {gguf}: {type(e).__name__}: {e}") from e
            if not (tmp / "config.json").is_file():
                raise ModelLoadError(f"converting {gguf} produced no config.json")
            converted.record(tmp)
    return dest


def embedded_model_dir(model: str | None = None) -> Path:
    """An embedded model (None: the default) as a safetensors directory in the cache (assembling and
    converting on first use)."""
    from restbase.assets import EmbeddedModelError, converted_dir, gguf_path

    try:
        gguf = gguf_path(model)
    except EmbeddedModelError as e:
        raise ModelLoadError(str(e)) from e
    return convert_gguf(gguf, converted_dir(model))


# ---------------------------------------------------------------------------------------- loading
def _looks_like_path(spec: str) -> bool:
    return (spec.startswith((".", "/", "~", "\\")) or spec.lower().endswith(".gguf")
            or os.path.isabs(spec) or spec.count("/") > 1 or (os.sep != "/" and os.sep in spec))


def _resolve_spec(spec: str | os.PathLike | None) -> tuple[str, str | Path]:
    """-> (kind, location): kind in "dir" | "hub" | "embedded" (location: a converted embedded model)."""
    if spec is None:
        return "embedded", embedded_model_dir()
    s = os.fspath(spec)
    p = Path(s).expanduser()
    if not p.exists():
        if (m := embedded_model(s)) is not None:
            return "embedded", embedded_model_dir(m.name)
        if s == "auto":   # resolved before loading: the choice reads measurements, which loading must not import
            raise ModelLoadError("model 'auto' is chosen per machine by the daemon and `rest-lsp complete` "
                                 "(rest_lsp/model/choice.py); name a model here")
    if p.is_dir():
        if not (p / "config.json").is_file():
            raise ModelLoadError(f"{p} is a directory but not a Hugging Face model (no config.json)")
        return "dir", p
    if p.is_file():
        if p.suffix.lower() == ".gguf":
            return "dir", convert_gguf(p)
        raise ModelLoadError(f"{p} is neither a model directory nor a .gguf file")
    if _looks_like_path(s):
        raise ModelLoadError(f"no such model: {s} (not an existing directory or .gguf file)")
    return "hub", s


def gguf_source(spec: str | os.PathLike | None, kind: str) -> Path | None:
    """The GGUF file a model spec was converted from (an embedded model's, or a .gguf path) where it is on disk;
    None otherwise (nothing is fetched for it)."""
    if kind == "embedded":
        from restbase.assets import embedded_dir

        m = embedded_model(spec)
        if m is None:
            return None
        p = embedded_dir() / m.gguf_name
        return p if p.is_file() and p.stat().st_size == m.size else None
    p = Path(os.fspath(spec)).expanduser() if spec is not None else None
    return p.resolve() if p is not None and p.is_file() and p.suffix.lower() == ".gguf" else None


def embedded_model(spec: str | os.PathLike | None):
    """The restbase.assets.EmbeddedModel a model spec names (None: the default), or None for a path or hub id."""
    from restbase import assets

    return assets.get(None) if spec is None else assets.lookup(os.fspath(spec))


def _load_error(location, kind: str, what: str, e: Exception) -> ModelLoadError:
    if kind == "hub":
        return ModelLoadError(
            f"{location!r} is not a local model directory or .gguf file, and fetching it from the "
            f"Hugging Face Hub failed ({type(e).__name__}: {e}); offline, pass a local model "
            "directory or .gguf file")
    return ModelLoadError(f"could not load the {what} of {location}: {type(e).__name__}: {e}")


def _load_tokenizer(location, kind: str):
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(location))
    except Exception as e:
        raise _load_error(location, kind, "tokenizer", e) from e
    decode_as_continuation(tokenizer)   # completions keep the space they start with (SentencePiece decoders)
    return tokenizer


QUANTIZED = ("int8", "int8w", "int4w")  # precisions that replace the linear layers (activations fp32)


def quantize(model, precision: str, gguf: Path | None = None, name: str | None = None):
    """The decoder's linear layers and the LM head replaced in place: per-row W8A8 for "int8"
    (rest_lsp/model/int8row.py), weight-only int8 for "int8w" (rest_lsp/model/int8weight.py), the GGUF's
    Q4_K blocks for "int4w" (rest_lsp/model/int4weight.py). `name`: the model's (LoadedModel.name), which
    decides whether int4w keeps float layers for prompt chunks (int4weight.prompts_on_kernel)."""
    from .int4weight import quantize_from_gguf
    from .int8row import quantize_model
    from .int8weight import quantize_weights

    try:
        if precision == "int4w":
            if gguf is None:
                raise ValueError("it reads a GGUF's 4-bit blocks, and this model was not loaded from a GGUF")
            from .int4weight import prompts_on_kernel
            from .probes import cpu_has_bf16

            # prompt chunks on the float layers: bf16 where the CPU multiplies it natively (2.4x fp32's speed);
            # none where the kernel's rows cost less than fp32's (the avx2 build, for the models measured so)
            quantize_from_gguf(model, gguf, None if prompts_on_kernel(name)
                               else torch.bfloat16 if cpu_has_bf16() else torch.float32)
            return model
        return (quantize_model if precision == "int8" else quantize_weights)(model)
    except (RuntimeError, ValueError) as e:
        raise ModelLoadError(f"precision {precision}: {e}; use fp32 or bf16") from e


def return_freed_memory() -> bool:
    """Hand the C heap's free pages back to the system (glibc's malloc_trim). Tensors of up to 32 MB live in the
    heap once glibc has raised its mmap threshold (it does as large blocks are freed), and freeing them leaves
    the pages with the process: a daemon that released its model's float copies kept 0.8 GB of them until this
    ran (docs/results/memory.md). -> whether it ran (glibc only)."""
    import ctypes

    try:
        return bool(ctypes.CDLL("libc.so.6").malloc_trim(0))
    except (OSError, AttributeError):
        return False


def load_model(spec: str | os.PathLike | None = None, *, device: str = "auto", precision: str = "auto",
               fim: str | FimFormat | None = "auto", attn_implementation: str | None = None) -> LoadedModel:
    """Load a causal LM for completion. See the module docstring for `spec`, `device`, `precision`.

    `fim`: "auto" (from the tokenizer's special tokens), "none", a family name (qwen, starcoder, codellama,
    deepseek) or a FimFormat. `attn_implementation`: passed to transformers (default: its own choice)."""
    from transformers import AutoModelForCausalLM

    dev = resolve_device(device)
    prec = resolve_precision(precision, dev)
    kind, location = _resolve_spec(spec)
    tokenizer = _load_tokenizer(location, kind)
    kwargs: dict[str, Any] = {"dtype": _DTYPES[prec]}
    if attn_implementation:
        kwargs["attn_implementation"] = attn_implementation
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = AutoModelForCausalLM.from_pretrained(str(location), **kwargs)
    except Exception as e:
        raise _load_error(location, kind, "weights", e) from e
    model.eval()
    model.requires_grad_(False)
    gguf = gguf_source(spec, kind)
    embedded = embedded_model(spec) if kind == "embedded" else None
    if embedded is not None:
        name = embedded.title
    elif kind == "hub":
        name = str(location)
    else:
        name = Path(os.fspath(spec)).expanduser().name or str(location)
    if prec in QUANTIZED:
        model = quantize(model, prec, gguf, name)
    else:
        model.to(dev)
    if getattr(model.generation_config, "pad_token_id", None) is None and tokenizer.eos_token_id is not None:
        model.generation_config.pad_token_id = tokenizer.eos_token_id
    fim_format = resolve_fim(fim, tokenizer)
    return LoadedModel(
        model=model, tokenizer=tokenizer, device=dev, dtype=_DTYPES[prec], precision=prec, name=name,
        fim=fim_format, path=None if kind == "hub" else Path(location),
        context_length=context_limit(tokenizer, model), stop_ids=stop_token_ids(tokenizer, fim_format),
        # the indexer knows the default model's tokenizer as "embedded"; another embedded model's is its directory
        tokenizer_source="embedded" if embedded is not None and embedded.title == EMBEDDED_NAME else str(location),
        gguf=gguf,
    )
