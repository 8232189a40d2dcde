"""The REST decoding loop: draft, verify the whole tree in one forward, keep the model's own path.

    prefill(prompt)                  -> the first new token (the pending root)
    repeat:
        draft   = trie of weighted continuations of context + root, mixed from the sources
        tree    = root + the nodes worth their verification cost
        logits  = verifier.forward(tree)          one forward, tree attention mask
        path    = longest path equal to the model's argmax (greedy) or accepted by rejection (sampling)
        emit path[1:] + the model's next token; keep only root + path in the KV cache

Greedy output is token-for-token what plain greedy decoding gives; with no draft a step is a plain step.
"""
from __future__ import annotations

import inspect
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from .acceptance import DEFAULT_LR, AcceptanceModel
from .cost import Calibration, CostModel, best_size, cost_key, load_or_measure
from .sources import DraftSource
from .stops import StopChecker
from .tree import DraftTree, accept_greedy, accept_sampled, flatten, rank_nodes, sampling_probs
from .trie import TokenTrie, match_strength, mix
from .verifier import HFVerifier, Verifier, chain_mask

log = logging.getLogger(__name__)

# Prompt tokens per prefill forward: should_stop is polled between chunks, so a long prompt (seconds on a
# CPU) can be cancelled; larger chunks save little once a forward is this wide.
PREFILL_CHUNK = 256

@dataclass
class GenerationConfig:
    max_new_tokens: int = 128
    draft_budget: int | None = None  # draft nodes per step; None: chosen per step from c(q)
    time_budget_s: float | None = None
    max_lines: int | None = None
    stop_text: str | None = None  # e.g. the infill's suffix: stop where the output starts repeating it
    stop_fn: Callable[[str], int | None] | None = None  # the caller's rule: where the text so far is complete
    temperature: float = 0.0  # 0: greedy (exact)
    top_p: float = 1.0
    seed: int | None = None


@dataclass
class GenerationResult:
    tokens: list[int]
    text: str
    stop_reason: str  # "max_tokens" | "eos" | "time" | "max_lines" | "stop_text" | "cancelled"
    steps: int  # model forwards that emitted tokens, the prefill included
    accepted: list[int]  # tokens emitted per step (REST's M = mean); the prefill emits 1
    prefill_s: float
    decode_s: float
    retrieval_ms: list[float]  # drafting time per decoding step
    forward_ms: list[float]  # verification forward per decoding step
    draft_sizes: list[int] = field(default_factory=list)  # draft nodes verified per decoding step
    accepted_sources: dict[str, int] = field(default_factory=dict)  # accepted draft tokens per source
    prompt_tokens: int = 0  # after fitting the context window
    reused_tokens: int = 0  # prompt tokens whose KV came from the previous call


