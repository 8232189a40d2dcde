"""Fixtures for the indexer tests: small tokenizers built with `tokenizers` alone (no torch, no download)."""
from __future__ import annotations

import inspect

import pytest


@pytest.fixture(scope="session")
def bpe_tok_path(tmp_path_factory) -> str:
    """A byte-level BPE (vocab 400) trained on a few standard-library sources: a uint16 store."""
    import argparse
    import json.decoder
    import textwrap

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator([inspect.getsource(m) for m in (argparse, json.decoder, textwrap)], trainer=trainer)
    p = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok.save(str(p))
    return str(p)


@pytest.fixture(scope="session")
def wide_tok_path(tmp_path_factory) -> str:
    """A word-level tokenizer with 70,000 words: ids above 65,535 need a uint32 store."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {f"w{i}": i for i in range(70000)}
    vocab["[UNK]"] = 70000
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece()
    d = tmp_path_factory.mktemp("wide")
    tok.save(str(d / "tokenizer.json"))
    return str(d)
