"""A token trie of weighted continuations, mixed from several draft sources by a share per source.

Each source's weights are normalised within the source and scaled by its share (times a strength that
grows with the source's suffix-match length), so a source that returns thousands of raw corpus counts
cannot drown one that returns a single long context match. A node's mass is then the estimated chance
that the model's greedy continuation passes through it: the product of the conditional fractions along
its path times the mass at the root.
"""
from __future__ import annotations

from typing import Iterable, Sequence


class TokenTrie:
    """Continuations after a fixed root token; node 0 is the root. Nodes live in parallel lists (a few
    thousand are added per step, so no per-node objects)."""

    def __init__(self, root_token: int, names: Sequence[str] = (), strengths: Sequence[float] = ()):
        self.names = list(names)  # the sources, in the order of `smass`'s columns
        self.strengths = list(strengths) or [1.0] * len(self.names)
        # the mass from each source, flat: node n's share from source s at n * len(names) + s
        self.smass: list[float] = [0.0] * len(self.names)
        self.tokens: list[int] = [root_token]
        self.parents: list[int] = [-1]
        self.depths: list[int] = [0]  # the root (the token already decided) is depth 0
        self.mass: list[float] = [0.0]
        self.children: list[dict[int, int]] = [{}]  # token -> node index
        self.source: list[str] = [""]  # the source of the heaviest continuation through the node
        self._best: list[float] = [0.0]

    def add(self, tokens: Sequence[int], weight: float, source: str = "") -> None:
        """Add one continuation: every node along its path gains `weight`."""
        # locals: this loop runs for every token of every continuation, about a thousand per step
        n_src = len(self.names)
        si = self.names.index(source) if source in self.names else -1
        children, mass, smass, best = self.children, self.mass, self.smass, self._best
        zeros = [0.0] * n_src
        node = 0
        mass[0] += weight
        if si >= 0:
            smass[si] += weight
        for tok in tokens:
            child = children[node].get(tok)
            if child is None:
                child = len(mass)
                children[node][tok] = child
                self.tokens.append(tok)
                self.parents.append(node)
                self.depths.append(self.depths[node] + 1)
                mass.append(0.0)
                children.append({})
                self.source.append(source)
                smass.extend(zeros)
                best.append(weight)
            elif weight > best[child]:
                best[child], self.source[child] = weight, source
            node = child
            mass[node] += weight
            if si >= 0:
                smass[node * n_src + si] += weight

    def __len__(self) -> int:
        return len(self.tokens)


def match_strength(match_len: int | None) -> float:
    """How much to trust a source given the length of the context suffix it matched.

    1 - 2^-n: a 1-token match counts half, 4 tokens 94%. Sources that report no match length count fully.
    """
    if match_len is None:
        return 1.0
    return 0.0 if match_len <= 0 else 1.0 - 0.5**match_len


def mix(
    root_token: int,
    proposals: Iterable[tuple[str, float, float, Sequence[tuple[Sequence[int], float]]]],
) -> TokenTrie:
    """One trie from (source name, share, strength, [(tokens, weight), ...]) per source.

    Shares should sum to at most 1 over the configured sources: a source with nothing to say leaves
    its share unclaimed, which keeps the root mass (and every estimate below it) honest.
    """
    proposals = list(proposals)
    trie = TokenTrie(root_token, [p[0] for p in proposals], [p[2] for p in proposals])
    for name, share, strength, conts in proposals:
        conts = [(t, float(w)) for t, w in conts if len(t) > 0 and w > 0]
        total = sum(w for _, w in conts)
        if total <= 0 or share <= 0 or strength <= 0:
            continue
        scale = share * strength / total
        for tokens, w in conts:
            trie.add(tokens, w * scale, name)
    return trie
