"""Per-row W8A8 int8 linear layers: what `precision: int8` runs on the CPU.

    Int8RowLinear.from_linear(linear) -> Int8RowLinear      (or .from_weight(weight [N, K], bias [N]))
    Int8RowLinear.fuse(a, b, ...) -> one module whose output is [a(x), b(x), ...] concatenated
    quantize_model(model, head=QUANTIZE_HEAD) -> the same model, its decoder's nn.Linear layers replaced
    int_mm_exact() -> bool: torch._int_mm gives exact int32 products on this CPU (checked once per process)

Why per row: torch's `quantize_dynamic` quantizes a call's activations with one scale for all its rows, so a
row's output depends on the other rows of a verification and draft-tree speculation would change what greedy
decoding emits (docs/cpu.md). Here every activation row is quantized with its own scale (symmetric, its
largest magnitude -> 127), weights once per output channel, the int8 x int8 product is accumulated exactly in
int32 (torch._int_mm; integer sums do not depend on blocking or order), then scaled by row scale x channel
scale elementwise. Every step is a function of the row alone, so a row's output is bit-identical alone or
inside any batch: REST over this model emits exactly what plain greedy decoding over it emits.

Exactness of the int32 product: |sum| <= 127 * 127 * K, below 2^31 for K < 133,000 (checked).
"""
from __future__ import annotations

from typing import Any, Iterable

import torch

# the LM head is quantized too: its argmax is as batch-invariant as the decoder's outputs, and on the
# development CPU an int8 head cost less than half the screened bf16 head for a decoding step with no change in
# first-line exact match (docs/cpu.md, "int8")
QUANTIZE_HEAD = True
_QMAX = 127.0
_MAX_K = (2 ** 31 - 1) // (127 * 127)  # largest K whose int32 sum cannot overflow
_EXACT: bool | None = None


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] float -> (int8 [M, K], fp32 scale [M, 1]): each row from its own largest magnitude."""
    xf = x.float()
    # an all-zero row gets a tiny scale: its int8 row is zero and so is its output
    scale = xf.abs().amax(dim=1, keepdim=True).clamp_(min=1e-12) / _QMAX
    return torch.round(xf / scale).clamp_(-_QMAX, _QMAX).to(torch.int8), scale


class Int8RowLinear(torch.nn.Module):
    """y = (q(x) @ Wq^T) * s_x * s_w (+ b): int8 weights per output channel, activations per row.

    Input any float dtype [..., K]; output [..., N] in the input's dtype (the scaling and bias are fp32)."""

    def __init__(self, qweight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        self.out_features, self.in_features = qweight.shape
        if self.in_features > _MAX_K:
            raise ValueError(f"Int8RowLinear: K={self.in_features} could overflow int32 accumulation")
        # [N, K] row-major, handed to _int_mm as its transposed view: faster than a [K, N] copy for 1 row
        # (oneDNN's int8 product: 0.09 vs 0.28 ms for 9728x896 on the development CPU) and as fast for more
        self.register_buffer("qweight", qweight.contiguous())
        self.register_buffer("scale", scale.float().contiguous())  # [N]
        self.register_buffer("bias", None if bias is None else bias.detach().float().contiguous())

    @classmethod
    def from_weight(cls, weight: torch.Tensor, bias: torch.Tensor | None = None) -> "Int8RowLinear":
        """weight [N, K] float -> per-output-channel symmetric int8."""
        q, s = quantize_rows(weight.detach())
        return cls(q, s[:, 0], bias)

    @classmethod
    def from_linear(cls, linear: torch.nn.Linear) -> "Int8RowLinear":
        return cls.from_weight(linear.weight, linear.bias)

    @classmethod
    def fuse(cls, *mods: "Int8RowLinear") -> "Int8RowLinear":
        """One product for several layers over the same input (q/k/v, gate/up). The same activation row
        quantizes to the same int8 row and scale whichever layer takes it, and channels are scaled one by one,
        so the fused output is bit-identical to the separate outputs concatenated."""
        if len({m.in_features for m in mods}) != 1:
            raise ValueError("Int8RowLinear.fuse: layers must share their input size")
        if any(m.bias is not None for m in mods):
            bias = torch.cat([m.bias if m.bias is not None else torch.zeros(m.out_features) for m in mods])
        else:
            bias = None
        return cls(torch.cat([m.qweight for m in mods]), torch.cat([m.scale for m in mods]), bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x [..., K] -> [..., N]
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features)  # [M, K]
        if x2.shape[0] == 0:
            return x.new_zeros(*lead, self.out_features)
        q, s = quantize_rows(x2)
        y = torch._int_mm(q, self.qweight.t()).float() * s * self.scale  # [M, N] fp32, elementwise per row
        if self.bias is not None:
            y = y + self.bias
        return y.to(x.dtype).reshape(*lead, self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def int_mm_exact() -> bool:
    """torch._int_mm equals the exact integer product here, at extreme values, for 1 and several rows and
    the weight layout Int8RowLinear uses (a backend that saturated int16 intermediates would fail)."""
    global _EXACT
    if _EXACT is None:
        try:
            g = torch.Generator().manual_seed(0)
            w = torch.randint(-127, 128, (96, 1000), dtype=torch.int8, generator=g)
            w[::2, :500] = 127
            w[1::2, :500] = -127
            ok = True
            for m in (1, 3, 8, 37):
                a = torch.randint(-127, 128, (m, 1000), dtype=torch.int8, generator=g)
                a[0] = 127
                a[-1, ::2] = -127
                ok = ok and torch.equal(torch._int_mm(a, w.t()).long(), a.long() @ w.t().long())
            _EXACT = bool(ok)
        except (RuntimeError, AttributeError):  # no int8 product on this build
            _EXACT = False
    return _EXACT


def _linears(model: Any, head: bool) -> Iterable[tuple[torch.nn.Module, str]]:
    """(parent, attribute) of every nn.Linear in the decoder layers, and of the LM head if `head`."""
    for parent in model.model.layers.modules():
        for name, child in parent.named_children():
            if type(child) is torch.nn.Linear:
                yield parent, name
    out = model.get_output_embeddings()
    if head and type(out) is torch.nn.Linear:
        for name, child in model.named_children():
            if child is out:
                yield model, name


@torch.no_grad()
def quantize_model(model: Any, head: bool = QUANTIZE_HEAD) -> Any:
    """Replace, in place, the nn.Linear layers of a transformers causal LM's decoder (and its LM head) by
    Int8RowLinear. Embeddings and norms stay in the model's float dtype (activations: fp32 for `int8`)."""
    if not int_mm_exact():
        raise RuntimeError("int8: torch._int_mm is unavailable or not exact on this CPU/torch build")
    for parent, name in list(_linears(model, head)):
        lin = getattr(parent, name)
        setattr(parent, name, Int8RowLinear.from_linear(lin))
        del lin
    return model


def is_int8(model: Any) -> bool:
    return any(isinstance(m, Int8RowLinear) for m in model.modules())
