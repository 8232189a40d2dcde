"""The draft policy: which sources draft, at which share. One table and one factory, so that the daemon runs
exactly what `rest-lsp bench --methods rest` and `rest-lsp replay --policy rest` measure.

A policy is a preset name or a comma-separated `source=share` list; shares are normalised over the sources
present, once, by the drafter (rest_lsp/engine/drafter.py):

    rest    the prompt and open buffers (context), the model's earlier output (history), the user's workspace
            datastores (repository), a corpus datastore (corpus), the model's own recent top-k (recycle), the
            repository snippets a prompt's cross-file block holds (snippets; rest_lsp/service/crossfile.py)
    paper   REST as published: the corpus only, first k=5000 matches in suffix-array order, raw counts
    pld     prompt lookup decoding (PLD): one chain after the latest earlier match of the context's last 3, 2
            or 1 tokens (`lookup`); `rest-lsp bench --methods pld` verifies it whole, PLD_TOKENS tokens
    context prompt lookup as a tree (a source name is a policy too): every match in the context, up to 16

The long accepted runs come from the current file and the model's own output (docs/engine.md), so the context
holds half the tree; the repository outweighs a generic corpus because its idioms are the user's own.
"""
from __future__ import annotations

from typing import Sequence

from .sources import (CORPUS_MAX_LEN, ContextSource, DatastoreSource, DraftSource, HistorySource, PaperSource,
                      PromptLookupSource, RecyclingSource, SnippetSource)

SHARES = {"context": 0.5, "history": 0.2, "repository": 0.3, "corpus": 0.2, "recycle": 0.05, "snippets": 0.5}
PRESETS = {"rest": SHARES, "paper": {"paper": 1.0}, "pld": {"lookup": 1.0}}
PLD_TOKENS = 10  # bench's pld chain and budget, pld-hf's prompt_lookup_num_tokens: the value transformers' docs use
SOURCE_NAMES = ("context", "history", "repository", "corpus", "recycle", "paper", "snippets", "lookup")


class PolicyError(ValueError):
    """A policy that names an unknown source, a bad share, or a source whose datastore is missing."""


def parse_policy(spec: str) -> list[tuple[str, float]]:
    """'context=0.5,corpus=0.2' or a preset name -> [(source, share), ...] in the spec's order."""
    if spec in PRESETS:
        return list(PRESETS[spec].items())
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
        if not w > 0:
            raise PolicyError(f"share of {name} must be positive in policy {spec!r}")
        out.append((name, w))
    return out


def make_sources(spec: str = "rest", *, context: ContextSource | None = None, history: HistorySource | None = None,
                 repository=None, corpus=None, snippets: SnippetSource | None = None,
                 strict: bool = False) -> list[tuple[DraftSource, float]]:
    """[(source, share)] for a policy. `context`/`history`: the instances to draft from (the daemon feeds open
    buffers into its ContextSource and keeps its HistorySource on disk); new ones otherwise. `repository` and
    `corpus`: datastores (indexer.store.Datastore, or the daemon's DatastoreSet of workspace folders); a source
    whose datastore is missing is left out, or is an error when `strict` (the paper baseline always needs its
    corpus: it must not silently become plain decoding)."""
    sources: list[tuple[DraftSource, float]] = []
    for name, share in parse_policy(spec):
        if name == "context":
            sources.append((context if context is not None else ContextSource(), share))
        elif name == "history":
            sources.append((history if history is not None else HistorySource(), share))
        elif name == "recycle":
            sources.append((RecyclingSource(), share))
        elif name == "lookup":
            sources.append((PromptLookupSource(), share))
        elif name == "snippets":
            if snippets is not None:
                sources.append((snippets, share))
        elif name == "paper":
            if corpus is None:
                raise PolicyError("draft source 'paper' needs a corpus datastore (--datastore DIR)")
            sources.append((PaperSource(corpus), share))
        elif name == "corpus":
            if corpus is not None:
                sources.append((DatastoreSource(corpus, name="corpus", max_len=CORPUS_MAX_LEN), share))
            elif strict:
                raise PolicyError("draft source 'corpus' needs a corpus datastore (--datastore DIR)")
        elif name == "repository":
            if repository is not None:
                sources.append((DatastoreSource(repository, name="repository"), share))
            elif strict:
                raise PolicyError("draft source 'repository' needs a repository datastore (--repo DIR)")
    return sources


def shares(sources: Sequence[tuple[DraftSource, float]]) -> dict[str, float]:
    """{source name: normalised share}, as the drafter mixes them (for reports)."""
    total = sum(w for _, w in sources) or 1.0
    return {s.name: round(w / total, 4) for s, w in sources}
