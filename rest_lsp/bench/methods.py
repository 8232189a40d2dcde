"""The benchmarked decoding methods, all over one loaded model (same weights, precision and device).

    ar          plain greedy: the engine's own loop with no draft sources (one token per forward, through
                the same verifier as the speculative methods, so the comparison measures drafting alone)
    pld         prompt lookup decoding on the engine: the policy `pld` (rest_lsp.engine.policy: the latest
                match of the context's last 3..1 tokens, the next 10 tokens as one chain), verified whole
                through the same verifier and loop as ar and rest, so pld against rest compares the drafts alone
    pld-hf      transformers' own prompt lookup: `generate(prompt_lookup_num_tokens=10)`, greedy; always
                transformers' eager forward (generate cannot drive a `Verifier`), whatever --verifier says
    rest-paper  REST as published: corpus datastore only, n_max 16, first k=5000 matches in suffix-array
                order, a 64-node trie by raw counts
    rest        the daemon's own policy (rest_lsp.engine.policy: context, history, repository, corpus, recycle)
                at the calibrated per-step budget, its history empty at the start (a daemon's first run)
    rest-history  rest whose history source starts from a saved history (--history FILE: the model's output
                on other prompts), as a daemon that ran before starts from its cache
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Sequence

import torch

METHODS = ("ar", "pld", "pld-hf", "rest-paper", "rest", "rest-history")


@dataclass
class Run:
    """One method on one prompt."""

    tokens: list[int]
    seconds: float  # prefill + decoding
    prefill_seconds: float  # until the first new token is known
    steps: int  # model forwards, the prefill included
    stop_reason: str
    retrieval_ms: list[float] = field(default_factory=list)  # drafting time per decoding step
    draft_nodes: list[int] = field(default_factory=list)  # draft nodes verified per decoding step
    accepted_sources: dict[str, int] = field(default_factory=dict)
    first_tokens: int = 1  # tokens the first forward decided: 1 after a prefill, more after a first step


class SharedVerifier:
    """One verifier (one KV cache, one packed copy of the weights) for all the engine methods. The engines
    run in turn, so an engine whose turn comes after another's forgets its record of the cache."""

    def __init__(self, verifier):
        from rest_lsp.model.verifiers import verifier_kind

        self.verifier = verifier
        self.kind = verifier_kind(verifier)
        self.owner = None

    def claim(self, engine) -> None:
        if self.owner is not engine:
            engine.reset_cache()
            self.owner = engine


class EngineMethod:
    """ar / pld / rest-paper / rest: the REST engine with a draft policy (None: no sources, plain decoding)."""

    def __init__(self, loaded, policy: str | None, *, corpus=None, repository=None, history=None,
                 draft_budget: int | None = None, draft_len: int = 10, shared: SharedVerifier | None = None):
        from rest_lsp.engine import Engine, make_sources
        from rest_lsp.model.verifiers import make_verifier_or_eager

        self.loaded = loaded
        self.policy = policy
        self.sources = make_sources(policy, corpus=corpus, repository=repository, history=history) if policy else []
        self.draft_budget = draft_budget if self.sources else None
        self.draft_len = draft_len
        # one engine for all prompts, as the daemon keeps one: its acceptance calibration and the sources'
        # state carry over; the verifier is shared with the other engine methods (see SharedVerifier)
        self.shared = shared or SharedVerifier(make_verifier_or_eager(loaded, "eager"))
        self.engine = Engine(loaded, self.sources, verifier=self.shared.verifier, max_draft_nodes=64,
                             draft_len=draft_len, eos_token_ids=loaded.stop_ids)

    @property
    def cost(self):
        return self.engine.cost

    def describe(self) -> dict:
        from rest_lsp.engine.policy import shares

        return {"loop": "rest_lsp.engine.Engine", "verifier": self.shared.kind, "policy": self.policy,
                "sources": shares(self.sources),
                "draft_budget": self.draft_budget if self.sources else 0, "draft_len": self.draft_len}

    def run(self, prompt_ids: Sequence[int], max_new_tokens: int) -> Run:
        from rest_lsp.engine import GenerationConfig

        self.shared.claim(self.engine)
        if self.sources and self.draft_budget is None and self.engine.cost is None:
            # calibrate c(q) outside the timed call: cached on disk per model/precision/verifier kind
            self.engine.cost_model()
        cfg = GenerationConfig(max_new_tokens=max_new_tokens,
                               draft_budget=self.draft_budget if self.sources else 0)
        res = self.engine.generate(list(prompt_ids), cfg)
        return Run(list(res.tokens), res.prefill_s + res.decode_s, res.prefill_s, res.steps, res.stop_reason,
                   list(res.retrieval_ms) if self.sources else [], list(res.draft_sizes),
                   dict(res.accepted_sources), res.accepted[0] if res.accepted else 0)


