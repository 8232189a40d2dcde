"""The packed CPU verifier: a static KV cache and prepacked weights, optionally compiled by inductor.

Why: on a CPU the cost of verifying q tokens at once, c(q), decides whether speculation pays. Eager
transformers hands every small-M matrix product to MKL/oneDNN with a plain weight, which is repacked on
every call, so in eager fp32 c(8) costs about 2-3x c(1) although one pass over the weights could serve
several rows. Here each Linear is reordered once into oneDNN's blocked layout
(`torch.ops.mkldnn._reorder_linear_weight`, the prepacking inductor's `freezing` applies), q/k/v and
gate/up are fused into one product each, and the KV cache is one preallocated tensor, so a forward is one
pass over the weights plus a little attention, and c(8) stays near c(1) (figures: docs/cpu.md).

    FastVerifier(model, max_len=4096, screen=False, compiled=False, ...) -> Verifier

kinds (which one runs where, and whether its tree rows are exact: rest_lsp/model/verifiers.py, the one place
that chooses)
    packed    this module's forward with oneDNN-prepacked weights, full fp32 logits; ready in seconds
    screened  packed, with the output projection screened in bf16 (rest_lsp/model/screened.py): argmax(-1)
              exact (a proven bound), other logits approximate; needs native bf16 dot products to pay
    compiled  the same forward under torch.compile (inductor, freezing, max-autotune CPU GEMM templates)
              per q bucket (1, 2, 4, 8, 16; other q run the packed path); many minutes of compiling

An int8 or int4 model (rest_lsp/model/int8row.py: per-row W8A8; int8weight.py: weight-only int8 with bf16
products; int4weight.py: the GGUF's 4-bit blocks, the rest int8w) runs its own quantized modules here, q/k/v and
gate/up fused (bit-identical to the separate products), its int8 LM head as is (exact logits at that precision,
so no screening); `packed` and `screened` both give that path. Where every product of a layer is the GGUF's blocks
on gguf_amx's kernel (int4w), a step or a tree of up to 16 rows runs each layer in one compiled call instead of the
Python loop below, with the same bits (rest_lsp/model/decode_layer.py).

Every kind computes the same model at the same precision; greedy tree speculation with any of them emits
exactly what plain decoding with that same verifier emits (tests/model/test_fast.py). Attention runs in the
model's dtype where the CPU's attention is row-invariant (rest_lsp/model/probes.py sdpa_row_invariant), else
through a compiled kernel exact by construction (rest_lsp/model/attention.py), or in float64 where that does not
build or beside torch.compile's buckets; a prompt chunk (`forward(..., prompt=True)`: rows that no tree row is
compared with) always attends in the model's dtype, which on such a CPU costs 0.65x float64's for a 64-token
chunk after 1,000 cached tokens (docs/cpu.md).
"""
from __future__ import annotations

import os
import time
from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F

from rest_lsp.engine.verifier import Interrupted, SlotCache

from .attention import tree_attention
from .decode_layer import MAX_ROWS, decode_layers
from .int8row import Int8RowLinear
from .int4weight import WEIGHT_ONLY, fuse_weight_only
from .ops import (MLP_GATED, UnsupportedModel, attention_window, mlp_act, mlp_names, norm, norm_params, pad_rows,
                  rope)
from .probes import NO_BF16, attend, bf16_packing_available, packing_available, sdpa_row_invariant
from .screened import ScreenedHead
from .support import QUANTIZED, check_supported

COMPILE_BUCKETS = (1, 2, 4, 8, 16)
# oneDNN's packed fp32/bf16 products with 1 or 2 rows take a slower (gemv-like) path than 3..6 rows on the
# development machine (e.g. 9728x896: 3.8 ms for 1 row, 2.8 ms for 4; the 151,936-row head 56 vs 46 ms):
# products with fewer rows are padded with zero rows to this many (docs/cpu.md)
MIN_ROWS = 4


