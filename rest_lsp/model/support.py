"""Which models each of rest-lsp's own verifiers runs: one `check_supported(model, verifier)` for both.

                 architecture         device  weights                   projections (q/k/v/o, MLP)
    fast         SUPPORTED_ARCHS      CPU     fp32, bf16 where oneDNN   nn.Linear or rest-lsp's int8/int4 modules
                 (rest_lsp/model/             packs it (probes), int8,  (int8row, int8weight, int4weight), the
                 ops.py)                      int4                      LM head too
    static       SUPPORTED_ARCHS      any     fp32, bf16, fp16          nn.Linear

Both: norms RMSNorm (Llama-style) or LayerNorm (what ops.norm_params reads), and a per-head norm of the queries
and of the keys together or neither (Qwen3). The verifiers' constructors call it (rest_lsp/model/fast.py,
static.py); rest_lsp/model/verifiers.py decides from its UnsupportedModel which verifier runs a model.
"""
from __future__ import annotations

from typing import Any

import torch

from .int4weight import WEIGHT_ONLY
from .int8row import Int8RowLinear
from .ops import SUPPORTED_ARCHS, UnsupportedModel, mlp_names
from .probes import NO_BF16, bf16_packing_available

VERIFIERS = ("fast", "static")
QUANTIZED = (Int8RowLinear, *WEIGHT_ONLY)  # quantized linear layers the fast verifier runs as they are
ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")


def check_supported(model: Any, verifier: str) -> None:
    """Raises UnsupportedModel (the message says why, naming the verifier) where `verifier` ("fast" or
    "static") cannot run this transformers causal LM."""
    if verifier not in VERIFIERS:
        raise ValueError(f"check_supported: verifier must be one of {VERIFIERS}, got {verifier!r}")
    fast = verifier == "fast"
    who = f"{verifier} verifier"
    arch = getattr(model.config, "model_type", None)
    if arch not in SUPPORTED_ARCHS:
        raise UnsupportedModel(f"{who}: architecture {arch!r} not supported (only {SUPPORTED_ARCHS})")
    params = list(model.parameters())
    if fast and (not params or any(p.device.type != "cpu" for p in params)):
        raise UnsupportedModel(f"{who}: CPU models only")
    dtypes = (torch.float32, torch.bfloat16) if fast else (torch.float32, torch.bfloat16, torch.float16)
    if not params or any(p.dtype not in dtypes for p in params):
        raise UnsupportedModel(f"{who}: fp32, bf16, int8 or int4 (rest-lsp's own modules) weights only" if fast
                               else f"{who}: float weights only")
    if fast and any(p.dtype == torch.bfloat16 for p in params) and not bf16_packing_available():
        raise UnsupportedModel(f"{who}: bf16 weights {NO_BF16}")
    layer = model.model.layers[0]
    attn, mlp = layer.self_attn, layer.mlp
    if not all(hasattr(attn, n) for n in ATTENTION):
        raise UnsupportedModel(f"{who}: attention without q/k/v/o projections")
    norms = [model.model.norm, layer.input_layernorm, layer.post_attention_layernorm]
    if not all(isinstance(n, torch.nn.LayerNorm) or hasattr(n, "variance_epsilon") for n in norms):
        raise UnsupportedModel(f"{who}: norms must be RMSNorm (Llama-style) or LayerNorm")
    linears = [getattr(attn, n) for n in ATTENTION] + [getattr(mlp, n, None) for n in mlp_names(mlp)]
    if fast:
        linears.append(model.get_output_embeddings())  # packed (or screened) here, not called as the model's
    if not all(isinstance(m, (torch.nn.Linear, *QUANTIZED) if fast else torch.nn.Linear) for m in linears):
        raise UnsupportedModel(f"{who}: every projection must be a float nn.Linear or an int8 module (torch's "
                               "quantize_dynamic int8 modules are not supported)" if fast
                               else f"{who}: every projection must be an nn.Linear")
    if hasattr(attn, "q_norm") != hasattr(attn, "k_norm"):
        raise UnsupportedModel(f"{who}: a per-head norm of the queries or of the keys alone")
