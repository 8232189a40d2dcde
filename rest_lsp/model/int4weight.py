"""Weight-only linear layers built from a GGUF's own Q4_K (and, on AMX, Q6_K) blocks: `precision: int4w` on a CPU.

    q4k_groups(raw [N, K/256*144] uint8, K) -> (q [N, K] uint8 0..15, scale [N, K/32] fp32, low [N, K/32] fp32)
    Int4WeightLinear.from_q4k(raw, K, bias, wide) -> Int4WeightLinear
    BlockLinear(gguf_amx.pack_q6k(raw, K) or .pack_q32(raw, K, kind), bias, wide) -> Q6_K, Q5_0, Q8_0 (AMX only)
    fuse_weight_only(*mods, wide=None) -> one module whose output is [m(x) for m in mods] concatenated
    quantize_from_gguf(model, gguf_path) -> {"int4": n, "blocks": n, "int8": n}: the decoder's layers and head
    weight_int4_exact() -> bool: the kernel gives a row the same bits alone and in any batch (checked once)

Why: a CPU decoding step costs about the bytes of weights it streams. The embedded GGUFs hold their weights as
4-bit blocks (Q4_K_M: Q4_K for most layers, Q6_K for some), which the converted copy turns into fp32; int8w
(int8weight.py) streams a byte a weight, this path about 5/8 of one.

Two kernels, one per process (a row must round alike alone and in a tree, so they are never mixed):
- where the CPU has AMX, gguf_amx.py's compiled kernel: Q4_K and Q6_K blocks as they are (weight = d*sc*q -
  dmin*m, and d*sc*(q - 32)), one tile product per group of weights for up to 16 rows, so a draft tree costs
  little more than one row (the 1.5B after 300 cached tokens, 2-core Xeon with AMX: 67 ms for one row, 137 for
  16, against 84 and 219 with torch's products; docs/cpu.md);
- where it has AVX512-BF16 but no AMX (a Zen4 EPYC), the same source built for AVX-512 dot products (the same
  layouts, every layer its own blocks too; the 1.5B's step 67 -> 44-46 ms there);
- elsewhere torch's `_weight_int4pack_mm_for_cpu` (gpt-fast's int4 path), which computes w = (q - 8)*S + Z per
  group of 32: q is taken as it is, S = d*sc_j and Z = 8*S - dmin*m_j, rounded to bf16 once (the kernel takes S
  and Z in the activations' dtype, and only bf16 activations are fast: a 17,920 x 1,536 product, one row, 2-core
  Zen 5: 0.4-0.6 ms in bf16, 51 ms in fp32). Its cost grows with the rows faster than a float product's (1 row
  0.4-0.6 ms, 4 rows 1.0-1.1, 16 rows 3.9-5.6, 65 rows 16.4, against bf16's 1.9-2.9, 2.8-3.1, 3.3-3.4, 6.2-6.6).
A layer stored otherwise (Q5_0, Q8_0, Q6_K where neither build runs) becomes int8w from its dequantized weights, and
a layer whose blocks do not decode to the very weights the model holds (a tensor the converter permuted or
transposed) too: each tensor is checked against the converted model's weight before it is used. What this builds is
kept on disk (packed_cache.py) and read by later starts instead of the GGUF (the 0.5B's load on a 2-core Xeon with
AMX: 18.0 -> 3.5 s; docs/cpu.md).

Like int8w: each output element is one dot product whose order depends on neither the number of rows nor the
other columns in the call (`weight_int4_exact` checks it on this CPU), so a draft tree's row rounds as it does
alone and REST over this model emits what its plain greedy decoding emits. Calls of more than MAX_ROWS rows
(prompt chunks) take the float layer (`wide`, bf16 where the CPU multiplies it natively; none on the avx2 build
for the models INT4W_AVX2_QUALITY lists, whose prompts are cheaper on the kernel), and the engine keeps
draft trees within MAX_ROWS rows for a model that holds these layers (rest_lsp/engine/generate.py), so that
every verification and every decoding step runs the quantized product.
"""
from __future__ import annotations

import functools
import logging
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .int8row import fused_bias, linear_slots
from .int8weight import FLOAT_ROWS, Int8WeightLinear, fused_rows_invariant
from .gguf_amx import Q6Blocks, Q32Blocks, QBlocks, q4k_fields
from . import gguf_amx, packed_cache

