"""The drafter: from the context to the draft tree one step verifies, and what it learns from each step.

    trie  = the sources' continuations of the context, each source normalised and scaled by its share
    est   = each node's chance of acceptance (the acceptance model, learned online)
    order = the best nodes by est, cut where c(q) makes another node a loss (automatic budget)
    tree  = root (the pending token) + order, parents first

The engine drives it during decoding; `rest-lsp replay` drives the same object over recorded outputs without a
model, so the replay's steps are the engine's steps.
"""
from __future__ import annotations

from types import SimpleNamespace
from typing import Sequence

import numpy as np
import torch

from .acceptance import DEFAULT_LR, AcceptanceModel
from .cost import Calibration, CostModel, best_size
from .sources import DraftSource
from .tree import DraftTree, flatten, rank_nodes
from .trie import TokenTrie, match_strength, mix_rows
from .vocab import clip_rows


class Drafter:
    """Draft trees from weighted sources. `vocab_size`: drafted tokens at or above it are cut off (a
    datastore of another tokenizer must never feed the model ids it does not have)."""

    def __init__(self, sources: Sequence[tuple[DraftSource, float]] = (), *, max_draft_nodes: int = 64,
                 draft_len: int = 10, acceptance_lr: float = DEFAULT_LR, vocab_size: int | None = None):
        total = sum(share for _, share in sources if share > 0) or 1.0
        self.sources: list[tuple[DraftSource, float]] = [(s, share / total) for s, share in sources if share > 0]
        self.max_draft_nodes = max_draft_nodes
        self.draft_len = draft_len
        self.vocab_size = vocab_size
        self.calibration = Calibration()  # how far the estimates are off, across generations
        self.acceptance = AcceptanceModel(lr=acceptance_lr)  # which nodes get accepted, across generations
        self.topk = max((s.topk for s, _ in self.sources), default=0)
        self.last_trie: TokenTrie | None = None  # the full trie of the last draft (replay's coverage)

    def __bool__(self) -> bool:
        return bool(self.sources)

    # ---- one step ---------------------------------------------------------------------------------
    def draft(self, context: Sequence[int], budget: int | None, cost: CostModel | None = None) -> DraftTree:
        """The tree after `context` (its last token decided, not yet verified). budget: draft nodes, or None
        to choose per step from c(q) (`cost`)."""
        limit = self.max_draft_nodes if budget is None else budget
        if not self.sources or limit <= 0:
            return DraftTree.single(context[-1])
        trie = self.trie(context)
        est = self.acceptance.estimate(trie)  # [N] each node's chance of acceptance
        order = rank_nodes(trie, limit, est)
        if budget is None:
            if cost is None:
                raise ValueError("an automatic draft budget needs the verification cost c(q)")
            scale = self.calibration.scale()
            order = order[: best_size(np.minimum(1.0, est[order] * scale).tolist(), cost)]
        return flatten(trie, order, est)

    def trie(self, context: Sequence[int]) -> TokenTrie:
        """Every source's continuations of the context, mixed by share into one trie."""
        proposals = []
        for source, share in self.sources:
            rows, weights = source.propose_rows(context, self.draft_len)  # [C, L] padded with -1, [C]
            if self.vocab_size is not None:
                rows, weights = clip_rows(rows, weights, self.vocab_size)
            proposals.append((source.name, share, match_strength(source.last_match_len), rows, weights))
        self.last_trie = mix_rows(context[-1], proposals)
        return self.last_trie

    def covered(self, truth: Sequence[int]) -> int:
        """How many tokens of the true continuation the last draft's full trie holds: what the step would
        accept had the ranking picked the right path (the sources' ceiling, not the policy's)."""
        trie, node, n = self.last_trie, 0, 0
        if trie is None:
            return 0
        while n < len(truth) and (node := trie.child(node, truth[n])) >= 0:
            n += 1
        return n

    # ---- learning from the output -------------------------------------------------------------------
    def begin(self, context: Sequence[int]) -> None:
        """A generation starts (or resumes after another one used the drafter) after `context`."""
        for source, _ in self.sources:
            source.begin(context)
        self.acceptance.begin()

    def record(self, tree: DraftTree, path: Sequence[int]) -> None:
        """A step's outcome: the calibration compares its estimate with the accepted length."""
        self.calibration.update(sum(tree.probs[1:]), len(path) - 1)

    def observe(self, tokens: Sequence[int]) -> None:
        """Tokens appended to the output."""
        for source, _ in self.sources:
            source.observe(tokens)
        self.acceptance.observe(tokens)

    def observe_forward(self, tree: DraftTree, logits: torch.Tensor) -> None:
        """The verified rows' logits [q, V]: their top-k feed the sources that recycle the model's guesses."""
        if self.topk:
            topk = logits.topk(self.topk, dim=-1).indices.tolist()  # [q, k]
            for source, _ in self.sources:
                if source.topk:
                    source.observe_forward(tree.tokens, topk, tree.parents)

    def finish(self) -> None:
        """The generation ended (or was set aside): learn from what its output decided."""
        self.acceptance.finish()


def compile_kernels() -> None:
    """The drafting's compiled loops (rest_lsp/jit.py), compiled now (the first time on a machine: seconds) or
    loaded from the disk cache (milliseconds), so that no completion waits for them: drafts with the context,
    history and recycling sources and a merge of two datastore match levels (the datastore's own loops are
    compiled when the first store opens: indexer.store.compile_kernels)."""
    from .sources import ContextSource, HistorySource, RecyclingSource, merge_levels

    text = np.arange(60, 80).tolist() * 4
    context, history, recycle = ContextSource(), HistorySource(), RecyclingSource()
    context.set_buffer("open", text)
    history.extend(text)
    drafter = Drafter([(context, 0.4), (history, 0.4), (recycle, 0.2)], vocab_size=100)  # (its check compiled)
    prompt = text[:30]
    drafter.begin(prompt)
    tree = drafter.draft(prompt, 8)
    drafter.observe_forward(tree, torch.zeros(len(tree), 100))
    drafter.observe(text[30:33])
    drafter.draft(prompt + text[30:33], 8)
    drafter.finish()
    rows = np.array([[1, 2, -1], [3, 4, 5]], dtype=np.int64)
    level = SimpleNamespace(match_len=2, rows=rows, weights=np.array([2.0, 1.0]))
    merge_levels([(4, level), (2, level)], 32, 3)
