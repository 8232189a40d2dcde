"""A tiny random causal LM with a real trained tokenizer, for tests and offline demos.

Tests everywhere (engine, daemon, editors) need a model directory that loads like any Hugging Face
checkpoint but builds in a second without a download. The tokenizer is a byte-level BPE trained on a
few standard-library sources and carries Qwen2.5-Coder's FIM special tokens, so prompt-format code
paths run unchanged. The weights are random: outputs are deterministic but meaningless.

    python -m rest_lsp.model.tiny DIR [--seed N]
"""
from __future__ import annotations

import argparse
import inspect
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


def tiny_config(vocab_size: int, *, layers: int = 2, hidden: int = 64):
    from transformers import Qwen2Config

    return Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
    )


def make_tiny_model_dir(path: str | Path, *, seed: int = 0, vocab_size: int = 512) -> Path:
    """Write a loadable model directory (config, safetensors weights, tokenizer) and return its path."""
    import torch
    from transformers import Qwen2ForCausalLM

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer(vocab_size)
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(tiny_config(len(tokenizer))).eval()
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dir")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    print(make_tiny_model_dir(args.dir, seed=args.seed))


if __name__ == "__main__":
    main()
