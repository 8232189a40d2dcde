"""Per-row W8A8 int8 linear layers: what `precision: int8` runs on the CPU.

    Int8RowLinear.from_linear(linear) -> Int8RowLinear      (or .from_weight(weight [N, K], bias [N]))
    Int8RowLinear.fuse(a, b, ...) -> one module whose output is [a(x), b(x), ...] concatenated
    quantize_model(model, head=None) -> the same model, its decoder's nn.Linear layers replaced
    int_mm_exact() -> bool: torch._int_mm gives exact int32 products on this CPU (checked once per process)
    onednn_exact() -> bool: so does oneDNN's prepacked u8 x s8 product (not on AVX2-only CPUs)

Why per row: torch's `quantize_dynamic` quantizes a call's activations with one scale for all its rows, so a
row's output depends on the other rows of a verification and draft-tree speculation would change what greedy
decoding emits (docs/cpu.md). Here every activation row is quantized with its own scale (symmetric, its
largest magnitude -> 127), weights once per output channel, the int8 x int8 product is accumulated exactly in
int32 (integer sums do not depend on blocking or order), converted to fp32 (round to nearest: a function of
the exact sum) and scaled by row scale x channel scale elementwise. Every step is a function of the row alone,
so a row's output is bit-identical alone or inside any batch: REST over this model emits exactly what plain
greedy decoding over it emits.

Two kernels compute the same exact product: oneDNN's prepacked u8 x s8 (`torch.ops.onednn.qlinear_pointwise`,
what inductor's x86 int8 lowering uses; activations shifted to uint8 with zero point 128, weight and output
scales 1 so it returns float(sum)) for 2+ rows and the LM head, and `torch._int_mm` (unpacked weight) for one
row of a decoder layer, where it is faster. Measured on the development CPU (2 threads, ms for 24 layers'
weights, cold in cache): gate/up 9728x896: 1 row 10.9 (_int_mm) / 10.8 (oneDNN), 8 rows 18.0 / 11.0;
down 896x4864: 1 row 3.6 / 5.8, 8 rows 7.8 / 6.3; the head 151936x896, 1 row 7.0 / 5.6 (padded to 4 rows),
8 rows 12.0 / 8.0. oneDNN's signed-int8 activation path is a slow reference kernel (2.3 s), hence uint8.
`int_mm_exact()` and `onednn_exact()` check once per process that each returns the exact sums: on an AVX2-only
CPU oneDNN's does not (vpmaddubsw saturates its int16 pair sums) and every product goes to torch._int_mm, still
exact (8 rows of 9728x896: 41 ms against fp32's 12 on a Zen3 EPYC, so there int8 is correct but slow); where
torch._int_mm is not exact either, `int8` is refused.

Exactness of the int32 sum: |sum| <= 255 * 127 * K (uint8 side) < 2^31 for K < 66,000 (checked).
"""
from __future__ import annotations

import functools
from typing import Any, Iterable

import torch

# the LM head is quantized too: its argmax is as batch-invariant as the decoder's outputs; on the development
# CPU the int8 head cost as much as the fp32 screened head for one row and less for 8-16 (c(16) 58.5 vs 69.9 ms),
# with the same first-line exact match (85 vs 86 of 240: the decoder, not the head, loses quality; docs/cpu.md)
QUANTIZE_HEAD = True
_QMAX = 127.0
_MAX_K = (2 ** 31 - 1) // (255 * 127)  # largest K whose int32 sum cannot overflow (uint8-shifted side)
# one row goes to torch._int_mm for layers up to this many outputs (faster there); the head and 2+ rows to oneDNN
INT_MM_MAX_OUT = 16384
MIN_ROWS = 4  # oneDNN's int8 product is faster for 4 rows than for 1 or 2 (as the float one: fast.MIN_ROWS)


def onednn_available() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.onednn, "qlinear_prepack") \
        and hasattr(torch.ops.onednn, "qlinear_pointwise")


def _onednn_mm(t: torch.Tensor, packed: torch.Tensor, ones: torch.Tensor, zeros: torch.Tensor) -> torch.Tensor:
    """t [M, K] fp32 holding integers in [-127, 127] x packed int8 weight -> fp32 [M, N] = float(exact sum)."""
    m = t.shape[0]
    if m < MIN_ROWS:
        t = torch.nn.functional.pad(t, (0, 0, 0, MIN_ROWS - m))
    u8 = (t + 128).to(torch.uint8)  # zero point 128: oneDNN subtracts it exactly in int32
    y = torch.ops.onednn.qlinear_pointwise(u8, 1.0, 128, packed, ones, zeros, None, 1.0, 0, torch.float32,
                                          "none", [], "")
    return y[:m]