class Engine:
    """Speculative decoding with drafts from weighted sources. Not re-entrant: calls are serialised."""

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
    ):
        """loaded: a LoadedModel (rest_lsp.model.host), or any object with .model and .tokenizer, or a bare
        HF causal LM. sources: (source, share) pairs; shares are normalised to sum to 1. cost: c(q); None
        measures it on first use of an automatic budget (cached per model/precision/device). acceptance_lr:
        how fast the node ranking learns from the engine's own steps (0: rank by the trie's mass)."""
        bare = isinstance(loaded, torch.nn.Module)  # a HF causal LM has its own `.model` (the decoder)
        self.model = loaded if bare else loaded.model
        self.tokenizer = None if bare else getattr(loaded, "tokenizer", None)
        self.name = type(self.model).__name__ if bare else getattr(loaded, "name", type(self.model).__name__)
        self.precision = str(next(self.model.parameters()).dtype) if bare else getattr(loaded, "precision", "")
        self.verifier: Verifier = verifier or HFVerifier(self.model, None if bare else getattr(loaded, "device", None))
        total = sum(share for _, share in sources) or 1.0
        self.sources: list[tuple[DraftSource, float]] = [(s, share / total) for s, share in sources]
        if self.precision == "int8" and self.sources:
            # quantize_dynamic picks one activation scale per call, so a row's logits depend on the other rows
            # of a verification (docs/cpu.md): tree drafts would change the output. Decode plainly, exactly.
            log.warning("int8 dynamic quantization is not batch-invariant: speculation is off, decoding is plain")
            self.sources = []
        self.cost = cost
        self.calibration = Calibration()  # learns how far the trie's estimates are off, across calls
        self.acceptance = AcceptanceModel(lr=acceptance_lr)  # learns which nodes get accepted, across calls
        self.max_draft_nodes = max_draft_nodes
        self.draft_len = draft_len
        if eos_token_ids is None:  # eos, the generation config's eos, and the FIM family's end-of-infill tokens
            eos_token_ids = self._default_eos() + ([] if bare else list(getattr(loaded, "stop_ids", None) or []))
        self.eos_token_ids = set(eos_token_ids)
        limits = [getattr(self.model.config, "max_position_embeddings", None), getattr(self.verifier, "max_len", None),
                  None if bare else getattr(loaded, "context_length", None)]
        self.max_positions: int | None = min((int(x) for x in limits if x), default=None)
        self._rows_kw = "rows" in inspect.signature(self.verifier.forward).parameters
        self._cached: list[int] = []  # tokens whose keys/values the verifier holds
        self.prefill_chunk = PREFILL_CHUNK
        self._lock = threading.Lock()

    # ---- the loop -------------------------------------------------------------------------------

    def generate(
        self, prompt_ids: Sequence[int], config: GenerationConfig, *, should_stop: Callable[[], bool] | None = None
    ) -> GenerationResult:
        with self._lock:
            try:
                return self._generate(list(prompt_ids), config, should_stop)
            except BaseException:
                self._forget_cache()  # an interrupted forward leaves the cache in an unknown state
                raise

    def _generate(self, prompt: list[int], config: GenerationConfig, should_stop) -> GenerationResult:
        start = time.perf_counter()
        _check_config(config)
        prompt = self._fit_context(prompt, config.max_new_tokens)
        rng = torch.Generator().manual_seed(config.seed) if config.seed is not None else None
        if config.draft_budget is None and self.sources:
            self._cost()  # calibrate before the prefill: measuring uses the verifier's cache
        for source, _ in self.sources:
            if hasattr(source, "begin"):
                source.begin(prompt)
        self.acceptance.begin()

        reused = self._reuse_prefix(prompt)
        logits = self._prefill(prompt, reused, should_stop)  # [V], the last prompt position
        prefill_s = time.perf_counter() - start
        if logits is None:  # cancelled between chunks: what was computed stays cached for the next call
            return GenerationResult([], "", "cancelled", 0, [], prefill_s, 0.0, [], [], prompt_tokens=len(prompt),
                                    reused_tokens=reused)
        out = [self._pick(logits, config, rng)]  # out[-1] is pending: decided, not yet in the cache
        stops = StopChecker(config, self.tokenizer, self.eos_token_ids, start)
        res = GenerationResult([], "", "", 1, [1], prefill_s, 0.0, [], [], prompt_tokens=len(prompt),
                               reused_tokens=reused)
        self._observe(out)
        while not (reason := stops.check(out, should_stop)):
            t0 = time.perf_counter()
            tree = self._draft(prompt + out, config)
            t1 = time.perf_counter()
            logits = self.verifier.forward(*tree.tensors(self.verifier_device))  # [q, V]
            path, nxt = self._accept(tree, logits, config, rng)
            self.verifier.keep(path)  # cache: ... + root + accepted nodes; nxt is the new pending token
            t2 = time.perf_counter()
            new = [tree.tokens[i] for i in path[1:]] + [nxt]
            self._record(res, tree, path, new, (t1 - t0) * 1000, (t2 - t1) * 1000)
            self._observe_forward(tree, logits)
            self._observe(new)
            out += new
        self.acceptance.finish()
        self._cached = prompt + out[:-1]
        res.tokens, res.text = stops.final_tokens, stops.final_text
        res.stop_reason = reason
        _trim_accepted(res.accepted, sum(res.accepted) - len(res.tokens))
        res.decode_s = time.perf_counter() - start - prefill_s
        return res

    def draft(self, context: Sequence[int], config: GenerationConfig | None = None) -> DraftTree:
        """The tree a step would verify after `context` (its last token decided, not yet verified): for
        offline replay of draft policies. Reads only the sources, cost, calibration and draft limits."""
        return self._draft(list(context), config or GenerationConfig())

    # ---- the pieces -----------------------------------------------------------------------------

    @property
    def verifier_device(self):
        return getattr(self.verifier, "device", None)

    def _fit_context(self, prompt: list[int], max_new: int) -> list[int]:
        """Drop from the left so that prompt + new tokens (+ a full draft) fit the model's positions."""
        vocab = self.model.config.vocab_size
        bad = next((t for t in prompt if not 0 <= t < vocab), None)
        if bad is not None:
            raise ValueError(f"prompt token id {bad} is outside the model's vocabulary (0..{vocab - 1})")
        if not prompt:
            bos = getattr(self.tokenizer, "bos_token_id", None) if self.tokenizer is not None else None
            if bos is None:
                raise ValueError("empty prompt and the tokenizer has no beginning-of-sequence token")
            prompt = [bos]
        if self.max_positions:
            room = self.max_positions - max_new - self.draft_len - self.max_draft_nodes - 1  # the last tree's slots
            if room < 1:
                raise ValueError(f"max_new_tokens={max_new} leaves no room in a {self.max_positions}-token context")
            prompt = prompt[-room:]
        return prompt

    def _reuse_prefix(self, prompt: list[int]) -> int:
        """Keep the cached keys/values of the longest prefix shared with the previous call (at least one
        prompt token is recomputed, for its logits)."""
        n = 0
        limit = min(len(self._cached), len(prompt) - 1)
        while n < limit and self._cached[n] == prompt[n]:
            n += 1
        self.verifier.truncate(n)
        self._cached = prompt[:n]
        return n

    def _prefill(self, prompt: list[int], start: int, should_stop) -> torch.Tensor | None:
        """Append prompt[start:] to the cache in chunks; logits [V] after the last token, or None when
        should_stop turned true between chunks (self._cached then records exactly the chunks computed)."""
        device = self.verifier_device
        logits = None
        for lo in range(start, len(prompt), self.prefill_chunk):
            if lo > start and should_stop is not None and should_stop():
                return None
            chunk = prompt[lo : lo + self.prefill_chunk]
            q = len(chunk)
            args = (torch.tensor(chunk, dtype=torch.long, device=device), torch.arange(q, device=device),
                    chain_mask(q, device))
            # only the last row's logits are used (rows= skips the rest of the output projection)
            logits = self.verifier.forward(*args, rows=[q - 1]) if self._rows_kw else self.verifier.forward(*args)
            self._cached = prompt[: lo + q]
        return logits[-1]

    def _draft(self, context: list[int], config: GenerationConfig) -> DraftTree:
        """Root (the pending token) plus the draft nodes worth verifying."""
        budget = self.max_draft_nodes if config.draft_budget is None else config.draft_budget
        if not self.sources or budget <= 0:
            return DraftTree.single(context[-1])
        return self._select(self._trie(context), budget, config)

    def _trie(self, context: list[int]) -> TokenTrie:
        """Every source's continuations of the context, mixed by share into one trie."""
        proposals = []
        for source, share in self.sources:
            conts = source.propose(context, self.draft_len)
            proposals.append((source.name, share, match_strength(getattr(source, "last_match_len", None)), conts))
        return mix(context[-1], proposals)

    def _select(self, trie: TokenTrie, budget: int, config: GenerationConfig) -> DraftTree:
        """The best `budget` nodes by estimated acceptance, cut where c(q) makes another node a loss."""
        est = self.acceptance.estimate(trie)  # [N] each node's chance of acceptance
        order = rank_nodes(trie, budget, est)
        if config.draft_budget is None:
            scale = self.calibration.scale()
            order = order[: best_size([min(1.0, est[n] * scale) for n in order], self._cost())]
        return flatten(trie, order, est)

    def _accept(self, tree: DraftTree, logits: torch.Tensor, config: GenerationConfig, rng) -> tuple[list[int], int]:
        if config.temperature <= 0:
            return accept_greedy(tree, logits.argmax(dim=-1).tolist())
        return accept_sampled(tree, lambda i: sampling_probs(logits[i], config.temperature, config.top_p), rng)

    def _pick(self, logits: torch.Tensor, config: GenerationConfig, rng) -> int:
        """The next token from one row of logits [V]."""
        if config.temperature <= 0:
            return int(logits.argmax())
        probs = sampling_probs(logits, config.temperature, config.top_p)
        return int(torch.multinomial(probs.double(), 1, generator=rng))

    def _record(self, res: GenerationResult, tree: DraftTree, path: list[int], new: list[int],
                retrieval_ms: float, forward_ms: float) -> None:
        res.steps += 1
        res.accepted.append(len(new))
        res.retrieval_ms.append(retrieval_ms)
        res.forward_ms.append(forward_ms)
        res.draft_sizes.append(len(tree) - 1)
        self.calibration.update(sum(tree.probs[1:]), len(path) - 1)
        for i in path[1:]:
            res.accepted_sources[tree.sources[i]] = res.accepted_sources.get(tree.sources[i], 0) + 1

    def _observe(self, tokens: list[int]) -> None:
        for source, _ in self.sources:
            source.observe(tokens)
        self.acceptance.observe(tokens)

    def _observe_forward(self, tree: DraftTree, logits: torch.Tensor) -> None:
        listeners = [s for s, _ in self.sources if hasattr(s, "observe_forward")]
        if listeners:
            topk = logits.topk(max(getattr(s, "k", 4) for s in listeners), dim=-1).indices.tolist()  # [q, k]
            for s in listeners:
                s.observe_forward(tree.tokens, topk, tree.parents)

    def calibrate(self, *, force: bool = False, **measure_kw) -> CostModel:
        """Measure c(q) now (or read it from the user cache): call at start-up to keep the measurement
        (tens of seconds for a 0.5B model on a laptop CPU) out of the first completion."""
        with self._lock:
            return self._measure(force, **measure_kw)

    def _cost(self) -> CostModel:
        return self.cost if self.cost is not None else self._measure(False)

    def _measure(self, force: bool, **measure_kw) -> CostModel:
        key = cost_key(self.name, self.precision, str(self.verifier_device), self.verifier)
        self.cost = load_or_measure(self.verifier, self.model.config.vocab_size, key, force=force, **measure_kw)
        self._cached = []  # measuring used the cache
        return self.cost

    def _forget_cache(self) -> None:
        self._cached = []
        try:
            self.verifier.truncate(0)
        except Exception:
            pass

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


def _trim_accepted(accepted: list[int], excess: int) -> None:
    """Take tokens cut by a stop rule off the last steps' counts (a step whose tokens were all cut stays, as 0)."""
    i = len(accepted) - 1
    while excess > 0 and i >= 0:
        take = min(excess, accepted[i])
        accepted[i] -= take
        excess -= take
        i -= 1
