"""Tiny random causal LMs built in the test, with greedy outputs varied enough for exactness to discriminate."""
from __future__ import annotations

import functools
from typing import Iterable

import torch

from rest_lsp.engine.sources import DraftSource
from testmodels.tiny import tiny_causal_lm

VOCAB = 64


@functools.lru_cache(maxsize=None)
def tiny_model(kind: str = "qwen2", seed: int = 0, vocab: int = VOCAB, layers: int = 2):
    """testmodels.tiny's random model, shared between tests (never modified), with no end token."""
    model = tiny_causal_lm(kind, seed=seed, vocab_size=vocab, layers=layers)
    model.generation_config.eos_token_id = None
    return model


def plain_greedy(model, prompt: list[int], n: int, stop: Iterable[int] = ()) -> list[int]:
    """The reference: recompute the whole sequence every step, no cache, argmax of the last row; ends before
    a token in `stop`."""
    return list(_plain_greedy(model, tuple(prompt), n, frozenset(stop)))


@functools.lru_cache(maxsize=None)
@torch.no_grad()
def _plain_greedy(model, prompt: tuple[int, ...], n: int, stop: frozenset[int]) -> tuple[int, ...]:
    seq = list(prompt)
    for _ in range(n):
        t = int(model(torch.tensor([seq])).logits[0, -1].argmax())
        if t in stop:
            break
        seq.append(t)
    return tuple(seq[len(prompt):])


def random_prompt(seed: int, n: int, vocab: int = VOCAB) -> list[int]:
    g = torch.Generator().manual_seed(1000 + seed)
    return torch.randint(0, vocab, (n,), generator=g).tolist()


class ScriptedSource(DraftSource):
    """A draft source that proposes given continuations of the context (by absolute position)."""

    def __init__(self, full: list[int], name: str = "oracle", corrupt_at: int | None = None,
                 wrong_branch: float = 0.0, vocab: int = VOCAB):
        self.full, self.name, self.corrupt_at, self.vocab = full, name, corrupt_at, vocab
        self.wrong_branch = wrong_branch  # weight of a sibling branch that is wrong at every token
        self.observed: list[int] = []

    def propose(self, context, max_len):
        right = list(self.full[len(context): len(context) + max_len])
        cont = list(right)
        if self.corrupt_at is not None and len(cont) > self.corrupt_at:
            cont[self.corrupt_at] = (cont[self.corrupt_at] + 1) % self.vocab  # wrong from here on
        out = [(tuple(cont), 1.0)] if cont else []
        if self.wrong_branch and right:
            out.append((tuple((t + 3) % self.vocab for t in right), self.wrong_branch))
        return out

    def observe(self, tokens):
        self.observed.extend(tokens)


class Recording:
    """A verifier that records, per forward, its row count and whether it was sent as a prompt chunk."""

    def __init__(self, verifier):
        self.verifier, self.calls = verifier, []

    def forward(self, tokens, depths, tree_mask, *, rows=None, prompt=False):
        self.calls.append((len(tokens), prompt))
        return self.verifier.forward(tokens, depths, tree_mask, rows=rows, prompt=prompt)

    def __getattr__(self, name):
        return getattr(self.verifier, name)