def _round_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] float -> (fp32 [M, K] holding integers in [-127, 127], fp32 scale [M, 1]): elementwise per row."""
    xf = x.float()
    # an all-zero row gets a tiny scale: its int8 row is zero and so is its output
    scale = xf.abs().amax(dim=1, keepdim=True).clamp_(min=1e-12) / _QMAX
    return torch.round(xf / scale).clamp_(-_QMAX, _QMAX), scale


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] float -> (int8 [M, K], fp32 scale [M, 1]): each row from its own largest magnitude."""
    t, scale = _round_rows(x)
    return t.to(torch.int8), scale


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
        self._packed: torch.Tensor | None = None  # oneDNN's blocked copy, made on first use (not state)
        self._ones = torch.ones(self.out_features)
        self._zeros = torch.zeros(self.out_features, dtype=torch.long)

    def __deepcopy__(self, memo):  # the packed copy is an opaque oneDNN tensor: rebuilt on first use
        return Int8RowLinear(self.qweight.clone(), self.scale.clone(), None if self.bias is None else self.bias.clone())

    def _product(self, t: torch.Tensor) -> torch.Tensor:  # t [M, K] integral fp32 -> fp32 [M, N], the exact sums
        if not onednn_exact() or (t.shape[0] == 1 and self.out_features <= INT_MM_MAX_OUT):
            return torch._int_mm(t.to(torch.int8), self.qweight.t()).float()
        if self._packed is None:
            self._packed = torch.ops.onednn.qlinear_prepack(self.qweight, None)
        return _onednn_mm(t, self._packed, self._ones, self._zeros)

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
        return cls(torch.cat([m.qweight for m in mods]), torch.cat([m.scale for m in mods]), fused_bias(mods))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x [..., K] -> [..., N]
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features)  # [M, K]
        if x2.shape[0] == 0:
            return x.new_zeros(*lead, self.out_features)
        t, s = _round_rows(x2)
        y = self._product(t).mul_(s).mul_(self.scale)  # [M, N] fp32, elementwise per row (in place: fewer allocs)
        if self.bias is not None:
            y.add_(self.bias)
        return y.to(x.dtype).reshape(*lead, self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def fused_bias(mods) -> torch.Tensor | None:
    """The fp32 bias of int8 layers fused along their outputs (zeros for a layer without one; None if none has)."""
    if all(m.bias is None for m in mods):
        return None
    return torch.cat([m.bias if m.bias is not None else torch.zeros(m.out_features) for m in mods])


def _exact_sums(kernel) -> bool:
    """Whether kernel(a int8 [M, K]) returns float(a @ W^T) exactly for a fixed extreme W (sums past 2^24, where
    the conversion rounds), for 1 and several rows (a backend that saturated int16 intermediates would fail)."""
    g = torch.Generator().manual_seed(0)
    w = torch.randint(-127, 128, (96, 2000), dtype=torch.int8, generator=g)
    w[::2, :1500] = 127
    w[1::2, :1500] = -127
    try:
        k = kernel(w)
        for m in (1, 3, 8, 37):
            a = torch.randint(-127, 128, (m, 2000), dtype=torch.int8, generator=g)
            a[0] = 127
            a[-1, ::2] = -127
            if not torch.equal(k(a), (a.double() @ w.t().double()).float()):
                return False
        return True
    except (RuntimeError, AttributeError):  # no such int8 product on this build
        return False


@functools.cache
def int_mm_exact() -> bool:
    """torch._int_mm returns the exact sums here (checked once per process): int8 can run."""
    return _exact_sums(lambda w: (lambda a: torch._int_mm(a, w.t()).float()))


@functools.cache
def onednn_exact() -> bool:
    """oneDNN's prepacked u8 x s8 product returns the exact sums here (checked once per process). Not on an
    AVX2-only CPU (vpmaddubsw saturates its int16 pair sums): there every product goes to torch._int_mm, exact
    but several times slower for many rows (docs/cpu.md), so `precision: auto` does not pick int8 there."""
    def kernel(w):
        packed = torch.ops.onednn.qlinear_prepack(w, None)
        ones, zeros = torch.ones(w.shape[0]), torch.zeros(w.shape[0], dtype=torch.long)
        return lambda a: _onednn_mm(a.float(), packed, ones, zeros)

    return onednn_available() and _exact_sums(kernel)


def linear_slots(model: Any, head: bool) -> Iterable[tuple[torch.nn.Module, str]]:
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
def quantize_model(model: Any, head: bool | None = None) -> Any:
    """Replace, in place, the nn.Linear layers of a transformers causal LM's decoder (and its LM head where
    `head`, default QUANTIZE_HEAD) by Int8RowLinear. Embeddings and norms stay in the model's float dtype
    (activations: fp32 for `int8`)."""
    head = QUANTIZE_HEAD if head is None else head
    if not int_mm_exact():
        raise RuntimeError("int8: torch._int_mm is unavailable or not exact on this CPU/torch build")
    for parent, name in list(linear_slots(model, head)):
        lin = getattr(parent, name)
        setattr(parent, name, Int8RowLinear.from_linear(lin))
        del lin
    return model


def is_int8(model: Any) -> bool:
    return any(isinstance(m, Int8RowLinear) for m in model.modules())
