"""Weight-only int8 linear layers with bf16 products: what `precision: int8w` runs on the CPU.

    Int8WeightLinear.from_linear(linear) -> Int8WeightLinear      (or .from_weight(weight [N, K], bias [N]))
    Int8WeightLinear.fuse(a, b, ...) -> one module whose output is [a(x), b(x), ...] concatenated
    quantize_weights(model) -> the same model, its decoder's nn.Linear layers and LM head replaced
    weight_int8_exact() -> bool: the kernel gives a row the same bits alone and in any batch (checked once)

Why: a CPU verifier streams every weight from memory once per forward, so a step costs about the weights'
bytes; fp32 is 4 bytes per weight, int8 one. Per-row W8A8 (int8row.py) also quantizes the activations and
loses quality on models with outlier channels (docs/cpu.md); here only the weights are int8 (symmetric, one
scale per output channel), the activations enter the product in bf16 and everything else (embeddings, norms,
attention, the residual stream) stays fp32. The product is torch's `_weight_int8pack_mm` (the kernel
gpt-fast's int8 mode uses on a CPU): each output element is one dot product over K whose order does not depend
on how many rows or which other columns share the call, so a row's output is bit-identical alone or inside a
draft tree's batch and REST over this model emits what its plain greedy decoding emits. `weight_int8_exact()`
checks that on this CPU once per process (rows 1..FLOAT_ROWS, column blocks, fused layers); `int8w` is refused
where it fails.

Prompt chunks take the float weights: the kernel passes over the weights once per few rows, so a 256-row chunk
costs 2.2x fp32's product (the model's linear layers, plain products, 2 threads, AVX-512 Xeon: 2,129 against 952
ms; 1 row 35 against 79 ms, 8 rows 99 against 168; docs/cpu.md has the verifier's own figures). Quantizing keeps
each layer's float module (`wide`), and a call of more than FLOAT_ROWS rows goes to it: the prompt is encoded at
full precision and as fast as before, and every verification (a draft tree has at most max_draft_nodes + 1 = 65
rows) and every plain decoding step runs the int8 product, so trees and single rows still round alike. The float
weights cost their memory as before.

The channel scale is rounded to bf16 before the weights are divided by it, so the product's bf16 scale is the
scale the weights were quantized with (rounding it afterwards would skew every channel by up to 0.4%).
"""
from __future__ import annotations

import functools
from typing import Any

import torch

from .int8row import fused_bias, linear_slots

_QMAX = 127.0
# the kernel's vector loops read K in whole blocks: K = 200 crashed the process (torch 2.13, AVX-512), 208 and
# every multiple of 16 tried did not; real models' widths are multiples of 64 (896, 4864, 4096, 11008)
K_MULTIPLE = 64
# calls with more rows (prompt chunks) take the float weights. A draft tree has at most max_draft_nodes + 1 = 65
# rows (the engine's default, which the daemon keeps; an explicit budget is capped by it). From about 16 rows on
# the float product is the cheaper one (the embedded model's verifier after 300 cached tokens, AVX-512 Xeon:
# 64 rows 418 ms in int8w against 270 ms in fp32, 1 row 46 against 102)
FLOAT_ROWS = 65


