"""Prompt formats: plain prefix, and fill-in-the-middle per model family, in PSM or SPM order.

The prompt is assembled as token ids, piece by piece (special tokens by id, text pieces encoded without
special tokens), so that left-truncation to the model's context works on ids and never splits a special
token:

    psm  [bos?] PREFIX_MARK enc(prefix) SUFFIX_MARK enc(suffix) MIDDLE_MARK enc(middle)
    spm  [bos?] PREFIX_MARK SUFFIX_MARK enc(suffix) MIDDLE_MARK enc(prefix) enc(middle)

`middle` is text the infill already starts with (the cursor line's text before the cursor, in the layout that
keeps the prompt's start stable while a person types on a line). SPM (suffix first) is the order CodeLlama
7B/13B and StarCoder were also trained on, laid out as Meta's `infilling_prompt_tokens(..., suffix_first=True)`
and bigcode's Megatron FIM permutation do (prefix marker, suffix marker, suffix, middle marker, prefix): the
suffix then comes before everything typing changes. Each family declares the orders it was trained with
(`FimFormat.orders`); asking a family for another order is a ValueError.

Families (chosen from the tokenizer's special tokens by `detect_fim`, overridable by name):
    qwen       <|fim_prefix|>{prefix}<|fim_suffix|>{suffix}<|fim_middle|>   (Qwen2.5-Coder; psm)
    starcoder  <fim_prefix>{prefix}<fim_suffix>{suffix}<fim_middle>          (StarCoder/2, SantaCoder; psm, spm)
    codellama  <PRE> {prefix} <SUF>{suffix} <MID>                            (CodeLlama; psm, spm:
               <PRE> <SUF>{suffix} <MID> {prefix}). SentencePiece spacing as Meta's reference: the text that
               starts the document (the prefix; in SPM or a plain prompt the middle when the prefix is empty)
               carries the dummy-prefix space, `▁` + text even when the text starts with a space; the suffix
               and the middle are encoded without it (`encode_infilling`); an infill ends at `<EOT>`.
    deepseek   <｜fim▁begin｜>{prefix}<｜fim▁hole｜>{suffix}<｜fim▁end｜>      (DeepSeek-Coder; psm)
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence


@dataclass(frozen=True)
class FimFormat:
    name: str
    prefix_token: str
    suffix_token: str
    middle_token: str
    # tokens that end an infill (besides eos), when the vocabulary has them
    stop_tokens: tuple[str, ...] = ()
    # CodeLlama: SentencePiece spacing (the suffix and the middle without the dummy-prefix space, the first
    # text of the document with it)
    suffix_no_leading_space: bool = False
    # the orders the family was trained with: "psm" (prefix, suffix, middle) and/or "spm" (suffix first)
    orders: tuple[str, ...] = ("psm",)
    # alternative spellings of the markers (first one present in the vocabulary wins)
    aliases: dict = field(default_factory=dict, compare=False, hash=False)

    def token_ids(self, tokenizer) -> tuple[int, int, int]:
        vocab = _vocab(tokenizer)
        ids = []
        for t in (self.prefix_token, self.suffix_token, self.middle_token):
            for cand in (t, *self.aliases.get(t, ())):
                if cand in vocab:
                    ids.append(vocab[cand])
                    break
            else:
                raise ValueError(f"FIM format {self.name!r}: the tokenizer has no token {t!r}")
        return ids[0], ids[1], ids[2]

    def check_order(self, order: str) -> None:
        """ValueError unless `order` is one this family was trained with."""
        check_order_name(order)
        if order not in self.orders:
            raise ValueError(f"FIM format {self.name!r} was trained in the order(s) {', '.join(self.orders)}; "
                             f"not {order!r}")

    def stop_token_ids(self, tokenizer) -> list[int]:
        vocab = _vocab(tokenizer)
        return [vocab[t] for t in self.stop_tokens if t in vocab]


FIM_FORMATS: dict[str, FimFormat] = {
    "qwen": FimFormat("qwen", "<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>",
                      stop_tokens=("<|fim_pad|>", "<|endoftext|>", "<|file_sep|>", "<|repo_name|>",
                                   "<|im_end|>", "<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>")),
    "starcoder": FimFormat("starcoder", "<fim_prefix>", "<fim_suffix>", "<fim_middle>",
                           stop_tokens=("<|endoftext|>", "<fim_pad>", "<file_sep>", "<fim_prefix>",
                                        "<fim_suffix>", "<fim_middle>"), orders=("psm", "spm")),
    "codellama": FimFormat("codellama", "▁<PRE>", "▁<SUF>", "▁<MID>", stop_tokens=("▁<EOT>", "<EOT>"),
                           suffix_no_leading_space=True, orders=("psm", "spm"),
                           aliases={"▁<PRE>": ("<PRE>",), "▁<SUF>": ("<SUF>",), "▁<MID>": ("<MID>",)}),
    "deepseek": FimFormat("deepseek", "<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>",
                          stop_tokens=("<｜end▁of▁sentence｜>", "<|EOT|>")),
}
# the order detection tries them in
_DETECT_ORDER = ("qwen", "deepseek", "starcoder", "codellama")
ORDERS = ("psm", "spm")


def check_order_name(order: str) -> None:
    if order not in ORDERS:
        raise ValueError(f"unknown FIM order {order!r}; one of {', '.join(ORDERS)}")


def _vocab(tokenizer) -> dict[str, int]:
    cached = getattr(tokenizer, "_rest_lsp_vocab", None)
    if cached is not None:
        return cached
    vocab = dict(tokenizer.get_vocab())
    try:
        tokenizer._rest_lsp_vocab = vocab
    except Exception:
        pass
    return vocab


def detect_fim(tokenizer) -> FimFormat | None:
    """The FIM format whose special tokens the tokenizer has, or None (plain prefix prompts only)."""
    vocab = _vocab(tokenizer)
    for name in _DETECT_ORDER:
        f = FIM_FORMATS[name]
        if all(any(c in vocab for c in (t, *f.aliases.get(t, ())))
               for t in (f.prefix_token, f.suffix_token, f.middle_token)):
            return f
    return None


def resolve_fim(spec, tokenizer) -> FimFormat | None:
    """`spec`: "auto" (detect), "none"/None (plain prompts), a family name, or a FimFormat."""
    if isinstance(spec, FimFormat):
        spec.token_ids(tokenizer)  # fail early if the tokenizer lacks its tokens
        return spec
    if spec is None or spec == "none":
        return None
    if spec == "auto":
        return detect_fim(tokenizer)
    if spec not in FIM_FORMATS:
        raise ValueError(f"unknown FIM format {spec!r}; known: auto, none, {', '.join(FIM_FORMATS)}")
    f = FIM_FORMATS[spec]
    f.token_ids(tokenizer)
    return f


# ---------------------------------------------------------------------------------------- encoding
def _encode(tokenizer, text: str) -> list[int]:
    if not text:
        return []
    return list(tokenizer.encode(text, add_special_tokens=False))


def _encode_no_leading_space(tokenizer, text: str) -> list[int]:
    """Encode without a SentencePiece dummy-prefix space (Meta's `encode_infilling`)."""
    if not text:
        return []
    ids = _encode(tokenizer, text)
    if not ids:
        return ids
    first = tokenizer.convert_ids_to_tokens(ids[0])
    if not (isinstance(first, str) and first.startswith("▁") and not text.startswith((" ", "▁"))):
        return ids
    anchor = "☺"
    pre = _encode(tokenizer, anchor)
    both = _encode(tokenizer, anchor + text)
    if both[: len(pre)] == pre:
        return both[len(pre):]
    return ids


def _encode_document_start(tokenizer, text: str) -> list[int]:
    """Encode text that starts a document as SentencePiece does (Meta's `Tokenizer.encode`): `▁` + text.

    transformers 5 loads Llama/CodeLlama tokenizers with a Metaspace pre-tokenizer (prepend_scheme "first")
    that adds no `▁` before text already starting with a space, where SentencePiece does; there the space
    is added by hand, as transformers' own CodeLlama infilling does (" " + prefix)."""
    ids = _encode(tokenizer, text)
    if ids and text.startswith(" ") and _skips_dummy_before_space(tokenizer):
        return _encode(tokenizer, " " + text)
    return ids


def _skips_dummy_before_space(tokenizer) -> bool:
    """True for a tokenizer with a SentencePiece dummy prefix that it leaves out before a leading space."""
    cached = getattr(tokenizer, "_rest_lsp_skips_dummy", None)
    if cached is None:
        a = _encode(tokenizer, "a")
        first = tokenizer.convert_ids_to_tokens(a[0]) if a else ""
        cached = isinstance(first, str) and first.startswith("▁") and _encode(tokenizer, " a") == a
        try:
            tokenizer._rest_lsp_skips_dummy = cached
        except Exception:
            pass
    return cached


def _leading_special(tokenizer) -> list[int]:
    """[bos] when the tokenizer adds one by default (Llama, DeepSeek), else [] (Qwen, StarCoder)."""
    bos = getattr(tokenizer, "bos_token_id", None)
    if bos is None:
        return []
    try:
        ids = tokenizer("a", add_special_tokens=True)["input_ids"]
    except Exception:
        return []
    return [bos] if ids and ids[0] == bos else []


def context_limit(tokenizer, model=None) -> int | None:
    """The model's context length in tokens (config.max_position_embeddings), else the tokenizer's."""
    cfg = getattr(model, "config", None)
    for attr in ("max_position_embeddings", "n_positions", "max_sequence_length"):
        v = getattr(cfg, attr, None) if cfg is not None else None
        if isinstance(v, int) and v > 0:
            return v
    v = getattr(tokenizer, "model_max_length", None)
    if isinstance(v, int) and 0 < v < 10_000_000:
        return v
    return None


# ---------------------------------------------------------------------------------- repository context
REPO_TOKENS = ("<|repo_name|>", "<|file_sep|>")  # Qwen2.5-Coder's repository-level pretraining format
# line comments by file extension, for the families without repository tokens (a path comment heads each file)
_COMMENTS = {"#": (".py", ".pyi", ".rb", ".sh", ".bash", ".zsh", ".pl", ".r", ".jl", ".toml", ".yaml", ".yml",
                   ".cfg", ".ini", ".cmake", ".ex", ".exs", ".nim", ".ps1", ".mk"),
             "--": (".lua", ".sql", ".hs", ".elm", ".ada", ".adb"), ";": (".el", ".clj", ".scm", ".lisp"),
             "%": (".erl", ".tex", ".m")}


@dataclass(frozen=True)
class RepoContext:
    """Files of the repository other than the one being edited, for the start of the prompt.

    `files`: (path, text) pairs, the least relevant first (the most relevant ends next to the current file);
    `path`: the current file's path. Both relative to the repository, `name`. A prompt with a RepoContext
    starts with its block, so a completion's KV cache of everything after it survives as long as the block
    does (rest_lsp/service/crossfile.py keeps it stable)."""

    name: str
    path: str
    files: tuple[tuple[str, str], ...] = ()


def comment_for(path: str) -> str:
    """The line-comment marker of a file's language (by extension; `//` for the C family and the unknown)."""
    low = path.lower()
    for mark, exts in _COMMENTS.items():
        if low.endswith(exts):
            return mark
    return "//"


def repo_block(tokenizer, fim: FimFormat | None, repo: RepoContext) -> tuple[list[int], str]:
    """The repository block as (token ids before the FIM prefix marker, text that starts the prefix).

    A tokenizer with Qwen2.5-Coder's repository tokens gets its pretraining layout, as token ids:
        <|repo_name|>name\n <|file_sep|>path\ntext\n ... <|file_sep|>current path\n   then <|fim_prefix|>...
    any other family (CodeLlama, StarCoder, DeepSeek, plain prompts) a text block that opens the prefix, each
    file headed by a path comment, the current file's path last:
        # Path: pkg/other.py\ntext\n ... # Path: pkg/current.py\n
    """
    vocab = _vocab(tokenizer)
    files = [(p, t if t.endswith("\n") else t + "\n") for p, t in repo.files]
    if all(t in vocab for t in REPO_TOKENS):
        rn, fs = (vocab[t] for t in REPO_TOKENS)
        ids = [rn] + _encode(tokenizer, f"{repo.name}\n")
        for path, text in files:
            ids += [fs] + _encode(tokenizer, f"{path}\n") + _encode(tokenizer, text)
        return ids + [fs] + _encode(tokenizer, f"{repo.path}\n"), ""
    mark = comment_for(repo.path)
    text = "".join(f"{comment_for(p)} Path: {p}\n{t}" for p, t in files)
    return [], text + f"{mark} Path: {repo.path}\n"


def build_prompt(tokenizer, prefix: str, suffix: str | None, fim: FimFormat | None, *,
                 middle: str = "", order: str = "psm", max_tokens: int | None = None,
                 suffix_share: float = 0.25, repo: RepoContext | None = None) -> list[int]:
    """Token ids of the prompt for completing at the cursor between `prefix` + `middle` and `suffix`.

    - `fim` None or `suffix` None: a plain prefix prompt, enc(prefix) + enc(middle). Otherwise
      fill-in-the-middle (an empty suffix still uses the FIM format, so the model knows where the text ends),
      with `middle` after the middle marker: the start of the infill, already typed.
    - `order`: "psm", or "spm" (suffix first; the prefix and then the middle follow the middle marker). A FIM
      format not trained in that order raises ValueError; a plain prompt has no order to honour.
    - prefix and middle are encoded apart, so that appending to the middle never changes the prefix's tokens.
    - `max_tokens` (default: the tokenizer's model_max_length when it is a real limit): a longer prompt
      drops tokens from the left of the prefix and keeps the end of the prefix; the suffix (its start, next
      to the cursor) keeps at most `suffix_share` of the budget when the prefix needs the room.
    - An empty prompt yields one start token (bos, else eos) so there is always something to condition on.
    - `repo`: other files of the repository and the current file's path before the prefix (`repo_block`);
      left out when it would take more than half of `max_tokens`, a text block cut from the left with the
      prefix when the budget needs the room.
    Raises ValueError when `max_tokens` cannot hold even the format's own tokens plus one prefix token."""
    check_order_name(order)
    if max_tokens is None:
        max_tokens = context_limit(tokenizer)
    lead = _leading_special(tokenizer)
    if repo is not None:
        block, block_text = repo_block(tokenizer, fim, repo)
        if max_tokens is not None and len(block) > max_tokens // 2:
            block, block_text = [], ""
        lead = lead + block
        prefix = block_text + (prefix or "")
    use_fim = fim is not None and suffix is not None
    if use_fim:
        fim.check_order(order)
    sentencepiece = use_fim and fim.suffix_no_leading_space
    spm = use_fim and order == "spm"
    # the middle continues the prefix, so it has no dummy space; but with an empty prefix, in SPM or a plain
    # prompt it is the text's start (in PSM the middle marker sits between them either way)
    middle_starts_text = not prefix and (spm or not use_fim)
    pre = (_encode_document_start if sentencepiece else _encode)(tokenizer, prefix or "")
    mid = (_encode if middle_starts_text else _encode_no_leading_space)(tokenizer, middle)
    if use_fim:
        p_id, s_id, m_id = fim.token_ids(tokenizer)
        suf = (_encode_no_leading_space if sentencepiece else _encode)(tokenizer, suffix)
        overhead = len(lead) + 3
    else:
        suf = []
        overhead = len(lead)
    if max_tokens is not None:
        avail = max_tokens - overhead
        if avail < 1:
            raise ValueError(f"a prompt budget of {max_tokens} tokens cannot hold the prompt format "
                             f"({overhead} special tokens) and any text")
        mid = mid[-avail:]   # the text next to the cursor goes last
        avail -= len(mid)
        if len(pre) + len(suf) > avail:
            suf_budget = min(len(suf), max(int(avail * suffix_share), avail - len(pre)))
            suf = suf[:suf_budget]
            keep = avail - len(suf)
            pre = pre[len(pre) - keep:] if keep > 0 else []
    if spm:
        ids = lead + [p_id, s_id] + suf + [m_id] + pre + mid
    elif use_fim:
        ids = lead + [p_id] + pre + [s_id] + suf + [m_id] + mid
    else:
        ids = lead + pre + mid
    if not ids:
        start = getattr(tokenizer, "bos_token_id", None)
        if start is None:
            start = getattr(tokenizer, "eos_token_id", None)
        if start is None:
            raise ValueError("empty prompt and the tokenizer has neither a bos nor an eos token")
        ids = [start]
    return ids


def decode_as_continuation(tokenizer) -> bool:
    """Make `tokenizer.decode` keep the space a completion starts with; returns whether it changed anything.

    SentencePiece-style decoders (Llama, CodeLlama: a `Strip` of one leading space, or a Metaspace decoder
    that prepends) drop the first space of what they decode, undoing the dummy prefix of a whole document.
    Completions continue a document, so their first space is real: `▁return` after `x =` is " return"
    (Meta decodes infills the same way: `decode_infilling`). Byte-level decoders are left as they are."""
    import json

    from tokenizers import Tokenizer

    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or backend.decoder is None:
        return False
    spec = json.loads(backend.to_str())
    decoder = _without_leading_strip(spec["decoder"])
    if decoder == spec["decoder"]:
        return False
    spec["decoder"] = decoder
    backend.decoder = Tokenizer.from_str(json.dumps(spec)).decoder
    return True


def _without_leading_strip(d: dict | None) -> dict | None:
    if not isinstance(d, dict):
        return d
    if d.get("type") == "Sequence":
        return {**d, "decoders": [_without_leading_strip(x) for x in d["decoders"]
                                  if not (x.get("type") == "Strip" and x.get("content") == " " and x.get("start"))]}
    if d.get("type") == "Metaspace" and (d.get("prepend_scheme") not in (None, "never") or d.get("add_prefix_space")):
        return {**{k: v for k, v in d.items() if k != "add_prefix_space"}, "prepend_scheme": "never"}
    return d


def stop_token_ids(tokenizer, fim: FimFormat | None = None) -> list[int]:
    """Token ids that end a completion: eos, plus the FIM family's end-of-infill tokens."""
    out: list[int] = []
    eos = getattr(tokenizer, "eos_token_id", None)
    if isinstance(eos, int):
        out.append(eos)
    elif isinstance(eos, Sequence):
        out.extend(int(e) for e in eos)
    if fim is not None:
        out.extend(fim.stop_token_ids(tokenizer))
    return list(dict.fromkeys(out))