class Dense(torch.nn.Module):
    """y = x @ w.T + b over a weight reordered once into oneDNN's blocked layout (packed=True), or plain
    (packed=False: what torch.compile sees, so that inductor's freezing does its own prepacking)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, packed: bool, min_rows: int = 1):
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.packed = packed
        self.min_rows = min_rows
        w = weight.detach().contiguous()
        if packed:
            # the batch-size hint only tunes the reorder; the packed weight serves every M
            w = torch.ops.mkldnn._reorder_linear_weight(w, 8)
        self.register_buffer("weight", w, persistent=False)
        self.register_buffer("bias", None if bias is None else bias.detach().contiguous(), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x [M, in] -> [M, out]
        if self.packed:
            m = x.shape[0]
            y = torch.ops.mkldnn._linear_pointwise(pad_rows(x, self.min_rows), self.weight, self.bias, "none", [], "")
            return y[:m]
        return F.linear(x, self.weight, self.bias)


def _cat_bias(*mods) -> torch.Tensor | None:
    biases = [m.bias for m in mods]
    if all(b is None for b in biases):
        return None
    return torch.cat([b if b is not None else torch.zeros(m.out_features, dtype=m.weight.dtype)
                      for b, m in zip(biases, mods)])


def _weight_only(packed: bool, min_rows: int, *mods: torch.nn.Module) -> torch.nn.Module:
    """The layers' weight-only products fused (int8w, int4w), and their float layers (prompt chunks) fused into
    one packed Dense."""
    wides = [m.wide for m in mods]
    wide = None if any(w is None for w in wides) else \
        Dense(torch.cat([w.weight for w in wides]), _cat_bias(*wides), packed, min_rows)
    return fuse_weight_only(*mods, wide=wide)


class Norm(torch.nn.Module):
    """A transformers norm's weights, detached (`ops.norm_params`), applied as transformers applies them."""

    def __init__(self, hf_norm: torch.nn.Module):
        super().__init__()
        self.layer, weight, bias, self.eps = norm_params(hf_norm)
        self.weight = weight.detach()
        self.bias = bias.detach() if bias is not None else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., D] -> [..., D]
        return norm(x, self.layer, self.weight, self.bias, self.eps)


class Layer(torch.nn.Module):
    """One decoder layer's weights: fused q/k/v, the output projection, the MLP's input (gate and up fused for
    a gated MLP; StarCoder2's c_fc) and output projections, the norms, and the model's own activation."""

    def __init__(self, hf_layer: Any, packed: bool, min_rows: int):
        super().__init__()
        a, m = hf_layer.self_attn, hf_layer.mlp
        self.in_norm, self.post_norm = Norm(hf_layer.input_layernorm), Norm(hf_layer.post_attention_layernorm)
        # Qwen3: per-head RMSNorm of the queries and keys (None elsewhere)
        self.q_norm = Norm(a.q_norm) if hasattr(a, "q_norm") else None
        self.k_norm = Norm(a.k_norm) if hasattr(a, "k_norm") else None
        names = mlp_names(m)
        self.gated = names == MLP_GATED  # act(gate) * up (Llama, Qwen, Mistral), or act(c_fc) (StarCoder2)
        self.act = mlp_act(m)
        mlp_in, mlp_out = tuple(getattr(m, n) for n in names[:-1]), getattr(m, names[-1])
        if isinstance(a.q_proj, Int8RowLinear):
            # int8: the model's own modules (no float weights to pack); int8 products need no row padding
            self.qkv: torch.nn.Module = Int8RowLinear.fuse(a.q_proj, a.k_proj, a.v_proj)
            self.o: torch.nn.Module = a.o_proj
            self.mlp_in: torch.nn.Module = Int8RowLinear.fuse(*mlp_in) if self.gated else mlp_in[0]
            self.down: torch.nn.Module = mlp_out
            return
        if isinstance(a.q_proj, WEIGHT_ONLY):
            # int8/int4 weights for verification, their float layers packed for prompt chunks
            self.qkv = _weight_only(packed, min_rows, a.q_proj, a.k_proj, a.v_proj)
            self.o = _weight_only(packed, min_rows, a.o_proj)
            self.mlp_in = _weight_only(packed, min_rows, *mlp_in)
            self.down = _weight_only(packed, min_rows, mlp_out)
            return
        self.qkv = Dense(torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]),
                         _cat_bias(a.q_proj, a.k_proj, a.v_proj), packed, min_rows)
        self.o = Dense(a.o_proj.weight, a.o_proj.bias, packed, min_rows)
        self.mlp_in = Dense(torch.cat([p.weight for p in mlp_in]), _cat_bias(*mlp_in), packed, min_rows)
        self.down = Dense(mlp_out.weight, mlp_out.bias, packed, min_rows)

    def mlp(self, x: torch.Tensor) -> torch.Tensor:  # x [q, D] (normalised) -> [q, D]
        h = self.mlp_in(x)  # [q, 2 I] gated, [q, I] otherwise
        if self.gated:
            gate, up = h.chunk(2, dim=-1)
            return self.down(self.act(gate) * up)
        return self.down(self.act(h))


