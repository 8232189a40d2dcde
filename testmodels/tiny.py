"""Tiny random causal LMs with real trained tokenizers, for tests and offline demos.

Tests everywhere (engine, daemon, editors) need a model directory that loads like any Hugging Face
checkpoint but builds in a second without a download. Two families:

- `make_tiny_model_dir`: Qwen2 architecture, a byte-level BPE carrying Qwen2.5-Coder's FIM tokens.
- `make_tiny_codellama_dir`: Llama architecture laid out as CodeLlama-7B's checkpoint is: a SentencePiece-
  style BPE (dummy-prefix space, byte fallback, bos added) in a 32,016-id vocabulary with CodeLlama's 16
  extra pieces at 32000-32015 (`▁<PRE>` 32007, `▁<SUF>` 32008, `▁<MID>` 32009, `▁<EOT>` 32010), a
  `tokenizer.json` as the hub ships it (legacy normalizer, no `<FILL_ME>`) and `tokenizer_class`
  CodeLlamaTokenizer, so transformers loads it as it loads the real one (Metaspace, `<FILL_ME>` added
  at 32016: one id past the model's embedding).

The tokenizers are trained on a few standard-library sources; the weights are random, so outputs are
deterministic but meaningless.

Test support (the `testmodels` package at the repository root), not shipped in the wheel; run from the root:

    python -m testmodels.tiny DIR [--seed N] [--family qwen|qwen3|codellama]
"""
from __future__ import annotations

import argparse
import inspect
import json
from pathlib import Path

SPECIAL_TOKENS = ["<|endoftext|>", "<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|fim_pad|>"]


def _training_text() -> list[str]:
    # Real Python source from the standard library keeps the merges code-like without shipping data.
    import argparse as m1, dataclasses as m2, json.decoder as m3, textwrap as m4

    return [inspect.getsource(m) for m in (m1, m2, m3, m4)]


