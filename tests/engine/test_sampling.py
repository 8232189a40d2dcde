"""Speculative sampling over draft trees keeps the model's distribution exactly.

Empirical distributions of short outputs are compared with exact probabilities computed by enumerating
every output of the horizon. A deliberately biased acceptance rule (each child accepted with p(x), no
residual) must fail the same check, so the check has power.
"""
from __future__ import annotations

import functools
import itertools
import math

import torch

from rest_lsp.engine import Engine, GenerationConfig
from rest_lsp.engine.sources import DraftSource
from rest_lsp.engine.tree import accept_sampled, sampling_probs

from ._models import plain_greedy, random_prompt, tiny_model


class TableVerifier:
    """A Verifier whose 'model' is a fixed random table: logits are a function of the whole prefix."""

    def __init__(self, vocab: int, scale: float = 1.5):
        self.vocab, self.scale = vocab, scale
        self.cache: list[int] = []
        self.past_len = 0
        self._last_q = 0
        self._table: dict[tuple[int, ...], torch.Tensor] = {}

    def logits(self, prefix: tuple[int, ...]) -> torch.Tensor:
        if prefix not in self._table:
            g = torch.Generator().manual_seed(hash(prefix) % (2**31))
            self._table[prefix] = torch.randn(self.vocab, generator=g) * self.scale
        return self._table[prefix]

    def forward(self, tokens, depths, tree_mask, *, rows=None, prompt=False):
        toks, mask = tokens.tolist(), tree_mask.tolist()
        out = []
        for i in range(len(toks)):
            ancestors = [t for t, seen in zip(toks, mask[i]) if seen]
            out.append(self.logits(tuple(self.cache + ancestors)))
        self.cache += toks
        self.past_len = len(self.cache)
        self._last_q = len(toks)
        logits = torch.stack(out)
        self._last = logits if rows is None else logits[list(rows)]
        return self._last

    def row_scorer(self, row):
        logits = self._last[row]
        return lambda ids: logits[ids]

    def keep(self, indices):
        base = len(self.cache) - self._last_q
        self.cache = self.cache[:base] + [self.cache[base + i] for i in indices]
        self.past_len = len(self.cache)

    def truncate(self, n):
        self.cache = self.cache[:n]
        self.past_len = len(self.cache)


class TopChoices(DraftSource):
    """Drafts the model's likely tokens and an unlikely branch, so acceptance and rejection both happen."""

    name = "top"

    def __init__(self, next_logits):
        self.next_logits = next_logits

    def propose(self, context, max_len):
        order = self.next_logits(tuple(context)).argsort(descending=True).tolist()
        out = []
        for rank, first in enumerate(order[:2] + order[-1:]):
            path = [first]
            for _ in range(2):
                path.append(int(self.next_logits(tuple(context) + tuple(path)).argmax()))
            out.append((tuple(path[:max_len]), 1.0 / (rank + 1)))
        return out



def exact_distribution(next_logits, prompt, vocab, horizon, temperature, top_p):
    dist = {}
    for seq in itertools.product(range(vocab), repeat=horizon):
        p = 1.0
        for t in range(horizon):
            p *= float(sampling_probs(next_logits(tuple(prompt) + seq[:t]), temperature, top_p)[seq[t]])
        dist[seq] = p
    return dist


def chi_square_excess(counts: dict, dist: dict, n: int) -> float:
    """Pearson chi-square over cells (rare cells pooled) in standard deviations above its mean (df)."""
    stat, df, pooled_obs, pooled_exp = 0.0, -1, 0, 0.0
    for seq, p in dist.items():
        if n * p < 5:
            pooled_obs += counts.get(seq, 0)
            pooled_exp += n * p
            continue
        stat += (counts.get(seq, 0) - n * p) ** 2 / (n * p)
        df += 1
    if pooled_exp > 0:
        stat += (pooled_obs - pooled_exp) ** 2 / max(pooled_exp, 1e-9)
        df += 1
    return (stat - df) / math.sqrt(2 * df)


def _sample_counts(engine, prompt, n, horizon, temperature, top_p):
    counts: dict[tuple[int, ...], int] = {}
    accepted = 0  # draft tokens accepted over all runs
    for seed in range(n):
        res = engine.generate(prompt, GenerationConfig(max_new_tokens=horizon, temperature=temperature,
                                                       top_p=top_p, seed=seed, draft_budget=6))
        key = tuple(res.tokens)
        counts[key] = counts.get(key, 0) + 1
        accepted += sum(res.accepted_sources.values())
    return counts, accepted


def _biased_accept(tree, probs_of, generator=None):
    """A plausible bug: each child accepted with p(x) independently, and a fresh p sample if none was."""
    kids = tree.children()
    path = [0]
    while True:
        p = probs_of(path[-1])
        chosen = next((c for tok, c in kids[path[-1]].items()
                       if float(torch.rand((), generator=generator)) < float(p[tok])), None)
        if chosen is None:
            return path, int(torch.multinomial(p, 1, generator=generator))
        path.append(chosen)


def test_tree_sampling_matches_exact_distribution_and_detects_bias(monkeypatch):
    vocab, horizon, temperature, top_p, n = 5, 3, 1.0, 0.9, 2500
    table = TableVerifier(vocab)
    prompt = [1, 2, 3]
    dist = exact_distribution(table.logits, prompt, vocab, horizon, temperature, top_p)
    engine = Engine(tiny_model(), [(TopChoices(table.logits), 1.0)], verifier=table, eos_token_ids=[])
    counts, accepted = _sample_counts(engine, prompt, n, horizon, temperature, top_p)
    assert accepted > n / 4  # drafts were accepted, so the tree path was exercised
    assert chi_square_excess(counts, dist, n) < 6.0
    # the same check rejects a biased acceptance rule
    monkeypatch.setattr("rest_lsp.engine.generate.accept_sampled", _biased_accept)
    biased, _ = _sample_counts(engine, prompt, n, horizon, temperature, top_p)
    assert chi_square_excess(biased, dist, n) > 6.0


def test_sampling_on_a_tiny_model_matches_enumeration():
    model = tiny_model("qwen2", 7, vocab=8)
    prompt = random_prompt(7, 6, vocab=8)
    vocab, horizon, temperature, top_p, n = 8, 2, 0.8, 1.0, 800

    @functools.lru_cache(maxsize=None)
    @torch.no_grad()
    def cached(prefix):
        return model(torch.tensor([list(prefix)])).logits[0, -1]

    dist = exact_distribution(cached, prompt, vocab, horizon, temperature, top_p)
    engine = Engine(model, [(TopChoices(cached), 1.0)], eos_token_ids=[])
    counts, accepted = _sample_counts(engine, prompt, n, horizon, temperature, top_p)
    assert accepted > n / 4
    assert chi_square_excess(counts, dist, n) < 6.0
    # temperature 0 on the same engine is still exact greedy
    res = engine.generate(prompt, GenerationConfig(max_new_tokens=12, draft_budget=6))
    assert res.tokens == plain_greedy(model, prompt, 12)


def test_accept_sampled_follows_a_certain_draft():
    from rest_lsp.engine.tree import DraftTree

    tree = DraftTree([0, 3, 4], [-1, 0, 1], [0, 1, 2], [1.0] * 3, [""] * 3)
    one_hot = {0: 3, 1: 4, 2: 2}
    probs = lambda i: torch.nn.functional.one_hot(torch.tensor(one_hot[i]), 5).double()  # noqa: E731
    assert accept_sampled(tree, probs) == ([0, 1, 2], 2)
