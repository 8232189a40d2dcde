"""The REST decoding loop: draft, verify the whole tree in one forward, keep the model's own path.

    run = engine.start(prompt, config, key=uri)
    while not run.done:
        engine.advance(run)       one model forward:
            prefill               a chunk of the prompt the KV cache lacks (a pooled state of an earlier
                                  prompt with the longest shared prefix is brought back first); the last
                                  chunk's logits give the first new token (the pending root)
            first step            a prompt that lacks only a few tokens (a key typed) has them computed in
                                  the forward that verifies the first draft tree, rooted at its last token:
                                  the first suggestion costs one forward, not a prefill and then a step
            known row             a prompt the cache holds whole, whose last row an earlier forward computed
                                  (a key typed against the suggestion: the prompt is the one before, with the
                                  output up to the key) takes its first token from that row, with no forward
            decode step           draft = trie of the sources' continuations of context + root
                                  tree  = root + the nodes worth their verification cost
                                  logits = verifier.forward(tree)     one forward, tree attention mask
                                  path  = longest path equal to the model's argmax (greedy), or accepted
                                          by rejection (sampling); emit path[1:] + the model's next token
                                  keep only root + path in the KV cache

Greedy output is token-for-token what plain greedy decoding gives; with no draft a step is a plain step.
Runs advance one forward at a time, so a caller can interleave them (a completion pre-empts a cache warm-up at
the next chunk) and stop one at any step; what a stopped run computed stays in the cache for the next prompt.
`generate` is the plain loop over one run.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
import torch

from .acceptance import DEFAULT_LR
from .cost import CostModel, cost_key, load_or_measure
from .drafter import Drafter, compile_kernels
from .kvpool import KVPool, common_prefix
from .sources import DraftSource
from .stops import StopChecker
from .tree import DraftTree, accept_greedy, accept_sampled, sampling_probs
from .verifier import HFVerifier, Interrupted, Verifier, chain_mask
from .vocab import VocabIndex

log = logging.getLogger(__name__)

# Prompt tokens per prefill forward: a run can be stopped or pre-empted between chunks, so a long prompt
# (seconds on a CPU) never holds the model for long; larger chunks save little once a forward is this wide.
PREFILL_CHUNK = 256
# Before the cache is cut back for another document by more than SAVE_MIN_TOKENS, or for anything by more than
# SAVE_BIG_TOKENS (another place in the same document), its state goes to the pool; smaller cuts are the
# typing at the cursor, whose old tail is worth nothing.
SAVE_MIN_TOKENS = 32
SAVE_BIG_TOKENS = 256
# A prompt lacking at most this many tokens has them computed in its first step's forward (`_first_step`), on the
# exact path as tree rows, with plain decoding (a one-node tree) and REST alike; a longer rest is a prefill on
# the prompt path (not row-invariant, cheaper per token), then steps. A key typed leaves a few tokens (16 a key
# in bench_typing's human rhythm, a median of fewer), where a forward of 32 rows costs little more than one.
FIRST_STEP_TOKENS = 32
# The rows kept of each run's first KEPT_ROWS output positions (an argmax and an exact scorer each: 0.6 MB for a
# 152k vocabulary), 2 * KEPT_ROWS in all: a key typed against a suggestion within its first KEPT_ROWS tokens has
# its first token picked from the row the suggestion's run computed there, the forced text's pick included. A
# run keeps decoding past what was shown (to the block's end, then a prediction as if it were accepted), so
# "the last positions" would hold rows nobody types against.
KEPT_ROWS = 32


@dataclass
class GenerationConfig:
    max_new_tokens: int = 128  # 0: prefill only (warm the KV cache for this prompt)
    draft_budget: int | None = None  # draft nodes per step; None: chosen per step from c(q)
    time_budget_s: float | None = None
    max_lines: int | None = None
    stop_text: str | None = None  # e.g. the infill's suffix: stop where the output starts repeating it
    stop_fn: Callable[[str], int | None] | None = None  # the caller's rule: where the text so far is complete
    temperature: float = 0.0  # 0: greedy (exact)
    top_p: float = 1.0
    seed: int | None = None
    forced_text: str = ""  # the output starts with this text (token healing: rest_lsp/engine/vocab.py); until it
                           # is spelled out only tokens that agree with it are chosen, and nothing is drafted


@dataclass
class GenerationResult:
    tokens: list[int]
    text: str
    stop_reason: str  # "max_tokens" | "eos" | "time" | "max_lines" | "stop_text" | "stop_fn" | "cancelled"
    steps: int  # model forwards that emitted tokens, the prefill included
    accepted: list[int]  # tokens emitted per step (REST's M = mean); the prefill emits 1
    prefill_s: float
    decode_s: float
    retrieval_ms: list[float]  # drafting time per decoding step
    forward_ms: list[float]  # verification forward per decoding step
    draft_sizes: list[int] = field(default_factory=list)  # draft nodes verified per decoding step
    accepted_sources: dict[str, int] = field(default_factory=dict)  # accepted draft tokens per source
    prompt_tokens: int = 0  # after fitting the context window
    reused_tokens: int = 0  # prompt tokens whose KV was already computed (earlier calls, warm-ups, the pool)


@dataclass(eq=False)
class Run:
    """One generation in progress. `out[-1]` is pending: decided, not yet in the KV cache."""

    prompt: list[int]
    config: GenerationConfig
    key: str | None  # whose KV states these are (a document), for the pool
    result: GenerationResult
    stops: StopChecker
    rng: torch.Generator | None
    chunk: int = PREFILL_CHUNK  # prompt tokens per prefill forward
    forced: str = ""  # what of config.forced_text the output has still to spell out
    out: list[int] = field(default_factory=list)
    done: bool = False
    forwards: int = 0  # model forwards spent on this run (prefill chunks included)
    computed: int = 0  # prompt tokens its prefill forwards computed (the rest came from earlier work)
    interrupted: int = 0  # forwards stopped between layers (`advance`'s interrupt): no tokens, nothing kept
    # its prompt holds text nobody typed (a prediction as if a suggestion were taken): a key that makes the run moot
    # makes its prompt moot too, so its prompt's forwards are interrupted like a decoding step's
    speculative: bool = False

    _ids: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64), repr=False)
    _n_ids: int = 0

    @property
    def prefilled(self) -> bool:
        return bool(self.out)

    def ids(self) -> np.ndarray:
        """prompt + out as int64 [len(prompt) + len(out)], a view of a buffer grown in place: what the drafter
        reads each step (converting the whole list again cost 0.05 ms per step right after a CPU forward pass,
        one cache miss per token object). `out` only grows by appending."""
        n = len(self.prompt) + len(self.out)
        if n > len(self._ids):
            grown = np.empty(max(n, 2 * len(self._ids), 256), dtype=np.int64)
            grown[: self._n_ids] = self._ids[: self._n_ids]
            self._ids = grown
        if self._n_ids < len(self.prompt):
            self._ids[: len(self.prompt)] = self.prompt
            self._n_ids = len(self.prompt)
        if self._n_ids < n:
            self._ids[self._n_ids: n] = self.out[self._n_ids - len(self.prompt):]
            self._n_ids = n
        return self._ids[:n]

    @property
    def text(self) -> str:
        """The output so far, cut by the stop rules (final once done)."""
        return self.result.text if self.done else self.stops.final_text

    @property
    def tokens(self) -> list[int]:
        return self.result.tokens if self.done else self.stops.final_tokens


class Engine:
    """Speculative decoding with drafts from weighted sources. Thread-safe: each forward holds a lock."""

    def __init__(
        self,
        loaded,
        sources: Sequence[tuple[DraftSource, float]] = (),
        *,
        verifier: Verifier | None = None,
        cost: CostModel | None = None,
        max_draft_nodes: int = 64,
        draft_len: int = 10,
        eos_token_ids: Sequence[int] | None = None,
        acceptance_lr: float = DEFAULT_LR,
        kv_pool_bytes: int = 0,
    ):
        """loaded: a LoadedModel (rest_lsp.model.host), or any object with .model and .tokenizer, or a bare
        HF causal LM. sources: (source, share) pairs (rest_lsp.engine.policy.make_sources). cost: c(q); None
        measures it on first use of an automatic budget (cached per model/precision/device). acceptance_lr:
        how fast the node ranking learns from the engine's own steps (0: rank by the trie's mass).
        kv_pool_bytes: memory for the KV states of earlier prompts (0: only the verifier's own cache)."""
        bare = isinstance(loaded, torch.nn.Module)  # a HF causal LM has its own `.model` (the decoder)
        self.model = loaded if bare else loaded.model
        self.tokenizer = None if bare else getattr(loaded, "tokenizer", None)
        self.name = type(self.model).__name__ if bare else getattr(loaded, "name", type(self.model).__name__)
        self.precision = str(next(self.model.parameters()).dtype) if bare else getattr(loaded, "precision", "")
        self.verifier: Verifier = verifier or HFVerifier(self.model, None if bare else getattr(loaded, "device", None))
        self.vocab_size: int = int(self.model.config.vocab_size)
        # quantized layers (int8w, int4w) compute calls of more than MAX_ROWS rows on their float weights:
        # a tree within that verifies on the products plain decoding uses, and stays exact
        rows = min((int(m.MAX_ROWS) for m in self.model.modules() if hasattr(m, "MAX_ROWS")), default=None)
        if rows is not None:
            max_draft_nodes = min(max_draft_nodes, rows - 1)
        self.max_rows: int | None = rows
        self.drafter = Drafter(sources, max_draft_nodes=max_draft_nodes, draft_len=draft_len,
                               acceptance_lr=acceptance_lr, vocab_size=self.vocab_size)
        if self.drafter:  # the drafting's compiled loops now, not in the first completion (seconds, once)
            compile_kernels()
        self.cost = cost
        if eos_token_ids is None:  # eos, the generation config's eos, and the FIM family's end-of-infill tokens
            eos_token_ids = self._default_eos() + ([] if bare else list(getattr(loaded, "stop_ids", None) or []))
        self.eos_token_ids = set(eos_token_ids)
        limits = [getattr(self.model.config, "max_position_embeddings", None), getattr(self.verifier, "max_len", None),
                  None if bare else getattr(loaded, "context_length", None)]
        self.max_positions: int | None = min((int(x) for x in limits if x), default=None)
        self.pool = KVPool(kv_pool_bytes)
        self.prefill_chunk = PREFILL_CHUNK
        self._cached: list[int] = []  # tokens whose keys/values the verifier holds
        self._cached_key: str | None = None
        self._logits: torch.Tensor | None = None  # [V] after the last cached token, when a prefill computed it
        self._scorer = None  # exact logits of given ids after the last cached token (with _logits)
        # position p of the cache -> (argmax, exact scorer) of the row after token p, as the forward that computed
        # it gave it (a prefill's last row, a step's path; see KEPT_ROWS; valid while tokens[:p + 1] are cached)
        self._rows: dict[int, tuple[int, Callable[[torch.Tensor], torch.Tensor]]] = {}
        self._observing: Run | None = None  # the run whose output the drafter's sources are following
        self._vocab: VocabIndex | None = None
        self._lock = threading.RLock()

    @property
    def sources(self) -> list[tuple[DraftSource, float]]:
        return self.drafter.sources

    @property
    def tree_reserve(self) -> int:
        """Positions kept free after the prompt and the new tokens for the last step's draft tree."""
        return self.drafter.draft_len + self.drafter.max_draft_nodes + 1

    # ---- the loop -------------------------------------------------------------------------------

    def generate(
        self, prompt_ids: Sequence[int], config: GenerationConfig, *, should_stop: Callable[[], bool] | None = None,
        key: str | None = None,
    ) -> GenerationResult:
        """Run one generation to its end. should_stop is polled between forwards (prefill chunks and decoding
        steps) and between a forward's layers where the verifier can stop there: the result then holds what was
        decided, with stop_reason "cancelled"."""
        run = self.start(prompt_ids, config, key=key)
        self.advance(run)
        while not run.done:
            if should_stop is not None and should_stop():
                self.stop(run, "cancelled")
                break
            self.advance(run, interrupt=should_stop)
        return run.result

    def start(self, prompt_ids: Sequence[int], config: GenerationConfig, *, key: str | None = None,
              chunk: int | None = None, speculative: bool = False) -> Run:
        """A run for this prompt; nothing is computed until `advance`. `speculative`: the prompt is a guess
        (`Run.speculative`), its forwards interruptible too."""
        _check_config(config)
        prompt = self._fit_context(list(prompt_ids), config.max_new_tokens)
        rng = torch.Generator().manual_seed(config.seed) if config.seed is not None else None
        result = GenerationResult([], "", "", 0, [], 0.0, 0.0, [], [], prompt_tokens=len(prompt))
        stops = StopChecker(config, self.tokenizer, self.eos_token_ids, time.perf_counter())
        if config.forced_text and self.tokenizer is None:
            raise ValueError("forced_text needs a tokenizer")
        return Run(prompt, config, key, result, stops, rng, chunk=max(1, chunk or self.prefill_chunk),
                   forced=config.forced_text, speculative=speculative)

    def advance(self, run: Run, interrupt: Callable[[], bool] | None = None) -> list[int]:
        """One model forward for this run; returns the tokens it decided (none for a prefill chunk that is
        not the prompt's last, or for recomputing the run's context after another prompt took the cache).
        `interrupt` (the run's job was stopped: a key made it moot) is polled between the layers of a decoding
        step's forward, where the verifier can be (verifier.py `Interrupted`): True ends the forward there and
        returns no tokens, the run and the cache as before it (the same step runs again if the run is advanced
        again). A prompt's forwards (prefill chunks, the first step) run to their end: the next key's prompt
        extends this one, so what they compute (its KV, the kept row of its last token) is what it needs; a
        decoding step computes the stale output past the place the key contradicts, which it does not. Except a
        speculative run's: its prompt holds a suggestion as if taken, which the key contradicts."""
        with self._lock:
            if run.done:
                return []
            try:
                if run.prefilled:
                    return self._decode_step(run, interrupt)
                return self._prefill_step(run, interrupt if run.speculative else None)
            except Interrupted:  # raised inside the step's forward, before anything of the step was kept
                run.interrupted += 1
                return []
            except BaseException:
                self.reset_cache()  # a forward that failed midway leaves the cache in an unknown state
                raise

    def _interruptible_forward(self, tensors: tuple, interrupt: Callable[[], bool] | None, **kw) -> torch.Tensor:
        """The verifier's forward of `tensors`, polling `interrupt` between its layers where the verifier can."""
        if interrupt is None or not hasattr(self.verifier, "interrupt"):
            return self.verifier.forward(*tensors, **kw)
        self.verifier.interrupt = interrupt
        try:
            return self.verifier.forward(*tensors, **kw)
        finally:
            self.verifier.interrupt = None

    def stop(self, run: Run, reason: str = "cancelled") -> None:
        """End a run now: its result holds what was decided so far."""
        with self._lock:
            if not run.done:
                if run.out:
                    run.stops.check(run.out, None)  # the cut of what is decided
                self._finish(run, reason)

    def _prefill_step(self, run: Run, interrupt: Callable[[], bool] | None = None) -> list[int]:
        t0 = time.perf_counter()
        if run.forwards == 0 and self.drafter and run.config.draft_budget is None:
            self.cost_model()  # calibrate before the cache holds anything worth keeping
        n = self._activate(run.prompt, run.key)
        whole = n == len(run.prompt) and self._logits is not None  # a warm-up computed this very prompt
        known = self._rows.get(n - 1) if n == len(run.prompt) and not whole and run.config.temperature <= 0 \
            else None  # an earlier step computed this prompt's last row (a key typed against its output)
        if run.forwards == 0:  # the last token is computed again unless its logits were kept
            run.result.reused_tokens = n if whole or known else min(n, len(run.prompt) - 1)
        if not (whole or known) and self._first_step_fits(run, n):
            return self._first_step(run, n, t0, interrupt)
        logits = None if known else self._logits if whole else self._fill(run.prompt, n, run, interrupt)
        run.result.prefill_s += time.perf_counter() - t0
        if known:  # the kept row's argmax, or its pick among the tokens agreeing with the forced text
            argmax, scorer = known
            agreeing = self._pick_agreeing(scorer, run)
            first = argmax if agreeing is None else agreeing
        elif logits is None:
            return []
        else:
            first = self._pick(logits, self._scorer, run)  # [V] -> the first new token, pending
        run.out = [first]
        self._spell(run, [first])
        run.result.steps, run.result.accepted = 1, [1]
        if run.config.max_new_tokens > 0:
            self._follow(run, new=True)
            self.drafter.observe([first])
        self._check(run)
        return [first]

    def _first_step_fits(self, run: Run, n: int) -> bool:
        """Whether the prompt's missing tokens (the cache holds n) are computed with the first draft tree: a
        rule of the prompt, the cache and the configuration only, never of the draft, so that REST and plain
        decoding compute the same rows on the same path. Greedy runs only (the forced text's constrained picks
        walk the tree there); the whole forward within a quantized model's exact rows."""
        cfg = run.config
        missing = len(run.prompt) - min(n, len(run.prompt) - 1)
        most = min(FIRST_STEP_TOKENS, run.chunk) if self.max_rows is None else \
            min(FIRST_STEP_TOKENS, run.chunk, self.max_rows - 1)  # room for a node beside the missing rows
        return cfg.temperature <= 0 and cfg.max_new_tokens > 0 and missing <= most

    def _first_step(self, run: Run, n: int, t0: float, interrupt: Callable[[], bool] | None = None) -> list[int]:
        """One forward: the prompt's missing tokens as a chain, then the draft tree rooted at the prompt's last
        token, whose row gives the first new token (as a prefill's last row would, on the exact path). A key
        typed is answered after one forward instead of a prefill and then a step."""
        prompt = run.prompt
        if n == len(prompt):  # all cached but the last token's logits: compute that token again
            n -= 1
            self._truncate(n)
        chain = prompt[n:-1]
        k = len(chain)
        self._follow(run, new=True)
        budget = run.config.draft_budget
        cost = self.cost_model() if budget is None and self.drafter else None
        t1 = time.perf_counter()
        max_nodes = None if self.max_rows is None else self.max_rows - k - 1
        tree = self.drafter.draft(run.ids(), budget, cost, rows_before=k, max_nodes=max_nodes)  # root: prompt[-1]
        t2 = time.perf_counter()
        device = self.verifier_device
        tokens, depths, tree_mask = tree.tensors(device)
        q = k + len(tree)
        mask = torch.zeros(q, q, dtype=torch.bool, device=device)
        mask[:k, :k] = chain_mask(k, device)  # the chain's rows see what precedes them
        mask[k:, :k] = True  # the tree's rows the whole chain, then their ancestors
        mask[k:, k:] = tree_mask
        logits = self._interruptible_forward(
            (torch.cat([torch.tensor(chain, dtype=torch.long, device=device), tokens]),
             torch.cat([torch.arange(k, device=device), depths + k]), mask),
            interrupt, rows=range(k, q))  # [len(tree), V]: the tree's rows
        path, nxt = self._walk(tree, logits, run)
        self.verifier.keep(list(range(k)) + [k + i for i in path])
        new = [tree.tokens[i] for i in path[1:]] + [nxt]
        run.out = list(new)
        run.forwards += 1
        run.computed += k + 1
        # the logits after the last token kept, as a prefill keeps them: a run of this very prompt (a request
        # stopped after this forward and asked again) starts from them without a forward
        last = path[-1]
        self._cached, self._logits, self._scorer = prompt + run.out[:-1], logits[last].clone(), \
            self.verifier.row_scorer(last)
        self._keep_rows(run, len(prompt) - 1, logits, path)
        res = run.result
        res.steps, res.accepted = 1, [len(path)]
        _credit_sources(res, tree, path)
        self.drafter.record(tree, path)
        self.drafter.observe_forward(tree, logits)
        self.drafter.observe(new)
        res.prefill_s += time.perf_counter() - t0  # (the first tokens are known after it: a prefill's time)
        log.debug("first step: %d prompt tokens with %d draft nodes in %.1f ms (drafting %.1f)", k + 1, len(tree) - 1,
                  (time.perf_counter() - t2) * 1000, (t2 - t1) * 1000)
        self._check(run)
        return new

    def _walk(self, tree: DraftTree, logits: torch.Tensor, run: Run) -> tuple[list[int], int]:
        """The accepted path and the next token, spelling the forced text: while some of it is left, each node's
        token is the pick among the tokens that agree with it (exact scores), as plain decoding picks it. A tree
        of more than its root is walked greedily (the first step's rule); a decoding step drafts nothing while
        a forced text is left, so sampling meets only a root here."""
        if not run.forced:
            return self._accept(tree, logits, run)
        kids, path = tree.children(), [0]
        while True:
            node = path[-1]
            tok = self._pick(logits[node], self.verifier.row_scorer(node), run) if run.forced \
                else int(logits[node].argmax())
            self._spell(run, [tok])
            child = kids[node].get(tok)
            if child is None:
                return path, tok
            path.append(child)

    def _decode_step(self, run: Run, interrupt: Callable[[], bool] | None = None) -> list[int]:
        t0 = time.perf_counter()
        context = run.prompt + run.out[:-1]  # what the cache must hold before the step
        n = self._activate(context, run.key)
        if n < len(context):  # another prompt took the cache and its state was not kept: compute it again
            self._fill(context, n, run)
            if len(self._cached) < len(context):
                run.result.decode_s += time.perf_counter() - t0
                return []  # (the step follows at once when one forward restored it: runs never starve)
        self._follow(run, new=False)
        t1 = time.perf_counter()
        budget = 0 if run.forced else run.config.draft_budget  # a constrained token is never drafted
        cost = self.cost_model() if budget is None and self.drafter else None
        tree = self.drafter.draft(run.ids(), budget, cost)  # context + the pending token
        t2 = time.perf_counter()
        logits = self._interruptible_forward(tree.tensors(self.verifier_device), interrupt)  # [q, V]
        path, nxt = self._walk(tree, logits, run)  # (while a forced text is left, the tree is its root alone)
        self.verifier.keep(path)  # cache: ... + root + accepted nodes; nxt is the new pending token
        t3 = time.perf_counter()
        new = [tree.tokens[i] for i in path[1:]] + [nxt]
        run.out += new
        run.forwards += 1
        self._cached, self._logits, self._scorer = run.prompt + run.out[:-1], None, None
        self._keep_rows(run, len(context), logits, path)
        self._record(run.result, tree, path, (t2 - t1) * 1000, (t3 - t2) * 1000)
        self.drafter.record(tree, path)
        self.drafter.observe_forward(tree, logits)
        self.drafter.observe(new)
        run.result.decode_s += time.perf_counter() - t0
        self._check(run)
        return new

    def _check(self, run: Run) -> None:
        reason = run.stops.check(run.out, None)
        if reason:
            self._finish(run, reason)

    def _finish(self, run: Run, reason: str) -> None:
        res = run.result
        res.tokens, res.text = list(run.stops.final_tokens), run.stops.final_text
        res.stop_reason = reason
        _trim_accepted(res.accepted, sum(res.accepted) - len(res.tokens))
        run.done = True
        if self._observing is run:
            self.drafter.finish()
            self._observing = None

    # ---- the KV cache -----------------------------------------------------------------------------

    def _fill(self, tokens: list[int], n: int, run: Run, interrupt: Callable[[], bool] | None = None) \
            -> torch.Tensor | None:
        """One forward appending tokens[n : n + run.chunk] to a cache holding tokens[:n]; the logits [V] after
        the last token when this completes `tokens`, else None."""
        if n == len(tokens):  # all cached, but not the last token's logits: compute that token again
            n -= 1
            self._truncate(n)
        hi = min(len(tokens), n + run.chunk)
        q = hi - n
        device = self.verifier_device
        out = self._interruptible_forward((torch.tensor(tokens[n:hi], dtype=torch.long, device=device),
                                           torch.arange(q, device=device), chain_mask(q, device)),
                                          interrupt, rows=[q - 1], prompt=True)  # only the last row's logits
        run.forwards += 1
        run.computed += q
        self._cached, self._logits, self._scorer = tokens[:hi], out[-1], self.verifier.row_scorer(len(out) - 1)
        self._rows[hi - 1] = (int(out[-1].argmax()), self._scorer)
        return self._logits if hi == len(tokens) else None

    def _activate(self, tokens: Sequence[int], key: str | None) -> int:
        """Make the verifier hold the longest prefix of `tokens` that it or the pool has; returns its length."""
        n = common_prefix(self._cached, tokens)
        if self.pool.budget_bytes:
            found = self.pool.take(tokens, better_than=n)
            lost = len(self._cached) - n
            if found is not None:
                self._save_active()
                entry, n = found
                self.verifier.import_state(entry.state)
                self._cached, self._logits, self._scorer = [int(t) for t in entry.tokens], entry.logits, entry.scorer
                self._rows = {}
            elif lost > SAVE_BIG_TOKENS or (lost > SAVE_MIN_TOKENS and key != self._cached_key):
                self._save_active()  # about to be cut back for another document or place: keep a copy
        self._cached_key = key
        self._truncate(n)
        return n

    def _save_active(self) -> None:
        if self._cached and self.pool.budget_bytes:
            self.pool.put(self._cached_key, self._cached, self.verifier.export_state(), self._logits, self._scorer)

    def _truncate(self, n: int) -> None:
        if n < len(self._cached):
            self.verifier.truncate(n)
            self._cached = self._cached[:n]
            self._logits = self._scorer = None
            self._rows = {p: r for p, r in self._rows.items() if p < n}

    def _keep_rows(self, run: Run, base: int, logits: torch.Tensor, path: list[int]) -> None:
        """Keep the rows of the accepted path (node path[i] is cache position base + i) within the run's first
        KEPT_ROWS output positions, for a later run whose prompt ends there; the lowest positions go first."""
        end = min(base + len(path), len(run.prompt) - 1 + KEPT_ROWS)
        for i in range(end - base):
            self._rows[base + i] = (int(logits[path[i]].argmax()), self.verifier.row_scorer(path[i]))
        if len(self._rows) > 2 * KEPT_ROWS:
            self._rows = dict(sorted(self._rows.items())[-2 * KEPT_ROWS:])

    def reset_cache(self) -> None:
        """Forget every KV state (the next prompt is computed from its start)."""
        with self._lock:
            self._cached, self._logits, self._scorer, self._rows = [], None, None, {}
            self.pool.clear()
            try:
                self.verifier.truncate(0)
            except Exception:  # noqa: BLE001 - a broken verifier is reported by its next forward
                pass

    @property
    def cached_tokens(self) -> int:
        """Tokens the verifier's cache holds now."""
        return len(self._cached)

    # ---- the pieces -----------------------------------------------------------------------------

    @property
    def verifier_device(self):
        return getattr(self.verifier, "device", None)

    def _fit_context(self, prompt: list[int], max_new: int) -> list[int]:
        """Drop from the left so that prompt + new tokens (+ a full draft) fit the model's positions."""
        vocab = self.vocab_size
        bad = next((t for t in prompt if not 0 <= t < vocab), None)
        if bad is not None:
            raise ValueError(f"prompt token id {bad} is outside the model's vocabulary (0..{vocab - 1})")
        if not prompt:
            bos = getattr(self.tokenizer, "bos_token_id", None) if self.tokenizer is not None else None
            if bos is None:
                raise ValueError("empty prompt and the tokenizer has no beginning-of-sequence token")
            prompt = [bos]
        if self.max_positions:
            room = self.max_positions - max_new - self.tree_reserve
            if room < 1:
                raise ValueError(f"max_new_tokens={max_new} leaves no room in a {self.max_positions}-token context")
            prompt = prompt[-room:]
        return prompt

    def _follow(self, run: Run, *, new: bool) -> None:
        """Point the drafter's sources at this run's output (another run may have used them since)."""
        if self._observing is run:
            return
        if self._observing is not None:
            self.drafter.finish()
        # a new run starts after its prompt (its first token is observed next); a resumed one after its
        # output so far, which its sources saw before
        self.drafter.begin(run.prompt if new else run.prompt + run.out)
        self._observing = run

    def _accept(self, tree: DraftTree, logits: torch.Tensor, run: Run) -> tuple[list[int], int]:
        cfg = run.config
        if cfg.temperature <= 0:
            return accept_greedy(tree, logits.argmax(dim=-1).tolist())
        return accept_sampled(tree, lambda i: sampling_probs(logits[i], cfg.temperature, cfg.top_p), run.rng)

    def _pick(self, logits: torch.Tensor, scorer, run: Run) -> int:
        """The next token from one row of logits [V] (only tokens that agree with what is left of the forced
        text, while some is: scored exactly by `scorer`, a Verifier.row_scorer)."""
        cfg = run.config
        agreeing = self._pick_agreeing(scorer, run)
        if agreeing is not None:
            return agreeing
        if cfg.temperature <= 0:
            return int(logits.argmax())
        probs = sampling_probs(logits, cfg.temperature, cfg.top_p)
        return int(torch.multinomial(probs.double(), 1, generator=run.rng))

    def _pick_agreeing(self, scorer, run: Run) -> int | None:
        """While some of the forced text is left, the pick among the tokens that agree with it (their exact
        logits from `scorer`); None when none is left, or when no token agrees (the forced text is then dropped:
        the output will not start with it, and the caller sees that)."""
        if not run.forced:
            return None
        ids = self.vocab.agreeing(run.forced)
        if not len(ids):
            run.forced = ""
            return None
        scores = scorer(ids)
        cfg = run.config
        if cfg.temperature <= 0:
            return int(ids[int(scores.argmax())])
        probs = sampling_probs(scores, cfg.temperature, cfg.top_p)
        return int(ids[int(torch.multinomial(probs.double(), 1, generator=run.rng))])

    def _spell(self, run: Run, tokens: list[int]) -> None:
        for t in tokens:
            if not run.forced:
                return
            run.forced = VocabIndex.left_after(run.forced, self.vocab.texts[t])

    @property
    def vocab(self) -> VocabIndex:
        """The vocabulary's token strings (built on first use: about a second for 150k tokens)."""
        if self._vocab is None:
            self._vocab = VocabIndex(self.tokenizer, self.vocab_size)
        return self._vocab

    def _record(self, res: GenerationResult, tree: DraftTree, path: list[int], retrieval_ms: float,
                forward_ms: float) -> None:
        res.steps += 1
        res.accepted.append(len(path))  # the accepted nodes plus the model's own next token
        res.retrieval_ms.append(retrieval_ms)
        res.forward_ms.append(forward_ms)
        res.draft_sizes.append(len(tree) - 1)
        _credit_sources(res, tree, path)

    def calibrate(self, *, force: bool = False, **measure_kw) -> CostModel:
        """Measure c(q) now (or read it from the user cache): call at start-up to keep the measurement
        (tens of seconds for a 0.5B model on a laptop CPU) out of the first completion."""
        with self._lock:
            return self._measure(force, **measure_kw)

    def cost_model(self) -> CostModel:
        """c(q), measured on first use (cached on disk per model, precision, device and verifier)."""
        with self._lock:
            return self.cost if self.cost is not None else self._measure(False)

    def _measure(self, force: bool, **measure_kw) -> CostModel:
        key = cost_key(self.name, self.precision, str(self.verifier_device), self.verifier)
        self._save_active()
        self.cost = load_or_measure(self.verifier, self.vocab_size, key, force=force, **measure_kw)
        self._cached, self._logits, self._scorer, self._rows = [], None, None, {}  # measuring used the cache
        self.verifier.truncate(0)
        return self.cost

    def _default_eos(self) -> list[int]:
        ids: set[int] = set()
        for src in (getattr(self.tokenizer, "eos_token_id", None),
                    getattr(getattr(self.model, "generation_config", None), "eos_token_id", None)):
            if isinstance(src, int):
                ids.add(src)
            elif isinstance(src, (list, tuple)):
                ids.update(int(i) for i in src)
        return sorted(ids)


def _check_config(config: GenerationConfig) -> None:
    if config.temperature < 0 or not 0 < config.top_p <= 1:
        raise ValueError(f"temperature must be >= 0 and top_p in (0, 1], got {config.temperature}, {config.top_p}")
    if config.draft_budget is not None and config.draft_budget < 0:
        raise ValueError(f"draft_budget must be >= 0 or None, got {config.draft_budget}")
    if config.max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {config.max_new_tokens}")


def _credit_sources(res: GenerationResult, tree: DraftTree, path: list[int]) -> None:
    """Count each accepted node for the source that contributed most to it."""
    for i in path[1:]:
        res.accepted_sources[tree.sources[i]] = res.accepted_sources.get(tree.sources[i], 0) + 1


def _trim_accepted(accepted: list[int], excess: int) -> None:
    """Take tokens cut by a stop rule off the last steps' counts (a step whose tokens were all cut stays, as 0)."""
    i = len(accepted) - 1
    while excess > 0 and i >= 0:
        take = min(excess, accepted[i])
        accepted[i] -= take
        excess -= take
        i -= 1
