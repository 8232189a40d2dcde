"""A faster CPU verifier: a static KV cache and prepacked weights, optionally compiled by inductor.

Why: on a CPU the cost of verifying q tokens at once, c(q), decides whether speculation pays. Eager
transformers re-packs every weight matrix inside each small-M matrix product (MKL/oneDNN pack B per
call), so c(4) costs 2.5x c(1) on the 2-core development machine although one pass over the weights could
serve several rows. Here each Linear is reordered once into oneDNN's blocked layout
(`torch.ops.mkldnn._reorder_linear_weight`, the same prepacking inductor's `freezing` applies), q/k/v and
gate/up are fused into one product each, and the KV cache is a preallocated tensor, so one forward is a
pass over the weights plus a little attention.

    make_verifier(loaded, kind="auto" | "eager" | "packed" | "compiled", max_len=4096) -> Verifier

kinds
    eager     rest_lsp.engine.verifier.HFVerifier: transformers' own forward (any architecture)
    packed    this module's forward with oneDNN-prepacked weights; no compile, ready in ~2 s
    compiled  the same forward under torch.compile(inductor, freezing, max-autotune) per q bucket
              (1, 2, 4, 8, 16; larger q run the packed eager path); minutes of warm-up per process
    auto      packed where supported (Qwen2/Llama families, fp32 or bf16 on CPU), else eager

Every kind computes the same model at the same precision; the engine's greedy output with any of them is
the greedy output of plain decoding with that same verifier (tests/model/test_fast.py).
"""
from __future__ import annotations

import os
import time
from typing import Any, Sequence

import torch
import torch.nn.functional as F

KINDS = ("auto", "eager", "packed", "compiled")
SUPPORTED_ARCHS = ("qwen2", "llama")
COMPILE_BUCKETS = (1, 2, 4, 8, 16)


class UnsupportedModel(ValueError):
    """The fast path cannot run this model (architecture, precision or device); the message says why."""


def packing_available() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")


def _check_supported(model: Any) -> None:
    cfg = model.config
    arch = getattr(cfg, "model_type", None)
    if arch not in SUPPORTED_ARCHS:
        raise UnsupportedModel(f"fast verifier: architecture {arch!r} not supported (only {SUPPORTED_ARCHS})")
    if getattr(cfg, "use_sliding_window", False) and getattr(cfg, "sliding_window", None):
        raise UnsupportedModel("fast verifier: sliding-window attention is not supported")
    params = list(model.parameters())
    if not params or any(p.device.type != "cpu" for p in params):
        raise UnsupportedModel("fast verifier: CPU models only")
    if any(p.dtype not in (torch.float32, torch.bfloat16) for p in params):
        raise UnsupportedModel("fast verifier: fp32 or bf16 weights only (int8 dynamic quantization keeps "
                               "no float weights to pack)")
    attn = model.model.layers[0].self_attn
    if not all(hasattr(attn, n) for n in ("q_proj", "k_proj", "v_proj", "o_proj")):
        raise UnsupportedModel("fast verifier: attention without q/k/v/o projections")
    if hasattr(attn, "q_norm") or hasattr(attn, "k_norm"):
        raise UnsupportedModel("fast verifier: per-head q/k norms (Qwen3-style) are not supported")