class StaticLM(torch.nn.Module):
    """A gpt-fast-style forward of a Qwen2/Qwen3/Llama/Mistral/StarCoder2 causal LM over a preallocated KV cache.

    Cache [layers, 2 (k, v), kv_heads, max_len, head_dim], passed in (a graph input when compiled). A forward writes its q entries at slots
    `start .. start+q-1` and attends over the first `span` slots under `mask` [q, span]; the eager path
    passes span = start + q, the compiled path span = max_len (static shapes, masked)."""

    def __init__(self, model: Any, max_len: int, packed: bool, screen: bool = False, min_rows: int = 1,
                 kernel_attention: bool = True):
        super().__init__()
        cfg = model.config
        self.n_heads = cfg.num_attention_heads
        self.n_kv = getattr(cfg, "num_key_value_heads", None) or self.n_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.n_heads
        self.max_len = max_len
        self.dtype = model.model.embed_tokens.weight.dtype
        self.attention_dtype = None if sdpa_row_invariant() else torch.float64  # exact tree rows
        # ... by the compiled kernel rather than float64 where it builds (attention.py); not beside torch.compile's
        # buckets, which attend in float64 (their rows and the eager path's must round alike)
        use_kernel = self.attention_dtype is not None and kernel_attention
        heads = (self.n_heads, self.n_kv, self.head_dim)
        self.tree_attention = tree_attention(self.dtype, heads) if use_kernel else None
        if self.tree_attention is not None:
            self.kernel_tag = f"attention-{self.tree_attention.tag}"  # a c(q) measured with float64 is not reused
        self.embed = model.model.embed_tokens.weight.detach()  # shared with the HF model, no copy
        self.layers = torch.nn.ModuleList(Layer(l, packed, min_rows) for l in model.model.layers)
        self.norm = Norm(model.model.norm)
        head = model.get_output_embeddings()
        if isinstance(head, QUANTIZED):
            self.head: torch.nn.Module = head  # exact logits at int8 precision
        elif screen and getattr(head, "bias", None) is None and head.weight.dtype == torch.float32:
            self.head: torch.nn.Module = ScreenedHead(head.weight, min_rows)
        else:
            self.head = Dense(head.weight, getattr(head, "bias", None), packed, min_rows)
        self.vocab_size = head.out_features
        # int4w's layers in one compiled call each for the rows of a step or a tree (None: the Python loop below)
        self.decode_layers = decode_layers(self.layers, heads, self.tree_attention)
        # rotary tables from the model's own rotary module: covers rope scaling variants and attention_scaling
        with torch.no_grad():
            pos = torch.arange(max_len)[None]
            cos, sin = model.model.rotary_emb(self.embed[:1][None], pos)
        self.register_buffer("cos", cos[0].to(self.dtype), persistent=False)  # [max_len, hd]
        self.register_buffer("sin", sin[0].to(self.dtype), persistent=False)

    def new_cache(self) -> torch.Tensor:
        return torch.zeros(len(self.layers), 2, self.n_kv, self.max_len, self.head_dim, dtype=self.dtype)

    def hidden(self, tokens: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor, mask: torch.Tensor,
               cache: torch.Tensor, exact_rows: bool = True,
               interrupt: Callable[[], bool] | None = None) -> torch.Tensor:
        """tokens/positions/slots [q]; mask [q, span] bool (True = attend); cache [L, 2, nkv, max_len, hd],
        written at `slots` -> final hidden states [q, D]. exact_rows=False (a prompt chunk): attention in the
        model's dtype even where it is not row-invariant. `interrupt` is polled before each layer: True raises
        Interrupted (what was written at `slots` lies beyond the cache's length, never attended)."""
        q, span = mask.shape
        attention_dtype = self.attention_dtype if exact_rows else None
        nh, nkv, hd = self.n_heads, self.n_kv, self.head_dim
        x = F.embedding(tokens, self.embed)  # [q, D]
        cos, sin = self.cos[positions], self.sin[positions]  # [q, hd]
        if self.decode_layers is not None and attention_dtype is not None and q <= MAX_ROWS:
            for i, layer in enumerate(self.decode_layers):
                if interrupt is not None and interrupt():
                    raise Interrupted(f"stopped before layer {i}")
                x = layer.step(x, cos, sin, cache, i, slots, mask)
            return self.norm(x)
        for i, layer in enumerate(self.layers):
            if interrupt is not None and interrupt():
                raise Interrupted(f"stopped before layer {i}")
            qkv = layer.qkv(layer.in_norm(x))  # [q, (nh + 2 nkv) hd]
            qh = qkv[:, : nh * hd].view(q, nh, hd)  # [q, nh, hd]
            kh = qkv[:, nh * hd : (nh + nkv) * hd].view(q, nkv, hd)  # [q, nkv, hd]
            vh = qkv[:, (nh + nkv) * hd :].view(q, nkv, hd).transpose(0, 1)  # [nkv, q, hd]
            if layer.q_norm is not None:
                qh, kh = layer.q_norm(qh), layer.k_norm(kh)
            qh, kh = rope(qh.transpose(0, 1), cos, sin), rope(kh.transpose(0, 1), cos, sin)
            kv = cache[i]  # [2, nkv, max_len, hd]
            kv[0].index_copy_(1, slots, kh)
            kv[1].index_copy_(1, slots, vh)
            if attention_dtype is not None and self.tree_attention is not None:
                att = self.tree_attention(qh, kv[0, :, :span], kv[1, :, :span], mask)  # [nh, q, hd]
            else:
                att = attend(qh, kv[0, :, :span], kv[1, :, :span], mask, attention_dtype)
            x = x + layer.o(att.transpose(0, 1).reshape(q, nh * hd))
            x = x + layer.mlp(layer.post_norm(x))
        return self.norm(x)

    def forward(self, tokens, positions, slots, mask, cache) -> torch.Tensor:
        return self.head(self.hidden(tokens, positions, slots, mask, cache)).float()  # [q, V]