def _kernel(x: torch.Tensor, qweight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x [M, K] bf16, qweight [N, K] int8, scale [N] bf16 -> [M, N] bf16."""
    return torch.ops.aten._weight_int8pack_mm(x, qweight, scale)


def quantize_channels(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """weight [N, K] float -> (int8 [N, K], bf16 scale [N]): each output channel from its largest magnitude,
    quantized with the scale as bf16 holds it."""
    w = weight.detach().float()
    scale = (w.abs().amax(dim=1).clamp(min=1e-12) / _QMAX).to(torch.bfloat16)
    q = torch.round(w / scale.float()[:, None]).clamp_(-_QMAX, _QMAX).to(torch.int8)
    return q, scale


class Int8WeightLinear(torch.nn.Module):
    """y = bf16(x) @ (Wq * s)^T (+ b): int8 weights per output channel, bf16 products, fp32 bias and output.

    Input any float dtype [..., K]; output [..., N] in the input's dtype."""

    MAX_ROWS = FLOAT_ROWS  # calls of more rows take `wide`; the engine's trees stay within it (exact)

    def __init__(self, qweight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None,
                 wide: torch.nn.Module | None = None):
        super().__init__()
        self.out_features, self.in_features = qweight.shape
        if self.in_features % K_MULTIPLE:
            raise ValueError(f"Int8WeightLinear: input width {self.in_features} is not a multiple of {K_MULTIPLE}")
        self.register_buffer("qweight", qweight.contiguous())  # [N, K] int8
        self.register_buffer("scale", scale.to(torch.bfloat16).contiguous())  # [N]
        self.register_buffer("bias", None if bias is None else bias.detach().float().contiguous())
        self.wide = wide  # the float layer for calls of more than FLOAT_ROWS rows (None: int8 for all)

    @classmethod
    def from_weight(cls, weight: torch.Tensor, bias: torch.Tensor | None = None) -> "Int8WeightLinear":
        q, s = quantize_channels(weight)
        return cls(q, s, bias)

    @classmethod
    def from_linear(cls, linear: torch.nn.Linear, keep_float: bool = True) -> "Int8WeightLinear":
        """`keep_float`: prompt chunks keep running `linear` itself."""
        q, s = quantize_channels(linear.weight)
        return cls(q, s, linear.bias, linear if keep_float else None)

    @classmethod
    def fuse(cls, *mods: "Int8WeightLinear", wide: torch.nn.Module | None = None) -> "Int8WeightLinear":
        """One product for several layers over the same input (q/k/v, gate/up): each output element is its
        own dot product, so the fused output equals the separate outputs concatenated (weight_int8_exact
        checks it on this CPU). `wide`: the fused float layer for prompt chunks (the caller's, packed)."""
        if len({m.in_features for m in mods}) != 1:
            raise ValueError("Int8WeightLinear.fuse: layers must share their input size")
        if len(mods) == 1:  # a layer of its own (o, down) with another float layer: share its int8 buffers
            return cls(mods[0].qweight, mods[0].scale, mods[0].bias, wide)
        return cls(torch.cat([m.qweight for m in mods]), torch.cat([m.scale for m in mods]), fused_bias(mods), wide)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x [..., K] -> [..., N]
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features)  # [M, K]
        if x2.shape[0] == 0:
            return x.new_zeros(*lead, self.out_features)
        if self.wide is not None and x2.shape[0] > self.MAX_ROWS:
            return self.wide(x2.to(self.wide.weight.dtype)).to(x.dtype).reshape(*lead, self.out_features)
        y = _kernel(x2.to(torch.bfloat16).contiguous(), self.qweight, self.scale).float()  # [M, N]
        if self.bias is not None:
            y.add_(self.bias)
        return y.to(x.dtype).reshape(*lead, self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def fused_rows_invariant(a: torch.nn.Module, b: torch.nn.Module, fused: torch.nn.Module, x: torch.Tensor) -> bool:
    """Whether `fused` (a and b in one product) gives each row of x [FLOAT_ROWS, K] the same bits alone and
    inside batches of 2..FLOAT_ROWS rows, and the whole batch the bits of a and b apart: the weight-only
    kernels' load-time check (weight_int8_exact, int4weight.weight_int4_exact)."""
    alone = torch.cat([fused(x[i:i + 1]) for i in range(FLOAT_ROWS)])
    for m in (2, 3, 4, 5, 7, 8, 9, 16, 17, 33, 40, FLOAT_ROWS - 1, FLOAT_ROWS):
        if not torch.equal(fused(x[:m]), alone[:m]):
            return False
    return torch.equal(fused(x), torch.cat([a(x), b(x)], dim=1))


@functools.cache
def weight_int8_exact() -> bool:
    """Whether the kernel exists here and gives every row the same bits alone and inside batches of
    2..FLOAT_ROWS rows (whose other rows differ by 1000x in magnitude), and a fused layer the same bits as its
    parts (checked once per process, at widths that leave partial column and row blocks)."""
    g = torch.Generator().manual_seed(0)
    try:
        a = Int8WeightLinear.from_weight(torch.randn(136, 256, generator=g))
        b = Int8WeightLinear.from_weight(torch.randn(37, 256, generator=g), torch.randn(37, generator=g))
        fused = Int8WeightLinear.fuse(a, b)
        x = torch.randn(FLOAT_ROWS, 256, generator=g) * torch.logspace(-1.5, 1.5, FLOAT_ROWS)[:, None]
        return fused_rows_invariant(a, b, fused, x)
    except (RuntimeError, AttributeError, NotImplementedError, ValueError):  # no such kernel on this build
        return False


@torch.no_grad()
def quantize_weights(model: Any) -> Any:
    """Replace, in place, the nn.Linear layers of a transformers causal LM's decoder and its LM head by
    Int8WeightLinear, each keeping its float layer for prompt chunks (a tied head gets its own int8 copy; the
    embeddings stay float)."""
    if not weight_int8_exact():
        raise RuntimeError("int8w: torch's _weight_int8pack_mm is unavailable or not batch-invariant on this CPU")
    for parent, name in list(linear_slots(model, head=True)):
        setattr(parent, name, Int8WeightLinear.from_linear(getattr(parent, name)))
    return model