class Dense(torch.nn.Module):
    """y = x @ w.T + b over a weight reordered once into oneDNN's blocked layout (packed=True), or plain
    (packed=False: what torch.compile sees, so that inductor's freezing does its own prepacking)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, packed: bool):
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.packed = packed
        w = weight.detach().contiguous()
        if packed:
            # the batch-size hint only tunes the reorder; the packed weight serves every M
            w = torch.ops.mkldnn._reorder_linear_weight(w, 8)
        self.register_buffer("weight", w, persistent=False)
        self.register_buffer("bias", None if bias is None else bias.detach().contiguous(), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x [M, in] -> [M, out]
        if self.packed:
            return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")
        return F.linear(x, self.weight, self.bias)


def _cat_bias(*mods) -> torch.Tensor | None:
    biases = [m.bias for m in mods]
    if all(b is None for b in biases):
        return None
    return torch.cat([b if b is not None else torch.zeros(m.out_features, dtype=m.weight.dtype)
                      for b, m in zip(biases, mods)])


class Layer(torch.nn.Module):
    def __init__(self, hf_layer: Any, packed: bool):
        super().__init__()
        a, m = hf_layer.self_attn, hf_layer.mlp
        self.qkv = Dense(torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]),
                         _cat_bias(a.q_proj, a.k_proj, a.v_proj), packed)
        self.o = Dense(a.o_proj.weight, a.o_proj.bias, packed)
        self.gate_up = Dense(torch.cat([m.gate_proj.weight, m.up_proj.weight]),
                             _cat_bias(m.gate_proj, m.up_proj), packed)
        self.down = Dense(m.down_proj.weight, m.down_proj.bias, packed)
        self.in_norm = hf_layer.input_layernorm.weight.detach()
        self.post_norm = hf_layer.post_attention_layernorm.weight.detach()


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    # as transformers' Qwen2RMSNorm/LlamaRMSNorm: normalise in fp32, scale in the weights' dtype
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return w * xf.to(x.dtype)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x [heads, M, hd]; cos/sin [M, hd] (both halves repeated, as transformers builds them)
    h = x.shape[-1] // 2
    rotated = torch.cat([-x[..., h:], x[..., :h]], dim=-1)
    return x * cos + rotated * sin


class StaticLM(torch.nn.Module):
    """A gpt-fast-style forward of a Qwen2/Llama causal LM over a preallocated KV cache.

    Cache [layers, 2 (k, v), kv_heads, max_len, head_dim]. A forward writes its q entries at slots
    `start .. start+q-1` and attends over the first `span` slots under `mask` [q, span]; the eager path
    passes span = start + q, the compiled path span = max_len (static shapes, masked)."""

    def __init__(self, model: Any, max_len: int, packed: bool):
        super().__init__()
        cfg = model.config
        self.n_heads = cfg.num_attention_heads
        self.n_kv = getattr(cfg, "num_key_value_heads", None) or self.n_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.n_heads
        self.eps = float(cfg.rms_norm_eps)
        self.max_len = max_len
        self.dtype = model.model.embed_tokens.weight.dtype
        self.embed = model.model.embed_tokens.weight.detach()  # shared with the HF model, no copy
        self.layers = torch.nn.ModuleList(Layer(l, packed) for l in model.model.layers)
        self.norm = model.model.norm.weight.detach()
        head = model.get_output_embeddings()
        self.head = Dense(head.weight, getattr(head, "bias", None), packed)
        self.vocab_size = head.weight.shape[0]
        # rotary tables from the model's own rotary module: covers rope scaling variants and attention_scaling
        with torch.no_grad():
            pos = torch.arange(max_len)[None]
            cos, sin = model.model.rotary_emb(self.embed[:1][None], pos)
        self.register_buffer("cos", cos[0].to(self.dtype), persistent=False)  # [max_len, hd]
        self.register_buffer("sin", sin[0].to(self.dtype), persistent=False)
        self.register_buffer("cache", torch.zeros(len(self.layers), 2, self.n_kv, max_len, self.head_dim,
                                                  dtype=self.dtype), persistent=False)

    def hidden(self, tokens: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
               mask: torch.Tensor) -> torch.Tensor:
        """tokens/positions/slots [q]; mask [q, span] bool (True = attend) -> final hidden states [q, D]."""
        q, span = mask.shape
        nh, nkv, hd = self.n_heads, self.n_kv, self.head_dim
        x = F.embedding(tokens, self.embed)  # [q, D]
        cos, sin = self.cos[positions], self.sin[positions]  # [q, hd]
        for i, layer in enumerate(self.layers):
            qkv = layer.qkv(rms_norm(x, layer.in_norm, self.eps))  # [q, (nh + 2 nkv) hd]
            qh = qkv[:, : nh * hd].view(q, nh, hd).transpose(0, 1)  # [nh, q, hd]
            kh = qkv[:, nh * hd : (nh + nkv) * hd].view(q, nkv, hd).transpose(0, 1)  # [nkv, q, hd]
            vh = qkv[:, (nh + nkv) * hd :].view(q, nkv, hd).transpose(0, 1)
            qh, kh = rope(qh, cos, sin), rope(kh, cos, sin)
            kv = self.cache[i]  # [2, nkv, max_len, hd]
            kv[0].index_copy_(1, slots, kh)
            kv[1].index_copy_(1, slots, vh)
            att = F.scaled_dot_product_attention(
                qh[None], kv[0, :, :span][None], kv[1, :, :span][None], attn_mask=mask, enable_gqa=True
            )  # [1, nh, q, hd]
            x = x + layer.o(att[0].transpose(0, 1).reshape(q, nh * hd))
            h = layer.gate_up(rms_norm(x, layer.post_norm, self.eps))  # [q, 2 I]
            gate, up = h.chunk(2, dim=-1)
            x = x + layer.down(F.silu(gate) * up)
        return rms_norm(x, self.norm, self.eps)

    def forward(self, tokens, positions, slots, mask) -> torch.Tensor:
        return self.head(self.hidden(tokens, positions, slots, mask)).float()  # [q, V]


class FastVerifier:
    """The `Verifier` protocol over `StaticLM`: packed eager forward, or compiled per q bucket.

    forward(tokens [q], depths [q], tree_mask [q, q]) -> logits [q, V] float32, appending q cache entries;
    keep(indices) keeps the accepted path; truncate(n) drops the cache beyond n. `rows=` (optional) limits
    the logits to some rows (e.g. the last row of a prefill), which skips most of the output projection."""

    def __init__(self, model: Any, *, max_len: int = 4096, compiled: bool = False,
                 buckets: Sequence[int] = COMPILE_BUCKETS, mode: str = "max-autotune"):
        _check_supported(model)
        if not packing_available():
            raise UnsupportedModel("fast verifier: this torch build has no oneDNN (mkldnn) linear prepacking")
        max_pos = getattr(model.config, "max_position_embeddings", None)
        if max_pos:
            max_len = min(max_len, int(max_pos))
        self.model_ref = model
        self.max_len = max_len
        self.max_positions = max_pos
        self.lm = StaticLM(model, max_len, packed=True).eval()
        self.vocab_size = self.lm.vocab_size
        self.device = torch.device("cpu")
        self.dtype = self.lm.dtype
        self.past_len = 0
        self._last_q = 0
        self.compiled = compiled
        self.buckets = tuple(sorted(buckets)) if compiled else ()
        self.compile_seconds: dict[int, float] = {}
        self._compiled_fns: dict[int, Any] = {}
        if compiled:
            self._compiled_lm = StaticLM(model, max_len, packed=False).eval()
            self._compiled_lm.cache = self.lm.cache  # one cache for both paths
            self._compile_mode = mode

    # ------------------------------------------------------------------ protocol
    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor, depths: torch.Tensor, tree_mask: torch.Tensor, *,
                rows: Sequence[int] | None = None) -> torch.Tensor:
        q = int(tokens.shape[0])
        past = self.past_len
        if q == 0:
            raise ValueError("forward: no tokens")
        if past + q > self.max_len:
            raise ValueError(f"forward: cache holds {self.max_len} tokens; {past} cached + {q} new exceed it "
                             "(truncate first, or make the verifier with a larger max_len)")
        tokens = tokens.to(torch.long)
        positions = depths.to(torch.long) + past
        bucket = next((b for b in self.buckets if b >= q), None)
        if bucket is not None and rows is None:
            logits = self._compiled_forward(bucket, tokens, positions, tree_mask.to(torch.bool))
        else:
            slots = torch.arange(past, past + q)
            mask = torch.ones(q, past + q, dtype=torch.bool)
            mask[:, past:] = tree_mask
            h = self.lm.hidden(tokens, positions, slots, mask)  # [q, D]
            if rows is not None:
                h = h[torch.as_tensor(list(rows), dtype=torch.long)]
            logits = self.lm.head(h).float()
        self.past_len = past + q
        self._last_q = q
        return logits

    @torch.inference_mode()
    def keep(self, indices: Sequence[int]) -> None:
        q = self._last_q
        base = self.past_len - q
        idx = list(indices)
        if any(not 0 <= i < q for i in idx):
            raise IndexError(f"keep: indices must lie in [0, {q}), got {idx}")
        if idx != list(range(len(idx))):  # a chain prefix is already in place
            src = torch.tensor([base + i for i in idx], dtype=torch.long)
            cache = self.lm.cache  # [L, 2, nkv, max_len, hd]
            cache[:, :, :, base : base + len(idx)] = cache.index_select(3, src)
        self.past_len = base + len(idx)
        self._last_q = 0

    def truncate(self, n: int) -> None:
        if n < 0:
            raise ValueError(f"truncate: n must be >= 0, got {n}")
        self.past_len = min(n, self.past_len)  # slots beyond past_len are never attended, only overwritten
        self._last_q = 0

    # ------------------------------------------------------------------ compiled buckets
    def _compiled_forward(self, bucket: int, tokens, positions, tree_mask) -> torch.Tensor:
        q, past = tokens.shape[0], self.past_len
        fn = self._compiled_fns.get(bucket)
        if fn is None:
            fn = self._compile(bucket)
        # pad to the bucket: padded rows write into slots past+q.. (beyond the cache end, never attended),
        # see nothing but themselves, and their logits are dropped
        pad = bucket - q
        tok = torch.zeros(bucket, dtype=torch.long)
        tok[:q] = tokens
        pos = torch.zeros(bucket, dtype=torch.long)
        pos[:q] = positions
        slots = torch.arange(past, past + bucket).clamp_(max=self.max_len - 1)
        mask = torch.zeros(bucket, self.max_len, dtype=torch.bool)
        mask[:q, :past] = True
        mask[:q, past : past + q] = tree_mask
        if pad:
            # padded rows attend only to themselves (a row with no visible key would give NaN);
            # when the bucket runs past the cache end their slots are clamped onto the last slot, which
            # no real row attends (past + q <= max_len - 1 then, so the last slot is beyond every real row)
            for r in range(q, bucket):
                mask[r, int(slots[r])] = True
        return fn(tok, pos, slots, mask)[:q]

    def _compile(self, bucket: int):
        import torch._inductor.config as inductor_config

        inductor_config.freezing = True
        inductor_config.fx_graph_cache = True
        t = time.perf_counter()
        fn = torch.compile(self._compiled_lm, mode=self._compile_mode, fullgraph=True, dynamic=False)
        # first call compiles; run it on a throwaway slot range so the live cache is untouched
        self._compiled_fns[bucket] = fn
        self.compile_seconds[bucket] = time.perf_counter() - t
        return fn

    def warm_up(self) -> dict[int, float]:
        """Compile every bucket now (not on first use); returns seconds per bucket."""
        if not self.compiled:
            return {}
        saved = self.past_len, self._last_q
        with torch.inference_mode():
            for b in self.buckets:
                t = time.perf_counter()
                self.past_len = 0
                self._compiled_forward(b, torch.zeros(b, dtype=torch.long), torch.arange(b),
                                       torch.ones(b, b, dtype=torch.bool).tril_())
                self.compile_seconds[b] = time.perf_counter() - t
        self.past_len, self._last_q = saved  # the warm-up wrote only slots at or beyond... see below
        return dict(self.compile_seconds)


def make_verifier(loaded: Any, kind: str = "auto", *, max_len: int = 4096, **kwargs):
    """A `Verifier` for a LoadedModel (rest_lsp.model.host) or a bare HF model.

    kind: "auto" (packed where supported, else eager), "eager" (HFVerifier), "packed", "compiled"."""
    from rest_lsp.engine.verifier import HFVerifier

    if kind not in KINDS:
        raise ValueError(f"make_verifier: kind must be one of {KINDS}, got {kind!r}")
    model = getattr(loaded, "model", loaded)
    if kind == "eager":
        return HFVerifier(model)
    if kind == "auto":
        try:
            return FastVerifier(model, max_len=max_len, **kwargs)
        except UnsupportedModel:
            return HFVerifier(model)
    verifier = FastVerifier(model, max_len=max_len, compiled=(kind == "compiled"), **kwargs)
    return verifier