log = logging.getLogger(__name__)

GROUP = 32  # weights per (scale, zero): a Q4_K sub-block
SUPER = 256  # weights per Q4_K super-block
Q4K_BYTES = 144  # d, dmin (fp16), 12 bytes of 6-bit scales and mins, 128 bytes of 4-bit values
INNER_K_TILES = 8  # the packing's K tiling (2, 4 or 8)
N_MULTIPLE = 16  # the packing takes output widths in multiples of 16 (torch 2.13) ...
N_BLOCK = 64  # ... and lays rows out in blocks of 64: packed layers concatenate exactly where each but the last
# fills whole blocks (144 + 48 rows did not, 128 + 48 and 192 + 64 did)


def q4k_groups(raw: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A Q4_K tensor's rows ([N, K/256*144] bytes) -> q [N, K] (0..15), scale [N, K/32] and low [N, K/32] (fp32)
    with weight = scale * q - low per group of 32 consecutive weights of a row.

    Worked example, one super-block: bytes 0-1 d = 0.5, 2-3 dmin = 0.25, scale byte 0 = 3 (group 0's sc, top
    bits 0), scale byte 4 = 2 (its m), value byte 0 = 0x7A -> weight 0 = 0.5*3*0xA - 0.25*2 = 14.5 and weight 32
    (group 1, the high nibble) = d*sc_1*7 - dmin*m_1."""
    return _groups(*q4k_fields(raw, k))


def _groups(q: np.ndarray, d: np.ndarray, dmin: np.ndarray, sc: np.ndarray, m: np.ndarray):
    """q4k_fields' parts -> q4k_groups' (q, scale, low)."""
    n = q.shape[0]
    scale = d[..., None] * sc.reshape(n, d.shape[1], -1).astype(np.float32)
    low = dmin[..., None] * m.reshape(n, d.shape[1], -1).astype(np.float32)
    return q, scale.reshape(n, -1), low.reshape(n, -1)


def dequantize(q: np.ndarray, scale: np.ndarray, low: np.ndarray) -> torch.Tensor:
    """The fp32 weights [N, K] the groups stand for (as gguf's own dequantization computes them)."""
    n, k = q.shape
    w = scale.reshape(n, -1, 1) * q.reshape(n, -1, GROUP).astype(np.float32) - low.reshape(n, -1, 1)
    return torch.from_numpy(w.reshape(n, k))


def _kernel(x: torch.Tensor, packed: torch.Tensor, scale_zeros: torch.Tensor) -> torch.Tensor:
    """x [M, K] bf16, packed [N, K/2] uint8, scale_zeros [K/32, N, 2] bf16 -> [M, N] bf16."""
    return torch.ops.aten._weight_int4pack_mm_for_cpu(x, packed, GROUP, scale_zeros)


def pack(q: np.ndarray, scale: np.ndarray, low: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """Groups -> (the kernel's packed weights [N, K/2] uint8, scale and zero [K/32, N, 2] bf16)."""
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(torch.from_numpy(q.astype(np.int32)), INNER_K_TILES)
    s = torch.from_numpy(scale)
    zero = 8 * s - torch.from_numpy(low)  # (q - 8) * S + Z = S q - low, computed from the exact S
    return packed, torch.stack([s.t(), zero.t()], dim=-1).to(torch.bfloat16).contiguous()


class Int4WeightLinear(torch.nn.Module):
    """y = bf16(x) @ W4^T (+ b): 4-bit weights in groups of 32, bf16 products, fp32 bias and output. Input any
    float dtype [..., K]; output [..., N] in the input's dtype. Two kernels, one per process and never mixed
    (a row must round alike alone and in a tree): gguf_amx.py's (`blocks` a QBlocks; `amx` true) where the CPU has
    AMX or AVX512-BF16, else torch's (`blocks` = (packed [N, K/2] uint8, scale_zeros [K/32, N, 2] bf16))."""

    MAX_ROWS = 16  # calls of more rows take `wide` (where torch's kernel's cost passes bf16's, above)

    def __init__(self, blocks: tuple[torch.Tensor, ...], bias: torch.Tensor | None,
                 wide: torch.nn.Module | None = None):
        super().__init__()
        self.amx = isinstance(blocks, (QBlocks, Q6Blocks, Q32Blocks))
        self._kind = type(blocks)
        self._format = getattr(blocks, "kind", None)  # Q5_0 or Q8_0 (Q32Blocks)
        # the AMX layouts know their width; torch's: packed [N, K/2], scale_zeros [K/32, N, 2]
        self.out_features = blocks[0].shape[0] * gguf_amx.COLUMNS if self.amx else blocks[0].shape[0]
        self.in_features = blocks.width if self.amx else blocks[1].shape[0] * GROUP
        fields = blocks._fields if self.amx else ("packed", "scale_zeros")
        self._names = tuple(n for n, t in zip(fields, blocks) if isinstance(t, torch.Tensor))
        for name in self._names:
            self.register_buffer(name, getattr(blocks, name) if self.amx else blocks[fields.index(name)])
        self.register_buffer("bias", None if bias is None else bias.detach().float().contiguous())
        self.wide = wide  # the float layer for calls of more than MAX_ROWS rows (None: int4 for all)
        self._product = None  # gguf_amx.product(self.blocks), bound at the first call

    def _apply(self, fn, recurse=True):  # .to() and the like replace the tensors the bound product holds
        self._product = None
        return super()._apply(fn, recurse)

    def _bound(self):
        if self._product is None:
            self._product = gguf_amx.product(self.blocks)
        return self._product

    @property
    def kernel_tag(self) -> str:  # for the cached c(q)'s key (engine/cost.py): which product, which source
        return f"int4w-{kernel_name()}" if self.amx else "int4w-torch"

    @property
    def blocks(self) -> tuple[torch.Tensor, ...]:
        parts = tuple(getattr(self, n) for n in self._names)
        if not self.amx:
            return parts
        return self._kind(*parts, self._format) if self._format else self._kind(*parts)

    @classmethod
    def from_q4k(cls, raw: np.ndarray, k: int, bias: torch.Tensor | None = None,
                 wide: torch.nn.Module | None = None) -> "Int4WeightLinear":
        if gguf_amx.kernel() is not None:
            return cls(gguf_amx.pack(raw, k), bias, wide)
        return cls(pack(*q4k_groups(raw, k)), bias, wide)

    @classmethod
    def fuse(cls, *mods: "Int4WeightLinear", wide: torch.nn.Module | None = None) -> "Int4WeightLinear":
        """One product for layers over the same input: each output column is its own dot product, so the
        fused output is the parts' outputs concatenated (weight_int4_exact checks it)."""
        if len({m.in_features for m in mods}) != 1 or len({(m._kind, m._format) for m in mods}) != 1:
            raise ValueError("Int4WeightLinear.fuse: layers must share their input size and kernel")
        if not mods[0].amx and any(m.out_features % N_BLOCK for m in mods[:-1]):
            raise ValueError(f"Int4WeightLinear.fuse: a layer before the last is not a whole number of {N_BLOCK} rows")
        if len(mods) == 1:
            return cls(mods[0].blocks, mods[0].bias, wide)
        if mods[0].amx:
            return cls(mods[0]._kind.cat(*(m.blocks for m in mods)), fused_bias(mods), wide)
        return cls((torch.cat([m.packed for m in mods]), torch.cat([m.scale_zeros for m in mods], dim=1)),
                   fused_bias(mods), wide)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x [..., K] -> [..., N]
        if self.amx and x.dim() == 2 and 0 < x.shape[0] <= self.MAX_ROWS:
            # a decoding step's or a tree's call, the common case, with as little around the product as can be
            y = self._bound()(x if x.is_contiguous() else x.contiguous())
            if self.bias is not None:
                y.add_(self.bias)
            return y if x.dtype == torch.float32 else y.to(x.dtype)
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features)
        if x2.shape[0] == 0:
            return x.new_zeros(*lead, self.out_features)
        if self.wide is not None and x2.shape[0] > self.MAX_ROWS:
            return self.wide(x2.to(self.wide.weight.dtype)).to(x.dtype).reshape(*lead, self.out_features)
        if self.amx:
            y = self._bound()(x2.contiguous())
        else:
            y = _kernel(x2.to(torch.bfloat16).contiguous(), self.packed, self.scale_zeros).float()
        if self.bias is not None:
            y.add_(self.bias)
        return y.to(x.dtype).reshape(*lead, self.out_features)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"kernel={gguf_amx.variant() if self.amx else 'torch'}")


class BlockLinear(Int4WeightLinear):
    """A GGUF layer stored as Q6_K (weight = d*sc*(q - 32), 16 weights a scale), Q5_0 (d*(q - 16), 32 a scale)
    or Q8_0 (d*q) as its own blocks on the AMX kernel (gguf_amx.py): 6.6, 5.5 and 8.5 bits a weight, and a
    tree's rows for about one row's cost (the 1.5B's LM head, 151,936 x 1,536, is Q6_K: at int8w 15 ms for one
    row and 79 ms for 16 on a 2-core Xeon with AMX, here 9 and 22). Where gguf_amx.py's kernel is missing such a
    layer is int8w."""


class Parts(torch.nn.Module):
    """Weight-only layers of different kinds over one input (a Q4_K q/k with a Q6_K v): each runs its own
    product, the outputs concatenated (what a fused product gives); more than MAX_ROWS rows take `wide`."""

    def __init__(self, mods, wide: torch.nn.Module | None):
        super().__init__()
        # each part without its own float layer: its quantized product for every call it gets
        self.parts = torch.nn.ModuleList(type(m).fuse(m, wide=None) for m in mods)
        self.wide = wide
        self.out_features = sum(m.out_features for m in mods)
        self.in_features = mods[0].in_features
        self.MAX_ROWS = min(m.MAX_ROWS for m in mods)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features)
        if self.wide is not None and x2.shape[0] > self.MAX_ROWS:
            return self.wide(x2.to(self.wide.weight.dtype)).to(x.dtype).reshape(*lead, self.out_features)
        return torch.cat([p(x2) for p in self.parts], dim=-1).reshape(*lead, self.out_features)