def train_tokenizer(vocab_size: int = 512):
    """A byte-level BPE tokenizer wrapped as a transformers fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_training_text(), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=SPECIAL_TOKENS[1:],
    )


def tiny_config(vocab_size: int, *, layers: int = 2, hidden: int = 64, arch: str = "qwen2"):
    """arch "qwen2" (Qwen2.5-Coder's) or "qwen3" (per-head q/k norms, an explicit head width, no q/k/v bias)."""
    from transformers import Qwen2Config, Qwen3Config

    common = dict(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096, tie_word_embeddings=False)
    if arch == "qwen3":
        return Qwen3Config(**common, head_dim=hidden // 4)
    if arch != "qwen2":
        raise ValueError(f"tiny model: arch must be qwen2 or qwen3, got {arch!r}")
    return Qwen2Config(**common)


def randomize_norms(model) -> None:
    """Random weights for the norms a fresh model starts at 1 (LayerNorm biases at 0): StarCoder2's LayerNorms,
    Qwen3's per-head q/k norms (RMSNorms elsewhere stay as they are). A verifier that skipped or mis-scaled one
    would then show in the tests."""
    import torch

    layers = model.model.layers
    with torch.no_grad():
        for norm in [model.model.norm] + [n for l in layers for n in (l.input_layernorm, l.post_attention_layernorm)]:
            if isinstance(norm, torch.nn.LayerNorm):
                norm.weight.uniform_(0.5, 1.5)
                if norm.bias is not None:
                    norm.bias.uniform_(-0.5, 0.5)
        for layer in layers:
            for norm in (getattr(layer.self_attn, "q_norm", None), getattr(layer.self_attn, "k_norm", None)):
                if norm is not None:
                    norm.weight.uniform_(0.5, 1.5)


def tiny_causal_lm(arch: str = "qwen2", *, seed: int = 0, vocab_size: int = 64, layers: int = 2,
                   attention_bias: bool = False):
    """A random causal LM of an architecture the verifiers run (ops.SUPPORTED_ARCHS; no tokenizer) for the
    tests: hidden 64, 4 heads over 2 KV heads, weights drawn with a spread of 0.3 (at the default 0.02 a random
    model repeats one token forever, and exactness tests could not tell outputs apart); StarCoder2's LayerNorms
    and Qwen3's q/k norms random (`randomize_norms`); Mistral's and StarCoder2's sliding window off.
    attention_bias: Llama's q/k/v/o biases (Qwen2 always has q/k/v biases)."""
    import torch
    import transformers

    from rest_lsp.model.ops import SUPPORTED_ARCHS  # here: the tokenizer builders above need no torch

    if arch not in SUPPORTED_ARCHS:
        raise ValueError(f"tiny model: arch must be one of {', '.join(SUPPORTED_ARCHS)}, got {arch!r}")
    common = dict(vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, initializer_range=0.3,
                  tie_word_embeddings=False)
    extra = {"qwen2": {}, "qwen3": dict(head_dim=16), "llama": dict(attention_bias=attention_bias),
             "mistral": dict(sliding_window=None),
             "starcoder2": dict(sliding_window=None, bos_token_id=0, eos_token_id=0)}[arch]
    name = {"qwen2": "Qwen2", "qwen3": "Qwen3", "llama": "Llama", "mistral": "Mistral", "starcoder2": "Starcoder2"}[arch]
    config = getattr(transformers, f"{name}Config")(**common, **extra)
    torch.manual_seed(seed)
    model = getattr(transformers, f"{name}ForCausalLM")(config)
    if arch in ("qwen3", "starcoder2"):
        randomize_norms(model)
    return model.eval()


def make_tiny_model_dir(path: str | Path, *, seed: int = 0, vocab_size: int = 512, arch: str = "qwen2") -> Path:
    """Write a loadable model directory (config, safetensors weights, tokenizer) and return its path."""
    import torch
    from transformers import Qwen2ForCausalLM, Qwen3ForCausalLM

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer(vocab_size)
    torch.manual_seed(seed)
    cls = Qwen3ForCausalLM if arch == "qwen3" else Qwen2ForCausalLM
    model = cls(tiny_config(len(tokenizer), arch=arch)).eval()
    if arch == "qwen3":
        randomize_norms(model)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


# ---------------------------------------------------------------------------------------- CodeLlama
CODELLAMA_VOCAB = 32016
# the 16 pieces CodeLlama's SentencePiece model has past Llama 2's 32,000 (the infill tokens at 32007-32010)
CODELLAMA_EXTRA = ("▁<SU", "▁<SUF", "▁<PRE", "▁<M", "▁<MID", "▁<E", "▁<EOT", "▁<PRE>", "▁<SUF>", "▁<MID>",
                   "▁<EOT>") + tuple("▁" + "<EOT>" * n for n in range(2, 7))
CODELLAMA_SPECIAL = ("▁<PRE>", "▁<SUF>", "▁<MID>", "▁<EOT>")


def _codellama_vocab(pieces: int) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """(vocab, merges): Llama's layout (<unk> <s> </s>, the 256 byte-fallback tokens, the learned pieces),
    unused fillers up to 32,000, then CodeLlama's extra pieces."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>", fuse_unk=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=True)
    trainer = trainers.BpeTrainer(vocab_size=pieces, special_tokens=["<unk>", "<s>", "</s>"], show_progress=False)
    # line by line: newlines stay out of the pieces (they are byte-fallback <0x0A>, as in Llama's vocabulary)
    tok.train_from_iterator([line for text in _training_text() for line in text.split("\n")], trainer=trainer)
    trained = json.loads(tok.to_str())["model"]
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    vocab.update({f"<0x{b:02X}>": 3 + b for b in range(256)})
    for piece in trained["vocab"]:
        vocab.setdefault(piece, len(vocab))
    filler = 0
    while len(vocab) < CODELLAMA_VOCAB - len(CODELLAMA_EXTRA):
        vocab[f"<unused{filler}>"] = len(vocab)
        filler += 1
    for piece in CODELLAMA_EXTRA:
        vocab[piece] = len(vocab)
    return vocab, [tuple(m) for m in trained["merges"]]


def train_codellama_tokenizer(pieces: int = 800):
    """A CodeLlama-layout tokenizer (transformers' CodeLlamaTokenizer over a trained BPE)."""
    from transformers import CodeLlamaTokenizer

    vocab, merges = _codellama_vocab(pieces)
    return CodeLlamaTokenizer(vocab=vocab, merges=merges)


def _hub_style_tokenizer_json(path: Path) -> None:
    """Rewrite tokenizer.json as CodeLlama's hub checkpoint ships it (written by transformers 4): the
    SentencePiece normalizer (Prepend + Replace) instead of Metaspace, and no `<FILL_ME>` added token."""
    f = path / "tokenizer.json"
    data = json.loads(f.read_text())
    data["added_tokens"] = [t for t in data["added_tokens"] if t["content"] != "<FILL_ME>"]
    data["normalizer"] = {"type": "Sequence", "normalizers": [
        {"type": "Prepend", "prepend": "▁"}, {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]}
    data["pre_tokenizer"] = None
    f.write_text(json.dumps(data, ensure_ascii=False))


def make_tiny_codellama_dir(path: str | Path, *, seed: int = 0, layers: int = 2, hidden: int = 64) -> Path:
    """Write a loadable CodeLlama-layout model directory (Llama architecture, 32,016-row embedding)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = train_codellama_tokenizer()
    config = LlamaConfig(vocab_size=CODELLAMA_VOCAB, hidden_size=hidden, intermediate_size=2 * hidden,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=4096, rope_theta=1_000_000.0, bos_token_id=1, eos_token_id=2,
                         tie_word_embeddings=False)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).eval()
    # Random weights spread the argmax over every row; keep it on the learned pieces and the newline so that
    # greedy output is text the drafts can match (fillers, bytes, <s>, </s> and the infill markers are never
    # chosen: tests that need an end token give it a row of their own)
    vocab = tokenizer.get_vocab()
    text_ids = [i for t, i in vocab.items() if i < CODELLAMA_VOCAB and (
        t == "<0x0A>" or not (t.startswith("<") and t.endswith(">")) and i > 258)]
    keep = torch.zeros(CODELLAMA_VOCAB, dtype=torch.bool)
    keep[text_ids] = True
    with torch.no_grad():
        model.lm_head.weight[~keep] = 0.0
    model.generation_config.eos_token_id = 2
    model.generation_config.bos_token_id = 1
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    _hub_style_tokenizer_json(path)
    return path


_GGUF_LEAVES = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
                "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
                "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}


def write_llama_gguf(model_dir: str | Path, out: str | Path) -> Path:
    """Write a Llama-architecture model directory (e.g. `make_tiny_codellama_dir`'s) as an F32 GGUF file with
    llama.cpp's tensor names, q/k layout and tokenizer metadata, which transformers loads back to the same
    weights and vocabulary: a real `.gguf` for tests of that way of naming a model."""
    import gguf
    import numpy as np
    from safetensors.numpy import load_file

    model_dir, out = Path(model_dir), Path(out)
    cfg = json.loads((model_dir / "config.json").read_text())
    tok = json.loads((model_dir / "tokenizer.json").read_text())
    tokens = [""] * len(tok["model"]["vocab"])
    for piece, i in tok["model"]["vocab"].items():
        tokens[i] = piece
    special = {t["id"] for t in tok["added_tokens"] if t.get("special")}
    # llama.cpp token types: 1 normal, 2 unknown, 3 control, 6 byte
    types = [2 if i == 0 else 3 if i in special else 6 if t.startswith("<0x") and len(t) == 6 else 1
             for i, t in enumerate(tokens)]
    heads, kv_heads = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    w = gguf.GGUFWriter(str(out), "llama")
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_rope_freq_base(float((cfg.get("rope_parameters") or {}).get("rope_theta") or cfg.get("rope_theta", 1e4)))
    w.add_rope_dimension_count(cfg["hidden_size"] // heads)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([float(-i) for i in range(len(tokens))])
    w.add_token_types(types)
    w.add_token_merges([" ".join(m) if isinstance(m, list) else m for m in tok["model"]["merges"]])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(True)

    def rope_layout(x, n):  # llama.cpp interleaves q/k rotary halves; transformers undoes it on load
        return x.reshape(n, 2, x.shape[0] // n // 2, *x.shape[1:]).swapaxes(1, 2).reshape(x.shape)

    top = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
           "lm_head.weight": "output.weight"}
    for name, a in sorted(load_file(str(model_dir / "model.safetensors")).items()):
        a = a.astype(np.float32)
        if name not in top:
            parts = name.split(".")   # model.layers.N.<module path>.weight
            leaf = ".".join(parts[3:-1])
            a = rope_layout(a, heads) if leaf == "self_attn.q_proj" else \
                rope_layout(a, kv_heads) if leaf == "self_attn.k_proj" else a
        w.add_tensor(top.get(name) or f"blk.{parts[2]}.{_GGUF_LEAVES[leaf]}.weight", np.ascontiguousarray(a))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def random_q4k_blocks(rows: int, cols: int, rng, spread: float = 0.3):
    """Random Q4_K tensor bytes [rows, cols/256*144]: random 4-bit values and 6-bit scales and mins, the fp16
    super-block scales set so the weights spread about +-`spread` (a random model that does not repeat one token)."""
    import numpy as np

    raw = rng.integers(0, 256, (rows, cols // 256 * 144), dtype=np.uint8)
    blocks = raw.reshape(rows, -1, 144)
    d = np.array([2 * spread / (15 * 63)], np.float16).view(np.uint8)  # d*sc*q reaches 2*spread at most
    dmin = np.array([spread / 63], np.float16).view(np.uint8)         # dmin*m reaches spread at most
    blocks[..., 0:2], blocks[..., 2:4] = d, dmin
    return raw


# transformers' names of a decoder layer's projections -> llama.cpp's
_GGUF_LEAVES_QWEN = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
                     "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
                     "mlp.down_proj": "ffn_down"}


def random_q6k_blocks(rows: int, cols: int, rng, spread: float = 0.3):
    """Random Q6_K tensor bytes [rows, cols/256*210]: random 6-bit values and int8 scales, d set so the
    weights spread about +-`spread`."""
    import numpy as np

    raw = rng.integers(0, 256, (rows, cols // 256 * 210), dtype=np.uint8)
    raw.reshape(rows, -1, 210)[..., 208:210] = np.array([spread / (32 * 128)], np.float16).view(np.uint8)
    return raw


def make_tiny_q4k_model(path: str | Path, *, seed: int = 0, q8_layers: tuple[str, ...] = (),
                        q6_layers: tuple[str, ...] = ()) -> tuple[Path, Path]:
    """A Qwen2 model directory whose projections and LM head are what random Q4_K blocks decode to, and the
    GGUF holding those blocks under llama.cpp's names (what a Q4_K_M embedded model and its converted copy are
    to each other) -> (model directory, GGUF). Hidden 256, MLP 512 (Q4_K's 256-weight super-blocks), 2 layers.
    `q8_layers`: module names ("model.layers.1.self_attn.v_proj") stored as Q8_0 instead (a Q4_K_M's Q6_K
    layers where the AMX kernel is missing: the path that takes int8 for them); `q6_layers`: stored as random Q6_K
    blocks (a Q4_K_M's down projections and head). Decoding uses gguf's own dequantization, not rest-lsp's."""
    import gguf
    import numpy as np
    import torch
    from transformers import Qwen2ForCausalLM

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer(512)
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(tiny_config(len(tokenizer), hidden=256)).eval()
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path.with_suffix(".gguf")), "qwen2")
    with torch.no_grad():
        for name, mod in model.named_modules():
            if not isinstance(mod, torch.nn.Linear):
                continue
            n, k = mod.weight.shape
            tname = "output.weight" if name == "lm_head" else \
                f"blk.{name.split('.')[2]}.{_GGUF_LEAVES_QWEN['.'.join(name.split('.')[3:])]}.weight"
            if name in q8_layers:
                qtype = gguf.GGMLQuantizationType.Q8_0
                raw = gguf.quants.quantize(mod.weight.numpy(), qtype)
            elif name in q6_layers:
                qtype = gguf.GGMLQuantizationType.Q6_K
                raw = random_q6k_blocks(n, k, rng)
            else:
                qtype = gguf.GGMLQuantizationType.Q4_K
                raw = random_q4k_blocks(n, k, rng)
            mod.weight.copy_(torch.from_numpy(gguf.quants.dequantize(raw, qtype).reshape(n, k)))
            w.add_tensor(tname, raw, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path, path.with_suffix(".gguf")


def install_in_hub_cache(model_dir: str | Path, hub_cache: str | Path, repo_id: str) -> Path:
    """Lay a model directory out as the Hugging Face hub cache holds a downloaded repository
    (`models--org--name/refs/main` naming a snapshot), so that with HF_HUB_OFFLINE=1 and HF_HUB_CACHE set the
    hub id `repo_id` resolves without a network. Returns the snapshot directory."""
    import hashlib
    import shutil

    model_dir = Path(model_dir)
    commit = hashlib.sha1(repo_id.encode()).hexdigest()
    repo = Path(hub_cache) / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / commit
    if snapshot.exists():
        shutil.rmtree(snapshot)
    shutil.copytree(model_dir, snapshot)
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(commit)
    return snapshot


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dir")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--family", choices=("qwen", "qwen3", "codellama"), default="qwen")
    args = parser.parse_args(argv)
    if args.family == "codellama":
        print(make_tiny_codellama_dir(args.dir, seed=args.seed))
    else:
        print(make_tiny_model_dir(args.dir, seed=args.seed, arch="qwen3" if args.family == "qwen3" else "qwen2"))


if __name__ == "__main__":
    main()
