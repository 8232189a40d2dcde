"""Tree verification: one forward over a flattened draft tree, and a KV cache pruned to the accepted path.

The engine talks to the model only through `Verifier`, so a faster implementation (compiled, quantized,
static cache: rest_lsp/model/fast.py) can replace `HFVerifier` without touching the decoding loop.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol, Sequence, runtime_checkable

import torch


@dataclass(frozen=True)
class KVState:
    """A copy of a verifier's KV cache, its first `length` entries (`Verifier.export_state`); `data` is the
    verifier's own layout, read back only by the same kind of verifier."""

    length: int
    nbytes: int
    data: Any


class Interrupted(Exception):
    """A forward stopped between two layers because its `interrupt` said so: the cache holds exactly what it held
    before that forward (nothing of the forward is kept), so the same step can run again or the run can end."""


@runtime_checkable
class Verifier(Protocol):
    """Owns the KV cache of one sequence; the engine never touches cache internals.

    A verifier may also have an attribute `interrupt` (Callable[[], bool] | None, set by the engine around one
    forward): polled between layers, True raises `Interrupted`. A key that makes the running step moot (the
    prediction it extends is stale) then waits for one layer, not for the rest of the step (on a 2-core CPU a
    1.5B model's step is 80-90 ms). A verifier without it runs each forward to its end."""

    past_len: int  # tokens held in the cache

    def forward(self, tokens: torch.Tensor, depths: torch.Tensor, tree_mask: torch.Tensor, *,
                rows: Sequence[int] | None = None, prompt: bool = False) -> torch.Tensor:
        """Run q new tokens after the cache and append them to it.

        tokens [q] int64; depths [q] (position id = past_len + depth); tree_mask [q, q] bool, row i attends
        column j iff j is i or an ancestor of i (a chain, e.g. the prefill, is lower-triangular).
        Returns logits [q, V] float32, or [len(rows), V] for those rows only (a prefill needs its last row:
        most of the output projection is skipped).
        prompt: these rows are a prompt chunk, not a draft tree or a decoding step. Greedy speculation is exact
        because a tree's rows round as plain decoding's single rows do; a prompt's rows are compared with
        nothing (REST and plain decoding both start from the same prefilled cache), so a verifier may compute
        them on a faster path that is not row-invariant.
        """
        ...

    def keep(self, indices: Sequence[int]) -> None:
        """Keep only these of the last forward's q entries (the accepted path, in order); drop the rest."""
        ...

    def row_scorer(self, row: int) -> Callable[[torch.Tensor], torch.Tensor]:
        """For row `row` of the last forward's returned logits: a function from token ids [n] to their exact
        logits [n], valid after later forwards too (a verifier may return approximate values for tokens that
        cannot be the argmax: rest_lsp/model/screened.py). It holds what it needs of that row only, not the
        forward's whole output: the engine keeps scorers of many positions (generate.py `KEPT_ROWS`)."""
        ...

    def truncate(self, n: int) -> None:
        """Drop the cache beyond its first n tokens (prompt-prefix reuse, or a reset with n = 0)."""
        ...

    def export_state(self) -> KVState:
        """A copy of the cache as it is (the KV pool keeps it while another prompt uses the verifier)."""
        ...

    def import_state(self, state: KVState) -> None:
        """Make the cache hold exactly what `state` holds (from `export_state` of this verifier)."""
        ...


def chain_mask(q: int, device: torch.device | str | None = None) -> torch.Tensor:
    """[q, q] bool lower-triangular: a plain sequence (prefill, or a single-path draft)."""
    return torch.ones(q, q, dtype=torch.bool, device=device).tril_()


def kept_slots(past_len: int, last_q: int, indices: Sequence[int]) -> tuple[int, list[int], torch.Tensor | None]:
    """For Verifier.keep: (first slot of the last forward, the kept indices, their cache slots to move into
    place, or None when they already sit in place: a chain prefix needs only a crop)."""
    base, idx = past_len - last_q, list(indices)
    if any(not 0 <= i < last_q for i in idx):
        raise IndexError(f"keep: indices must lie in [0, {last_q}), got {idx}")
    if idx == list(range(len(idx))):
        return base, idx, None
    return base, idx, torch.tensor([base + i for i in idx], dtype=torch.long)


class SlotCache:
    """keep / truncate / export_state / import_state for a verifier whose KV cache is one preallocated tensor
    `self.cache` [layers, 2, kv_heads, slots, head_dim], entries in slot order (`past_len` used, `max_len`
    the most it holds), the last forward's q entries at the end (`_last_q`)."""

    cache: torch.Tensor
    past_len: int
    max_len: int
    _last_q: int

    @torch.inference_mode()
    def keep(self, indices: Sequence[int]) -> None:
        base, idx, src = kept_slots(self.past_len, self._last_q, indices)
        if src is not None:  # a chain prefix is already in place
            cache = self.cache
            cache[:, :, :, base : base + len(idx)] = cache.index_select(3, src.to(cache.device))
        self.past_len = base + len(idx)
        self._last_q = 0

    def truncate(self, n: int) -> None:
        if n < 0:
            raise ValueError(f"truncate: n must be >= 0, got {n}")
        self.past_len = min(n, self.past_len)  # slots beyond past_len are never attended, only overwritten
        self._last_q = 0

    def export_state(self) -> KVState:
        data = self.cache[:, :, :, : self.past_len].clone()  # [L, 2, nkv, n, hd]
        return KVState(self.past_len, data.nbytes, data)

    def import_state(self, state: KVState) -> None:
        n = state.length
        if n > self.max_len:
            raise ValueError(f"import_state: {n} entries do not fit a {self.max_len}-entry cache")
        self.cache[:, :, :, :n].copy_(state.data)
        self.past_len = n
        self._last_q = 0