WEIGHT_ONLY = (Int4WeightLinear, Int8WeightLinear, Parts)  # BlockLinear is an Int4WeightLinear


def fuse_weight_only(*mods, wide: torch.nn.Module | None = None) -> torch.nn.Module:
    """The layers' products as one module: one fused product where they are of one kind, else Parts."""
    kinds = {type(m) for m in mods}
    if len(kinds) == 1 and kinds <= {Int4WeightLinear, BlockLinear, Int8WeightLinear}:
        try:
            return kinds.pop().fuse(*mods, wide=wide)
        except ValueError:  # int4 layers whose packing does not concatenate
            pass
    return Parts(mods, wide)


# Where the avx2 build runs, the models listed here compute their prompt chunks on it too and keep no float layer:
# fp32, the only float product such a CPU has, costs more a row than the kernel at 32 and 64 rows (the 2-core AVX2
# EPYC: the 0.5B's 64-token chunk 1.19-1.36x faster, 1.0 GB less memory; docs/cpu.md), but the prompt then rounds
# otherwise than under the vnni build, so its quality is measured again (precision.py's figures, same cases). A
# model not listed keeps its fp32 float layers there and the vnni build's figure.
INT4W_AVX2_QUALITY: dict[str, float] = {
    "Qwen2.5-Coder-0.5B-Instruct": -0.8,  # 89 vs 91 of 240 boltons lines (2026-12-08, 2-core AVX2-only EPYC; the
    # 91 first recorded here was measured with the float layers, docs/cpu.md)
}