class _StepClock:
    """A transformers streamer that timestamps every batch of new tokens (one per model forward)."""

    def __init__(self):
        self.prompt_seen = False
        self.marks: list[tuple[float, int]] = []

    def put(self, value) -> None:
        if not self.prompt_seen:  # generate() first puts the prompt itself
            self.prompt_seen = True
            return
        self.marks.append((time.perf_counter(), int(value.numel())))

    def end(self) -> None:
        pass


class HfPldMethod:
    """pld-hf: transformers' own prompt-lookup decoding (greedy) on its eager forward, the same model object
    as the other methods."""

    def __init__(self, loaded, num_tokens: int = 10):
        self.loaded = loaded
        self.num_tokens = num_tokens

    def describe(self) -> dict:
        return {"loop": "transformers generate", "verifier": "transformers", "forward": "eager",
                "prompt_lookup_num_tokens": self.num_tokens}

    @torch.inference_mode()
    def run(self, prompt_ids: Sequence[int], max_new_tokens: int) -> Run:
        from transformers import GenerationConfig as HFGenerationConfig

        lm = self.loaded
        stop = list(lm.stop_ids)
        pad = stop[0] if stop else lm.tokenizer.pad_token_id
        # a fresh generation config: a checkpoint's own (repetition penalty, sampling) must not apply
        gc = HFGenerationConfig(do_sample=False, max_new_tokens=max_new_tokens,
                                prompt_lookup_num_tokens=self.num_tokens, eos_token_id=stop or None,
                                pad_token_id=pad)
        ids = torch.tensor([list(prompt_ids)], dtype=torch.long, device=lm.device)
        clock = _StepClock()
        t0 = time.perf_counter()
        out = lm.model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=gc, streamer=clock)
        t1 = time.perf_counter()
        new = out[0, ids.shape[1]:].tolist()
        eos_at = next((i for i, t in enumerate(new) if t in set(stop)), None)
        reason = "eos" if eos_at is not None else "max_tokens"
        if eos_at is not None:
            new = new[:eos_at]
        prefill = (clock.marks[0][0] - t0) if clock.marks else (t1 - t0)
        return Run(new, t1 - t0, prefill, max(1, len(clock.marks)), reason)


def make_method(name: str, loaded, *, corpus=None, repository=None, rest_policy: str = "rest",
                rest_budget: int | None = None, history=None, shared: SharedVerifier | None = None):
    """shared: the verifier of the engine methods (None: an eager one of their own); history: the
    HistorySource of rest / rest-history (the caller warms it or saves it; rest-history needs one)."""
    from rest_lsp.engine.policy import PLD_TOKENS, PolicyError

    if name == "ar":
        return EngineMethod(loaded, None, shared=shared)
    if name == "pld":  # a fixed budget: PLD proposes its whole chain every step, as transformers' does
        return EngineMethod(loaded, "pld", draft_budget=PLD_TOKENS, draft_len=PLD_TOKENS, shared=shared)
    if name == "pld-hf":
        return HfPldMethod(loaded, PLD_TOKENS)
    if name == "rest-paper":
        if corpus is None:
            raise PolicyError("method rest-paper needs a corpus datastore (--datastore DIR)")
        return EngineMethod(loaded, "paper", corpus=corpus, draft_budget=64, shared=shared)
    if name in ("rest", "rest-history"):
        if name == "rest-history" and history is None:
            raise PolicyError("method rest-history needs a saved history (--history FILE)")
        return EngineMethod(loaded, rest_policy, corpus=corpus, repository=repository,
                            history=history, draft_budget=rest_budget, shared=shared)
    raise PolicyError(f"unknown method {name!r}; one of {', '.join(METHODS)}")
