"""The GPU verifier: a preallocated KV cache, the tree mask through SDPA, batch-invariant forwards, CUDA graphs.

    StaticVerifier(model, max_len=4096, rows=None, graphs=None) -> Verifier      (kind "static")

Runs any device (the tests run it on the CPU); on CUDA it is what `make_verifier(loaded, "auto")` picks
(rest_lsp/model/verifiers.py: the one place that chooses a verifier; which models it runs: support.py).

Exactness. Greedy REST is exact only if a token's logits do not depend on how it was batched: verified alone
(plain decoding), in a tree, or in a prompt chunk. A GPU breaks that twice. Its matrix kernels are chosen per
shape (cuBLAS computes a 1-row product, plain decoding, with another kernel and summation order than an 8-row
one), so in bf16 the same row comes out with different last bits; and a tree row's attention reduces over its
ancestors' keys interleaved with its siblings' masked ones, where plain decoding has them contiguous. Either
difference moves a near-tie argmax, and the KV cache a step leaves behind differs from plain decoding's. So:
- every forward runs as pieces of exactly `rows` rows (the last one padded): every product has one shape,
  and a row's result does not depend on the other rows (tests/model/test_static.py checks bit equality);
- attention runs in float64 (from the model-dtype queries, keys and values, an exact upcast): whatever the
  summation order, results agree to ~1e-16, far below the rounding to the model's dtype that follows, so tree
  rows and plain rows round to the same values. The cache stays in the model's dtype (a 7B model's 4,096
  positions: 2 GiB in bf16, 8 GiB had it been kept in float64); each layer's attended span is upcast as read.
On a GPU a 64-row piece of a 7B model costs about what one row costs (memory-bound: every weight is read
once either way), which `benchmarks/gpu_check.sh` measures as c(q); prompt chunks pay ceil(q / rows) pieces.

CUDA graphs: a piece's forward (embedding to logits) is captured once per attended span (the cache prefix a
piece reads, rounded up to `span_step`) and replayed with its inputs copied into static buffers, so a
decoding step costs one graph launch per piece instead of a few hundred kernel launches.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import torch
import torch.nn.functional as F

from rest_lsp.engine.verifier import SlotCache

from .ops import UnsupportedModel, attention_window, norm, norm_params, rope
from .support import check_supported


def _norm(x: torch.Tensor, hf_norm: torch.nn.Module) -> torch.Tensor:
    return norm(x, *norm_params(hf_norm))


class StaticVerifier(SlotCache):
    """The `Verifier` protocol over the HF model's own modules (no weight copies), see the module docstring.

    rows: the fixed piece size (default 64 on CUDA, 8 elsewhere); max_len: positions the cache holds (the
    model's max_position_embeddings caps it); graphs: CUDA graphs (default: on CUDA); span_step: graphs are
    captured per attended span rounded up to this; attention_dtype: float64 (exact, see above) or the model's
    dtype (faster, not batch-invariant: for measuring what exactness costs)."""

    kind = "static"

    def __init__(self, model: Any, *, max_len: int = 4096, rows: int | None = None, graphs: bool | None = None,
                 span_step: int = 256, attention_dtype: torch.dtype = torch.float64):
        check_supported(model, "static")
        cfg = model.config
        first = next(model.parameters())
        self.device, self.dtype = first.device, first.dtype
        self.model = model
        self.rows = int(rows or (64 if self.device.type == "cuda" else 8))
        max_pos = getattr(cfg, "max_position_embeddings", None)
        self.max_len = min(max_len, int(max_pos)) if max_pos else max_len   # the engine reads it
        window = attention_window(cfg)
        if window:
            self.max_len = min(self.max_len, window)   # within the window a sliding window is full attention
        self.capacity = self.max_len + self.rows   # padding rows of the last piece write past max_len
        self.n_heads = cfg.num_attention_heads
        self.n_kv = getattr(cfg, "num_key_value_heads", None) or self.n_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.n_heads
        self.scale = self.head_dim ** -0.5
        self.layers = list(model.model.layers)
        self.vocab_size = int(model.get_output_embeddings().weight.shape[0])
        self.attention_dtype = attention_dtype
        self.exact_logits = True
        with torch.no_grad():
            pos = torch.arange(self.capacity, device=self.device)[None]
            cos, sin = model.model.rotary_emb(model.model.embed_tokens.weight[:1][None], pos)
        self.cos, self.sin = cos[0].to(self.dtype), sin[0].to(self.dtype)   # [capacity, hd]
        self.cache = torch.zeros(len(self.layers), 2, self.n_kv, self.capacity, self.head_dim,
                                 dtype=self.dtype, device=self.device)
        self.span_step = span_step
        self.graphs = (self.device.type == "cuda") if graphs is None else bool(graphs)
        if self.graphs and self.device.type != "cuda":
            raise UnsupportedModel("static verifier: CUDA graphs need a CUDA device")
        self._graphs: dict[int, tuple[Any, dict[str, torch.Tensor]]] = {}
        self._pool = None
        self.past_len = 0
        self._last_q = 0

    # ------------------------------------------------------------------ one piece of `rows` rows
    def _piece(self, tokens: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
               mask: torch.Tensor) -> torch.Tensor:
        """tokens/positions/slots [R]; mask [R, span] bool over the cache's first span slots (True: attend).
        Writes the R keys/values at `slots`; returns logits [R, V] float32."""
        r, span = mask.shape
        nh, nkv, hd = self.n_heads, self.n_kv, self.head_dim
        m = self.model.model
        x = m.embed_tokens(tokens)   # [R, D]
        cos, sin = self.cos[positions], self.sin[positions]
        for i, layer in enumerate(self.layers):
            a = layer.self_attn
            h = _norm(x, layer.input_layernorm)
            q, k = a.q_proj(h).view(r, nh, hd), a.k_proj(h).view(r, nkv, hd)
            if hasattr(a, "q_norm"):   # Qwen3: each head's query and key RMS-normalised before the rotary
                q, k = _norm(q, a.q_norm), _norm(k, a.k_norm)
            q = rope(q.transpose(0, 1), cos, sin)   # [nh, R, hd]
            k = rope(k.transpose(0, 1), cos, sin)
            v = a.v_proj(h).view(r, nkv, hd).transpose(0, 1)
            kv = self.cache[i]   # [2, nkv, capacity, hd]
            kv[0].index_copy_(1, slots, k)
            kv[1].index_copy_(1, slots, v)
            up = self.attention_dtype
            att = F.scaled_dot_product_attention(
                q.to(up)[None], kv[0, :, :span].to(up)[None], kv[1, :, :span].to(up)[None], attn_mask=mask,
                scale=self.scale, enable_gqa=nkv != nh)   # [1, nh, R, hd]
            x = x + a.o_proj(att[0].transpose(0, 1).reshape(r, nh * hd).to(x.dtype))
            h = _norm(x, layer.post_attention_layernorm)
            mlp = layer.mlp
            if hasattr(mlp, "gate_proj"):
                x = x + mlp.down_proj(mlp.act_fn(mlp.gate_proj(h)) * mlp.up_proj(h))
            else:   # StarCoder2
                x = x + mlp.c_proj(mlp.act(mlp.c_fc(h)))
        return self.model.get_output_embeddings()(_norm(x, m.norm)).float()

    def _span(self, end: int) -> int:
        return min(self.capacity, math.ceil(end / self.span_step) * self.span_step)

    def _run(self, tokens, positions, slots, mask) -> torch.Tensor:
        if not self.graphs:
            return self._piece(tokens, positions, slots, mask)
        span = mask.shape[1]
        entry = self._graphs.get(span)
        if entry is None:
            entry = self._graphs[span] = self._capture(span)
        replay, io = entry
        io["tokens"].copy_(tokens)
        io["positions"].copy_(positions)
        io["slots"].copy_(slots)
        io["mask"].copy_(mask)
        replay()
        return io["logits"]

    def _capture(self, span: int):
        """(replay, static inputs and output) of one piece attending `span` cache slots. Warm-up and capture
        write keys/values at the cache's spare slots (past max_len), which nothing reads."""
        r = self.rows
        spare = torch.arange(self.max_len, self.max_len + r, device=self.device)
        io = {"tokens": torch.zeros(r, dtype=torch.long, device=self.device),
              "positions": torch.zeros(r, dtype=torch.long, device=self.device),
              "slots": spare.clone(),
              "mask": torch.zeros(r, span, dtype=torch.bool, device=self.device)}
        io["mask"][torch.arange(r, device=self.device), spare % span] = True   # no row sees nothing (NaN)
        replay, io["logits"] = self._grapher(lambda: self._piece(io["tokens"], io["positions"], io["slots"],
                                                                 io["mask"]))
        return replay, io

    def _grapher(self, fn):
        """Capture fn() as a CUDA graph: (replay, its output tensor, rewritten by every replay)."""
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for _ in range(2):   # warm-up: lazy initialisation and kernel selection outside the capture
                fn()
        torch.cuda.current_stream(self.device).wait_stream(stream)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            out = fn()
        return graph.replay, out

    # ------------------------------------------------------------------ the protocol
    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor, depths: torch.Tensor, tree_mask: torch.Tensor, *,
                rows: Sequence[int] | None = None, prompt: bool = False) -> torch.Tensor:
        # `prompt` changes nothing here: every call replays the same captured pieces (one graph per piece)
        q, past, r = int(tokens.shape[0]), self.past_len, self.rows
        if q == 0:
            raise ValueError("forward: no tokens")
        if past + q > self.max_len:
            raise ValueError(f"forward: cache holds {self.max_len} tokens; {past} cached + {q} new exceed it "
                             "(truncate first, or make the verifier with a larger max_len)")
        dev = self.device
        tokens, depths = tokens.to(dev, torch.long), depths.to(dev, torch.long)
        tree_mask = tree_mask.to(dev, torch.bool)
        out = []
        for lo in range(0, q, r):
            hi = min(q, lo + r)
            n = hi - lo
            span = self._span(past + lo + r)
            tok = torch.zeros(r, dtype=torch.long, device=dev)
            tok[:n] = tokens[lo:hi]
            pos = torch.zeros(r, dtype=torch.long, device=dev)
            pos[:n] = depths[lo:hi] + past
            slots = torch.arange(past + lo, past + lo + r, device=dev)
            mask = torch.zeros(r, span, dtype=torch.bool, device=dev)
            mask[:n, :past] = True
            mask[:n, past:past + hi] = tree_mask[lo:hi, :hi]
            pad = torch.arange(n, r, device=dev)
            mask[pad, past + lo + pad] = True   # padding rows see only themselves (and are never read)
            out.append(self._run(tok, pos, slots, mask)[:n].clone())
        self.past_len = past + q
        self._last_q = q
        logits = torch.cat(out) if len(out) > 1 else out[0]
        self._last_logits = logits if rows is None else logits[torch.as_tensor(list(rows), dtype=torch.long, device=dev)]
        return self._last_logits

    def row_scorer(self, row: int):
        logits = self._last_logits[row].clone()  # exact: this verifier returns full logits (a copy: see Verifier)
        return lambda ids: logits[ids.to(logits.device)]
