"""A decoder layer's step of up to 16 rows in one compiled call (kernels/decode_layer.cpp, built into gguf_amx's
module), where every product of the layer is a GGUF block product: int4w on a CPU that runs gguf_amx's kernel.

    decode_layers(layers, heads, attention) -> [DecodeLayer] or None where a layer does not qualify
    DecodeLayer.step(x [q, D], cos [q, hd], sin [q, hd], cache [L, 2, nkv, max_len, hd], i, slots [q],
                     mask [q, span]) -> the layer's output [q, D], layer i's keys and values written at `slots`

Why: with the products at the memory's rate, the packed verifier's Python loop around them was what kept the 1.5B's
decoding step from llama.cpp's: per layer about 60 torch calls (two norms, the rotary embedding of q and k, the
cache writes, the attention call's checks and copies, the residuals, the MLP's activation), 10.7 of a 41 ms step
on the 2-core Zen4 EPYC (docs/cpu.md). Here a layer is one call: the norms and the MLP's SiLU stay torch's own
(at::rms_norm, at::silu: the same kernels, the same bits), the products are gguf_amx's, the tree attention is
attention.cpp's kernel (its address), and the rest (bias, rotary, cache writes, layouts, residuals) are loops.

Exact as the Python loop it replaces: the same operations in the same order (the rotary embedding's two products
rounded before their sum, as torch's three calls round them, no fused multiply-add), so a row gets the same bits
either way, alone or in a tree (tests/model/test_decode_layer.py compares the two paths' logits bit for bit). Calls
of more than 16 rows (prompt chunks: the float layers) and prompt rows (attention in the model's dtype) keep the
Python loop.
"""
from __future__ import annotations

from typing import Any, Sequence

import torch

from . import gguf_amx
from .int4weight import Int4WeightLinear, Parts

MAX_ROWS = Int4WeightLinear.MAX_ROWS  # more rows take the float layers (prompt chunks)


def _gguf_parts(module: torch.nn.Module) -> list[Int4WeightLinear] | None:
    """A layer's product module as its GGUF block products, or None where one part is not one (int8w, torch's
    int4 kernel)."""
    parts = list(module.parts) if isinstance(module, Parts) else [module]
    return parts if all(isinstance(p, Int4WeightLinear) and p.amx for p in parts) else None


def _product(parts: list[Int4WeightLinear], kernel: Any) -> Any:
    """The compiled GgufLinear of `_gguf_parts`: the parts' outputs side by side."""
    codes = [gguf_amx.format_code(p.blocks) for p in parts]
    return kernel.GgufLinear([kind for kind, _ in codes], [tensors for _, tensors in codes],
                             [p.bias if p.bias is not None else torch.empty(0) for p in parts],
                             [p.out_features for p in parts])


def _qualifies(layer: Any) -> bool:
    norms = (layer.in_norm, layer.post_norm)
    return (layer.gated and layer.q_norm is None and type(layer.act).__name__ in ("SiLU", "SiLUActivation")
            and all(not n.layer and n.weight.dtype == torch.float32 for n in norms)
            and layer.in_norm.eps == layer.post_norm.eps)


def decode_layers(layers: Sequence[Any], heads: tuple[int, int, int], attention: Any) -> list[Any] | None:
    """Compiled steps for fast.py's `Layer`s (heads: query heads, key/value heads, head size; attention: the fp32
    TreeAttention, or None), or None unless every layer qualifies: RMSNorm, SiLU-gated MLP, no q/k norms, every
    product GGUF blocks. The layers are looked at first: another model never builds the kernel for this."""
    if attention is None or attention.dtype != torch.float32 or not all(map(_qualifies, layers)):
        return None
    parts = [[_gguf_parts(m) for m in (layer.qkv, layer.o, layer.mlp_in, layer.down)] for layer in layers]
    if any(p is None for products in parts for p in products):
        return None
    kernel = gguf_amx.kernel()  # built already: these products run on it
    if kernel is None or not hasattr(kernel, "DecodeLayer"):
        return None
    return [kernel.DecodeLayer(layer.in_norm.weight.contiguous(), layer.post_norm.weight.contiguous(),
                               float(layer.in_norm.eps), *(_product(p, kernel) for p in products), *heads,
                               attention.address)
            for layer, products in zip(layers, parts)]