class HFVerifier:
    """Eager verifier over any Hugging Face causal LM whose cache is a `DynamicCache` (Qwen2, Llama, ...).

    The tree is passed as a 4D additive mask [1, 1, q, past + q], which transformers uses as given, with
    explicit position ids; an additive float mask (not bool) because eager attention adds the mask.
    """

    def __init__(self, model: torch.nn.Module, device: torch.device | str | None = None):
        from transformers import DynamicCache

        self.model = model
        self.device = torch.device(device) if device is not None else next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.vocab_size: int = model.config.vocab_size
        self._cache_cls = DynamicCache
        self.cache = DynamicCache(config=model.config)
        # Sliding-window layers (Mistral, some Qwen2 configs) drop old entries once the window is full, after
        # which a tree can no longer be pruned by position: stay inside the window (the engine cuts prompts).
        windows = [layer.sliding_window for layer in self.cache.layers if getattr(layer, "sliding_window", None)]
        self.max_len: int | None = min(windows) - 1 if windows else None
        self.past_len = 0
        self._last_q = 0

    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor, depths: torch.Tensor, tree_mask: torch.Tensor, *,
                rows: Sequence[int] | None = None, prompt: bool = False) -> torch.Tensor:
        """As the protocol; rows= (optional, as in FastVerifier) returns logits for those rows only, which
        skips most of the output projection (a prefill needs only its last row). `prompt` changes nothing here:
        transformers' forward has one path."""
        q = tokens.shape[0]
        past = self.past_len
        if self.max_len is not None and past + q > self.max_len:
            raise ValueError(f"forward: {past} cached + {q} new tokens exceed the sliding window ({self.max_len})")
        # mask [1, 1, q, past + q]: every row sees the whole cache, then its ancestors and itself
        allowed = torch.ones(q, past + q, dtype=torch.bool, device=self.device)
        allowed[:, past:] = tree_mask.to(self.device)
        mask = torch.zeros(q, past + q, dtype=self.dtype, device=self.device)
        mask.masked_fill_(~allowed, torch.finfo(self.dtype).min)
        positions = (depths.to(self.device) + past)[None]  # [1, q]
        out = self.model(
            input_ids=tokens.to(self.device)[None],  # [1, q]
            attention_mask=mask[None, None],
            position_ids=positions,
            cache=self.cache,
            use_cache=True,
            logits_to_keep=0 if rows is None else torch.as_tensor(list(rows), dtype=torch.long, device=self.device),
        )
        self.past_len = past + q
        self._last_q = q
        self._last_logits = out.logits[0].float()  # [q, V]
        return self._last_logits

    def row_scorer(self, row: int) -> Callable[[torch.Tensor], torch.Tensor]:
        logits = self._last_logits[row].clone()  # its own copy: a view would keep the whole [q, V] alive
        return lambda ids: logits[ids.to(logits.device)]

    @torch.inference_mode()
    def keep(self, indices: Sequence[int]) -> None:
        base, idx, src = kept_slots(self.past_len, self._last_q, indices)
        if src is not None:
            src = src.to(self.device)
            for layer in self.cache.layers:
                # keys/values [batch, heads, seq, head_dim]: move the path into place, crop the rest
                layer.keys[:, :, base : base + len(idx)] = layer.keys.index_select(2, src)
                layer.values[:, :, base : base + len(idx)] = layer.values.index_select(2, src)
        self.truncate(base + len(idx))
        self._last_q = 0

    def truncate(self, n: int) -> None:
        if n < 0:
            raise ValueError(f"truncate: n must be >= 0, got {n}")
        if n == 0:
            self.cache = self._cache_cls(config=self.model.config)
        elif n < self.past_len:
            # slice directly: DynamicCache.crop's argument changed meaning across transformers 5.x releases
            for layer in self.cache.layers:
                layer.keys = layer.keys[:, :, :n]
                layer.values = layer.values[:, :, :n]
                if hasattr(layer, "cumulative_length"):  # sliding-window layers count their tokens
                    layer.cumulative_length = n
        self.past_len = min(n, self.past_len)
        self._last_q = 0

    def export_state(self) -> KVState:
        n = self.past_len
        layers = [] if n == 0 else [(layer.keys[:, :, :n].clone(), layer.values[:, :, :n].clone())
                                    for layer in self.cache.layers]  # each [batch, heads, n, head_dim]
        return KVState(n, sum(k.nbytes + v.nbytes for k, v in layers), layers)

    def import_state(self, state: KVState) -> None:
        self.cache = self._cache_cls(config=self.model.config)
        for i, (k, v) in enumerate(state.data):
            self.cache.update(k.to(self.device), v.to(self.device), i)   # appends to an empty layer: a copy
        self.past_len = state.length
        self._last_q = 0
