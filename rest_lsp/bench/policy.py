"""Draft policies for the benchmark and the replay: which sources, with which shares.

A policy spec is a comma-separated list of `source=share` (shares are normalised over the sources present,
as the engine does), or a preset:

    rest    the engine's own policy (`rest_lsp.engine.sources.default_sources`): context, history, the
            datastore (corpus with the repository attached), recycle, at the engine's DEFAULT_SHARES
    paper   REST as published: the corpus datastore only, n_max 16, the first k=5000 matches in suffix-array
            order, (with a 64-node budget) the 64 heaviest trie nodes by raw counts
    pld     prompt lookup as a tree: the context alone

Sources: context (the prompt + output so far), history (text generated earlier in this process),
corpus (the datastore: --datastore, with --repo attached when both are given), repository (--repo alone),
recycle (the model's own earlier top-k; in the replay it sees only the rows of the true path),
paper (the corpus, first-k in suffix-array order).
"""
from __future__ import annotations

from typing import Sequence


PRESETS = {
    "paper": "paper=1",
    "pld": "context=1",
}


def rest_preset() -> str:
    """The engine's default policy as a spec (its order too: the trie breaks ties by insertion order)."""
    from rest_lsp.engine.sources import DEFAULT_SHARES

    return ",".join(f"{k}={v}" for k, v in DEFAULT_SHARES.items() if v > 0)
SOURCE_NAMES = ("context", "history", "repository", "corpus", "recycle", "paper")


class PolicyError(ValueError):
    pass


def parse_policy(spec: str) -> list[tuple[str, float]]:
    """'context=0.5,corpus=0.2' or a preset name -> [(source, share), ...]."""
    spec = rest_preset() if spec == "rest" else PRESETS.get(spec, spec)
    out = []
    for part in filter(None, (p.strip() for p in spec.split(","))):
        name, _, share = part.partition("=")
        name = name.strip()
        if name not in SOURCE_NAMES:
            raise PolicyError(f"unknown draft source {name!r} in policy {spec!r}; one of {', '.join(SOURCE_NAMES)}")
        try:
            w = float(share) if share else 1.0
        except ValueError:
            raise PolicyError(f"bad share {share!r} for {name} in policy {spec!r}") from None
        if w <= 0:
            raise PolicyError(f"share of {name} must be positive in policy {spec!r}")
        out.append((name, w))
    return out


def build_sources(spec: str, *, corpus=None, repository=None, store=None, history=None, strict: bool = False):
    """[(DraftSource, share)] for a policy, shares normalised over the sources present (as `Engine` does);
    sources whose datastore is missing are skipped (or an error when `strict`; the paper source always
    needs its corpus, as the paper baseline must not silently become plain decoding). `store`: the
    datastore the `corpus` source searches (the corpus with the repository attached); default: corpus,
    else the repository. `history`: the HistorySource to draft from (one warmed with earlier output, or one
    whose tokens the caller saves afterwards); default: a new, empty one."""
    from rest_lsp.engine.sources import (CORPUS_MAX_LEN, ContextSource, DatastoreSource, HistorySource,
                                         RecyclingSource)

    sources = []
    for name, share in parse_policy(spec):
        if name == "context":
            sources.append((ContextSource(), share))
        elif name == "history":
            sources.append((history if history is not None else HistorySource(), share))
        elif name == "recycle":
            sources.append((RecyclingSource(), share))
        elif name == "paper":
            if corpus is None:
                raise PolicyError("draft source 'paper' needs a corpus datastore (--datastore DIR)")
            sources.append((PaperSource(corpus), share))
        elif name == "corpus":
            ds = next((d for d in (store, corpus, repository) if d is not None), None)
            if ds is None:
                if strict:
                    raise PolicyError("draft source 'corpus' needs --datastore DIR or --repo DIR")
                continue
            sources.append((DatastoreSource(ds, name="corpus", max_len=CORPUS_MAX_LEN), share))
        elif name == "repository":
            if repository is None:
                if strict:
                    raise PolicyError("draft source 'repository' needs --repo DIR")
                continue
            sources.append((DatastoreSource(repository, name="repository"), share))
    total = sum(w for _, w in sources) or 1.0  # as the engine does: the present sources' shares sum to 1
    return [(s, w / total) for s, w in sources]


class PaperSource:
    """REST as published: the longest context suffix (16 down to 2 tokens) found in the datastore, and the
    continuations of its first k occurrences in suffix-array order (a biased sample when there are more than
    k: the reference implementation's behaviour), weighted by raw counts."""

    name = "paper"

    def __init__(self, datastore, n_max: int = 16, n_min: int = 2, k: int = 5000):
        self.datastore = datastore
        self.n_max, self.n_min, self.k = n_max, n_min, k
        self.last_match_len: int | None = 0

    def propose(self, context: Sequence[int], max_len: int) -> list[tuple[tuple[int, ...], float]]:
        r = self.datastore.search(context, n_max=self.n_max, n_min=self.n_min, k=self.k, max_len=max_len,
                                  first_k=True)
        self.last_match_len = r.match_len
        return [(c.tokens, float(c.count)) for c in r.continuations]  # raw counts, as the reference weighs

    def observe(self, tokens: Sequence[int]) -> None:
        pass