def prompts_on_kernel(model_name: str | None) -> bool:
    """int4w computes this model's prompt chunks on the 4-bit kernel too, keeping no float layer: where this
    process's kernel is the avx2 build and the model's quality was measured so (INT4W_AVX2_QUALITY)."""
    return model_name in INT4W_AVX2_QUALITY and kernel_name().startswith("avx2")


def kernel_name() -> str:
    """Which product int4w runs in this process: "amx-<source digest>" or "avx512-<source digest>" (gguf_amx.py)
    or "torch"."""
    return f"{gguf_amx.variant()}-{gguf_amx.source_digest()}" if gguf_amx.kernel() is not None else "torch"


@functools.cache
def weight_int4_exact() -> bool:
    """Whether the kernel exists here and gives every row the same bits alone and inside batches of
    2..FLOAT_ROWS rows (more than trees use; the others 1000x larger or smaller), and a fused layer its
    parts' bits (once per process)."""
    rng = np.random.default_rng(0)
    try:
        def layer(n: int, k: int = 512) -> Int4WeightLinear:
            raw = rng.integers(0, 256, (n, k // SUPER * Q4K_BYTES), dtype=np.uint8)
            raw.reshape(n, -1, Q4K_BYTES)[..., 0:4] = np.array([0.01, 0.002], np.float16).view(np.uint8)
            return Int4WeightLinear.from_q4k(raw, k)

        a, b = layer(192), layer(48)  # a whole number of row blocks, then a partial one
        b.bias = torch.from_numpy(rng.standard_normal(48).astype(np.float32))
        fused = Int4WeightLinear.fuse(a, b)  # no float layer: the kernel for every row count
        x = torch.from_numpy(rng.standard_normal((FLOAT_ROWS, 512)).astype(np.float32))
        x = x * torch.logspace(-1.5, 1.5, FLOAT_ROWS)[:, None]
        return fused_rows_invariant(a, b, fused, x)
    except (RuntimeError, AttributeError, NotImplementedError, ValueError):  # no such kernel on this build
        return False


# transformers' module names -> the GGUF's tensor names (llama.cpp's naming, the same for Qwen2 and Llama)
_GGUF_NAMES = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
               "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
               "mlp.down_proj": "ffn_down"}
_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")


def gguf_name(module_name: str, head: bool) -> list[str]:
    """The GGUF tensors that may hold a module's weight, most likely first (a tied head reads the embeddings)."""
    if head:
        return ["output.weight", "token_embd.weight"]
    m = _LAYER.match(module_name)
    if m and m.group(2) in _GGUF_NAMES:
        return [f"blk.{m.group(1)}.{_GGUF_NAMES[m.group(2)]}.weight"]
    return []


def _q4k_layer(tensor: Any, linear: torch.nn.Linear, wide: torch.nn.Module) -> Int4WeightLinear | None:
    """An Int4WeightLinear from a Q4_K tensor that decodes to exactly `linear`'s weight; None otherwise."""
    from gguf import GGMLQuantizationType

    n, k = linear.weight.shape
    if tensor.tensor_type != GGMLQuantizationType.Q4_K or tuple(tensor.data.shape) != (n, k // SUPER * Q4K_BYTES) \
            or n % N_MULTIPLE:
        return None
    fields = q4k_fields(np.asarray(tensor.data), k)  # decoded once: checked, then packed
    groups = _groups(*fields)
    if not torch.equal(dequantize(*groups), linear.weight.detach().float()):
        return None
    blocks = gguf_amx.pack_q4k_fields(*fields) if gguf_amx.kernel() is not None else pack(*groups)
    return Int4WeightLinear(blocks, linear.bias, wide)


def _block_layer(tensor: Any, linear: torch.nn.Linear, wide: torch.nn.Module) -> BlockLinear | None:
    """A BlockLinear from a Q6_K, Q5_0 or Q8_0 tensor that decodes to exactly `linear`'s weight, where the AMX
    kernel runs; None otherwise (the layer becomes int8w)."""
    kind = getattr(tensor.tensor_type, "name", "")
    size = {"Q6_K": (SUPER, gguf_amx.Q6K_BYTES), "Q5_0": (32, gguf_amx.Q5_0_BYTES), "Q8_0": (32, gguf_amx.Q8_0_BYTES)}
    n, k = linear.weight.shape
    if gguf_amx.kernel() is None or kind not in size or n % gguf_amx.COLUMNS or k % 64 or k % size[kind][0] \
            or tuple(tensor.data.shape) != (n, k // size[kind][0] * size[kind][1]):
        return None
    raw = np.asarray(tensor.data)
    if kind == "Q6_K":
        q, d, sc = fields = gguf_amx.q6k_fields(raw, k)
        scale, offset, group = np.repeat(d, SUPER // 16, axis=1) * sc.astype(np.float32), 32, 16
    else:
        q, scale = fields = gguf_amx.q32_fields(raw, k, kind)
        offset, group = (16 if kind == "Q5_0" else 0), 32
    # d*sc*(q - 32), d*(q - 16), d*q: exact in fp32, as ggml's
    w = scale[:, :, None] * (q.reshape(n, -1, group).astype(np.float32) - offset)
    if not torch.equal(torch.from_numpy(w.reshape(n, k)), linear.weight.detach().float()):
        return None
    blocks = gguf_amx.pack_q6k_fields(*fields) if kind == "Q6_K" else gguf_amx.pack_q32_fields(*fields, kind)
    return BlockLinear(blocks, linear.bias, wide)


def _layers_from_gguf(gguf: str | Path, slots: list, names: dict[int, str], head: Any) -> dict[str, Int4WeightLinear]:
    """{module name: layer} for the linear layers whose GGUF tensor decodes exactly to their weight."""
    from gguf import GGUFReader

    tensors = {t.name: t for t in GGUFReader(str(gguf)).tensors}
    out = {}
    for parent, attr in slots:
        linear = getattr(parent, attr)
        name = names.get(id(linear), "")
        for tname in gguf_name(name, linear is head):
            if tname in tensors:
                layer = _q4k_layer(tensors[tname], linear, linear) or _block_layer(tensors[tname], linear, linear)
                if layer is not None:
                    out[name] = layer
                break
    return out


def _layers_kept(gguf: str | Path, key: str, slots: list, names: dict[int, str]) -> dict[str, Int4WeightLinear] | None:
    """_layers_from_gguf's result as packed_cache kept it for `key` (checked when kept: the key holds the GGUF
    and the model's weight files); None where nothing usable is kept."""
    kept = packed_cache.load(gguf, key)
    if kept is None:
        return None
    out = {}
    for parent, attr in slots:
        linear = getattr(parent, attr)
        name = names.get(id(linear), "")
        if name in kept:
            entry = kept[name]
            layer = (BlockLinear if entry.kind == "blocks" else Int4WeightLinear)(entry.blocks, linear.bias, linear)
            if (layer.out_features, layer.in_features) != tuple(linear.weight.shape):
                log.warning("int4w: the kept %s is %dx%d, the model's %s: decoding the GGUF again", name,
                            layer.out_features, layer.in_features, tuple(linear.weight.shape))
                return None
            out[name] = layer
    return out


@torch.no_grad()
def quantize_from_gguf(model: Any, gguf: str | Path, wide_dtype: torch.dtype | None = torch.float32) -> dict[str, int]:
    """Replace, in place, the nn.Linear layers of a transformers causal LM's decoder and its LM head: by
    Int4WeightLinear where the GGUF holds the layer as Q4_K blocks that decode to the model's weight, else by
    Int8WeightLinear; each keeps its float layer, in `wide_dtype`, for prompt chunks (None: the 4-bit layers
    keep none and compute every call on their blocks; an int8w layer keeps an fp32 one). -> how many layers
    became which."""
    from .int8weight import weight_int8_exact

    if not weight_int4_exact() or not weight_int8_exact():
        raise RuntimeError("int4w: torch's _weight_int4pack_mm_for_cpu or _weight_int8pack_mm is unavailable "
                           "or not batch-invariant on this CPU")
    names = {id(mod): name for name, mod in model.named_modules()}
    slots = list(linear_slots(model, head=True))
    key = packed_cache.cache_key(gguf, model, kernel_name())
    layers = _layers_kept(gguf, key, slots, names) if key else None
    if layers is None:
        layers = _layers_from_gguf(gguf, slots, names, model.get_output_embeddings())
        if key and layers:
            packed_cache.save(gguf, key, layers)
    counts = {"int4": 0, "blocks": 0, "int8": 0}
    for parent, attr in slots:
        linear = getattr(parent, attr)
        layer = layers.get(names.get(id(linear), ""))
        if layer is None:
            layer = Int8WeightLinear.from_linear(linear)
        if wide_dtype is None and isinstance(layer, Int4WeightLinear):
            layer.wide = None
        else:
            layer.wide.to(wide_dtype or torch.float32)
        kind = "blocks" if isinstance(layer, BlockLinear) else "int4" if isinstance(layer, Int4WeightLinear) else "int8"
        counts[kind] += 1
        setattr(parent, attr, layer)
    log.info("int4w: %d layers from Q4_K blocks, %d from other blocks (Q6_K, Q5_0, Q8_0), %d as int8w",
             counts["int4"], counts["blocks"], counts["int8"])
    if counts["int4"] == 0:
        raise ValueError(f"int4w: {Path(gguf).name} holds no Q4_K layer that decodes to this model's weights")
    return counts
