"""Helpers shared by the indexer tests (a module name of its own: conftest names collide across areas)."""
from __future__ import annotations

from collections import Counter
from pathlib import Path


def naive_search(docs, ctx, *, n_max=16, n_min=2, max_len=10, weights=None):
    """The reference: scan every document for the longest context suffix; Counter of continuations
    (non-empty, cut at the document's end) and a dict of weights."""
    ctx = list(ctx)[-n_max:]
    weights = weights or [1.0] * len(docs)
    for n in range(len(ctx), n_min - 1, -1):
        p = ctx[-n:]
        total = 0
        counts, wsum = Counter(), Counter()
        for d, w in zip(docs, weights):
            for i in range(len(d) - n + 1):
                if d[i:i + n] == p:
                    total += 1
                    c = tuple(d[i + n:i + n + max_len])
                    if c:
                        counts[c] += 1
                        wsum[c] += w
        if total:
            return n, total, counts, wsum
    return 0, 0, Counter(), Counter()


def write_files(root: Path, files: dict) -> None:
    for rel, content in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            p.write_bytes(content)
        else:
            p.write_text(content)


def source_lines() -> list[str]:
    import inspect
    import textwrap

    return inspect.getsource(textwrap).splitlines()


def random_file(rng, lines: list[str], n: int = 30) -> str:
    start = rng.randrange(0, max(1, len(lines) - n))
    body = lines[start:start + n]
    return "\n".join(body) + f"\nMARKER_{rng.randrange(10**6)} = {rng.randrange(100)}\n"


def results(ds, contexts, k=10**6):
    out = []
    for c in contexts:
        r = ds.search(c, k=k)
        out.append((r.match_len, r.count, sorted((x.tokens, x.count) for x in r.continuations)))
    return out


def contexts_from(tok, texts, rng, n=40, width=8) -> list[list[int]]:
    ctxs = []
    for t in texts:
        ids = tok.encode(t, add_special_tokens=False).ids
        for _ in range(max(1, n // max(1, len(texts)))):
            if len(ids) > width:
                i = rng.randrange(0, len(ids) - width)
                ctxs.append(ids[i:i + width])
    return ctxs
