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

from restbase.jit import njit

from .acceptance import DEFAULT_LR, EPS, AcceptanceModel, estimate_arrays
from .cost import Calibration, CostModel, best_size_arrays
from .sources import DraftSource
from .tree import DraftTree, best_node_arrays, draft_tree, flatten_arrays
from .trie import PAD, TokenTrie, match_strength, mixed_trie_arrays
from .vocab import inside_end

MAX_SOURCES = 8  # the compiled step takes the sources' rows as one 8-tuple: one compiled type for every policy
_EMPTY_ROWS = (np.zeros((0, 0), dtype=np.int64),) * MAX_SOURCES
_EMPTY_WEIGHTS = (np.zeros(0, dtype=np.float64),) * MAX_SOURCES
_NO_COSTS = np.zeros(0, dtype=np.float64)  # a fixed budget: no c(q) cut


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
        if len(self.sources) > MAX_SOURCES:
            raise ValueError(f"at most {MAX_SOURCES} draft sources (got {len(self.sources)})")
        self.names = [s.name for s, _ in self.sources]
        self._shares = np.array([share for _, share in self.sources], dtype=np.float64)
        self.topk = max((s.topk for s, _ in self.sources), default=0)
        self.last_trie: TokenTrie | None = None  # the full trie of the last draft (replay's coverage)

    def __bool__(self) -> bool:
        return bool(self.sources)

    # ---- one step ---------------------------------------------------------------------------------
    def draft(self, context: Sequence[int], budget: int | None, cost: CostModel | None = None, *,
              rows_before: int = 0, max_nodes: int | None = None) -> DraftTree:
        """The tree after `context` (its last token decided, not yet verified; a list, or the engine's int64
        array). budget: draft nodes, or None to choose per step from c(q) (`cost`); never more than
        max_draft_nodes (the engine reserves cache room for that many, and int8w's products are exact up to
        it: rest_lsp/model/int8weight.py), nor than max_nodes. rows_before: rows the same forward computes
        before the tree (the prompt's last tokens: the engine's first step), so a tree of q rows costs
        c(rows_before + q)."""
        limit = self.max_draft_nodes if budget is None else min(budget, self.max_draft_nodes)
        if max_nodes is not None:
            limit = min(limit, max_nodes)
        if not self.sources or limit <= 0:
            return DraftTree.single(int(context[-1]))
        if budget is None and cost is None:
            raise ValueError("an automatic draft budget needs the verification cost c(q)")
        costs = cost.upto(rows_before + limit + 1)[rows_before:] if budget is None else _NO_COSTS
        out = self._step(context, limit, costs, self.calibration.scale())
        self.acceptance.remember(self.last_trie, out[8])
        return draft_tree(out[9:], self.names)

    def trie(self, context: Sequence[int]) -> TokenTrie:
        """Every source's continuations of the context, mixed by share into one trie (what `draft` ranks)."""
        self._step(context, 0, _NO_COSTS, 1.0)
        return self.last_trie

    def _step(self, context: Sequence[int], limit: int, costs: np.ndarray, calib: float) -> tuple:
        """The sources' rows, then `draft_arrays`; keeps the trie (`last_trie`)."""
        rows, weights, strengths = self._propose(context)
        out = draft_arrays(rows, weights, self._shares * strengths, int(context[-1]), strengths,
                           -1 if self.vocab_size is None else self.vocab_size,
                           self.acceptance.weights_for(self.names), limit, costs, calib)
        self.last_trie = TokenTrie.from_arrays(self.names, strengths.tolist(), out[:8])
        return out

    def _propose(self, context: Sequence[int]) -> tuple[tuple, tuple, np.ndarray]:
        """Every source's rows and weights, as MAX_SOURCES-tuples (padded with empty ones: the compiled step
        takes one type however many sources there are), and each source's strength [S]."""
        rows, weights = list(_EMPTY_ROWS), list(_EMPTY_WEIGHTS)
        strengths = []
        for i, (source, _) in enumerate(self.sources):
            r, w = source.propose_rows(context, self.draft_len)  # [C, L] padded with -1, [C]
            rows[i] = r if r.dtype == np.int64 and r.flags.c_contiguous else np.ascontiguousarray(r, np.int64)
            weights[i] = w if w.dtype == np.float64 and w.flags.c_contiguous else np.ascontiguousarray(w, np.float64)
            strengths.append(match_strength(source.last_match_len))
        return tuple(rows), tuple(weights), np.array(strengths)

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
    """The drafting's compiled loops (restbase/jit.py), compiled now (the first time on a machine: seconds) or
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


@njit
def draft_arrays(rows, weights, scale, root_token, strength, vocab_size, acc_weights, limit, costs, calib):
    """A drafting step after the sources, in one compiled call (right after a CPU forward pass each Python or
    numpy call runs from cold caches, 0.05-0.15 ms each: docs/engine.md):

        rows, weights   MAX_SOURCES-tuples: each source's [C_s, L_s] continuations (-1 after each end), [C_s]
        scale [S]       each source's share times its strength (0: left out); strength [S]
        -> the rows cut before the first id outside [0, vocab_size) (vocab_size < 0: none is),
           the trie (TokenTrie's 8 arrays), its features x [N, F] and estimates [N] (acc_weights [F]),
           the `limit` best nodes, cut where c(q) makes another node a loss (costs[k] = c(k + 1); empty: no
           cut; calib: the calibration's factor on the estimates), flattened (the tree's 5 arrays [q]).

    Returns the trie's 8 arrays, x, then the tree's 5 (`draft_tree` names them)."""
    n_src = len(scale)
    total, width = 0, 0
    for s in range(n_src):
        if scale[s] > 0 and len(weights[s]):
            total += rows[s].shape[0]
            width = max(width, rows[s].shape[1])
    stacked = np.full((total, width), PAD, np.int64)
    w = np.empty(total)
    src = np.empty(total, np.int64)
    at = 0
    for s in range(n_src):
        if not (scale[s] > 0 and len(weights[s])):
            continue
        r, rw = rows[s], weights[s]
        for i in range(r.shape[0]):
            end = inside_end(r, i, vocab_size)
            stacked[at + i, :end] = r[i, :end]
            w[at + i], src[at + i] = rw[i], s
        at += r.shape[0]
    trie = mixed_trie_arrays(stacked, w, src, scale, root_token)
    parents = trie[1]
    x, est = estimate_arrays(parents, trie[2], trie[3], trie[4], strength, trie[6][0], EPS, acc_weights)
    if len(parents) <= 1 or limit <= 0:
        order = np.zeros(0, np.int64)
    else:
        order = best_node_arrays(parents, est, limit)
    if len(costs):
        probs = np.empty(len(order))
        for k in range(len(order)):
            probs[k] = min(1.0, est[order[k]] * calib)
        order = order[:best_size_arrays(probs, costs)]
    tree = flatten_arrays(trie[0], parents, trie[2], trie[5], order, est)
    return (trie[0], trie[1], trie[2], trie[3], trie[4], trie[5], trie[6], trie[7], x,
            tree[0], tree[1], tree[2], tree[3], tree[4])