class FastVerifier(SlotCache):
    """The `Verifier` protocol over `StaticLM`: packed eager forward, or compiled per q bucket.

    forward(tokens [q], depths [q], tree_mask [q, q]) -> logits [q, V] float32, appending q cache entries;
    keep(indices) keeps the accepted path; truncate(n) drops the cache beyond n. `rows=` (optional) limits
    the logits to some rows (e.g. the last row of a prefill), which skips most of the output projection."""

    def __init__(self, model: Any, *, max_len: int = 4096, screen: bool = False, compiled: bool = False,
                 buckets: Sequence[int] = COMPILE_BUCKETS, mode: str = "max-autotune", min_rows: int = MIN_ROWS):
        check_supported(model, "fast")
        if not packing_available():
            raise UnsupportedModel("fast verifier: this torch build has no oneDNN (mkldnn) linear prepacking")
        max_pos = getattr(model.config, "max_position_embeddings", None)
        if max_pos:
            max_len = min(max_len, int(max_pos))
        window = attention_window(model.config)
        if window:
            max_len = min(max_len, window)  # within the window a sliding window is full attention
        self.max_len = max_len
        self.max_positions = max_pos
        if screen and compiled:
            raise ValueError("fast verifier: the screened head runs on the packed eager path, not compiled")
        if screen and not bf16_packing_available():
            raise UnsupportedModel(f"fast verifier: the screened head's bf16 copy and product {NO_BF16}")
        if compiled and any(isinstance(m, QUANTIZED) for m in model.modules()):
            raise UnsupportedModel("fast verifier: int8 models run the packed eager path, not compiled")
        self.lm = StaticLM(model, max_len, packed=True, screen=screen, min_rows=min_rows,
                           kernel_attention=not compiled).eval()
        # False: only argmax(-1) and the values of tokens that could win are exact (see ScreenedHead)
        self.exact_logits = not isinstance(self.lm.head, ScreenedHead)
        self.kind = "compiled" if compiled else ("packed" if self.exact_logits else "screened")
        self.cache = self.lm.new_cache()
        self._last_hidden: torch.Tensor | None = None
        self._last_logits: torch.Tensor | None = None
        self.vocab_size = self.lm.vocab_size
        self.device = torch.device("cpu")
        self.dtype = self.lm.dtype
        self.past_len = 0
        self._last_q = 0
        self.compiled = compiled
        self.interrupt: Callable[[], bool] | None = None  # polled between layers (engine/verifier.py Interrupted)
        self.buckets = tuple(sorted(buckets)) if compiled else ()
        self.compile_seconds: dict[int, float] = {}
        self._compiled_fns: dict[int, Any] = {}
        if compiled:
            self._compiled_lm = StaticLM(model, max_len, packed=False, kernel_attention=False).eval()
            self._compile_mode = mode

    # ------------------------------------------------------------------ protocol
    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor, depths: torch.Tensor, tree_mask: torch.Tensor, *,
                rows: Sequence[int] | None = None, prompt: bool = False) -> torch.Tensor:
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
        if bucket is not None and rows is None and past + bucket <= self.max_len:
            logits = self._compiled_forward(bucket, tokens, positions, tree_mask.to(torch.bool))
            self._last_hidden = None  # the compiled forward's head is exact (not screened)
        else:
            slots = torch.arange(past, past + q)
            mask = torch.ones(q, past + q, dtype=torch.bool)
            mask[:, past:] = tree_mask
            h = self.lm.hidden(tokens, positions, slots, mask, self.cache, exact_rows=not prompt,
                               interrupt=self.interrupt)  # [q, D]
            if rows is not None:
                h = h[torch.as_tensor(list(rows), dtype=torch.long)]
            if self.interrupt is not None and self.interrupt():  # the head costs a few layers (151,936 rows)
                raise Interrupted("stopped before the output projection")
            logits = self.lm.head(h).float()
            self._last_hidden = h
        self.past_len = past + q
        self._last_q = q
        self._last_logits = logits
        return logits

    def release_model_copies(self, model: Any) -> int:
        """Empty the tensors of `model` (the transformers model this verifier was built from) that the verifier
        holds its own copies of: the float weights its oneDNN-packed layers reordered, the parts of fused
        quantized products. The process then keeps one copy of each weight (a daemon's anonymous memory, the
        embedded 0.5B in bf16: 2.73 -> 1.69 GiB; the 1.5B at int4w: 7.60 -> 4.83, docs/results/memory.md). Whatever the
        verifier still reads (embeddings, a tied or quantized head, biases, unfused buffers) is kept. The model's
        own forward cannot run afterwards, and make_verifier refuses it: the daemon calls this once its verifier
        is final. -> bytes freed."""
        if self.compiled:
            raise ValueError("release_model_copies: the compiled path's layers read the model's own tensors")
        # every tensor the verifier's modules hold: parameters, buffers and plain attributes (Norm's, the embeddings)
        held = [t for m in self.lm.modules()
                for t in (*m.parameters(recurse=False), *m.buffers(recurse=False), *vars(m).values())
                if isinstance(t, torch.Tensor)]
        kept = {t.untyped_storage().data_ptr() for t in held if t.layout == torch.strided}  # oneDNN's packed: ours
        head = model.get_output_embeddings()
        freed: dict[int, int] = {}
        for mod in (*model.model.layers.modules(), *head.modules()):
            for name, t in (*mod.named_parameters(recurse=False), *mod.named_buffers(recurse=False)):
                ptr = t.untyped_storage().data_ptr()
                if t.numel() == 0 or ptr in kept:
                    continue
                freed[ptr] = t.untyped_storage().nbytes()
                empty = torch.empty(0, dtype=t.dtype)
                setattr(mod, name, torch.nn.Parameter(empty, requires_grad=False)
                        if isinstance(t, torch.nn.Parameter) else empty)
        model.rest_released = True
        return sum(freed.values())

    def row_scorer(self, row: int):
        head = self.lm.head
        if isinstance(head, ScreenedHead) and self._last_hidden is not None:
            # the screened values are bf16 approximations off the argmax: recompute these exactly, as the
            # screen does for its candidates
            x = self._last_hidden[row].float()[None].clone()  # [1, D]
            return lambda ids: (x * head.weight[ids]).sum(-1)
        logits = self._last_logits[row].clone()  # a copy, not a view of the whole [q, V] (see Verifier)
        return lambda ids: logits[ids]

    # ------------------------------------------------------------------ compiled buckets
    def _compiled_forward(self, bucket: int, tokens, positions, tree_mask, cache=None) -> torch.Tensor:
        """Pad q to the bucket. Padded rows write to slots past+q .. past+bucket-1 (beyond the new past_len,
        so never attended and later overwritten), see only themselves, and their logits are dropped."""
        q, past = tokens.shape[0], self.past_len
        fn = self._compiled_fns.get(bucket)
        first = fn is None
        if first:
            fn = self._compile(bucket)
            t = time.perf_counter()
        tok = torch.zeros(bucket, dtype=torch.long)
        tok[:q] = tokens
        pos = torch.zeros(bucket, dtype=torch.long)
        pos[:q] = positions
        slots = torch.arange(past, past + bucket)
        mask = torch.zeros(bucket, self.max_len, dtype=torch.bool)  # static shape: the whole cache, masked
        mask[:q, :past] = True
        mask[:q, past : past + q] = tree_mask
        mask[torch.arange(q, bucket), slots[q:]] = True  # a row that sees nothing would give NaN
        logits = fn(tok, pos, slots, mask, self.cache if cache is None else cache)[:q]
        if first:
            self.compile_seconds[bucket] = time.perf_counter() - t  # tracing, codegen, autotuning, 1st run
        return logits

    def _compile(self, bucket: int):
        import torch._inductor.config as inductor_config
        from torch._inductor.runtime.cache_dir_utils import default_cache_dir

        # keep compiled graphs with rest-lsp's other caches (inductor writes its /tmp default into the
        # environment on first use, so that value counts as unset; a user's own choice is kept)
        current = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
        if current is None or os.path.abspath(current) == os.path.abspath(default_cache_dir()):
            from restbase.storage import cache_root

            os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache_root() / "inductor")
        # freezing: weights become constants that inductor prepacks (and, with max-autotune, feeds to its
        # CPU GEMM templates); the FX graph cache keeps compiled graphs on disk for the next process
        inductor_config.freezing = True
        inductor_config.fx_graph_cache = True
        fn = torch.compile(self._compiled_lm, mode=self._compile_mode, fullgraph=True, dynamic=False)
        self._compiled_fns[bucket] = fn
        return fn

    def warm_up(self) -> dict[int, float]:
        """Compile every bucket now rather than on first use (on a scratch cache: the live cache is kept);
        returns the seconds each bucket took."""
        if not self.compiled:
            return {}
        scratch = self.lm.new_cache()
        saved = self.past_len
        self.past_len = 0
        try:
            with torch.inference_mode():
                for b in self.buckets:
                    if b not in self._compiled_fns:
                        self._compiled_forward(b, torch.zeros(b, dtype=torch.long), torch.arange(b),
                                               torch.ones(b, b, dtype=torch.bool).tril_(), cache=scratch)
        finally:
            self.past_len = saved
        return dict(self.compile_seconds)
