"""A GGUF's Q4_K, Q6_K, Q5_0 and Q8_0 blocks multiplied on AMX tiles, or on AVX512-BF16 dot products where the CPU
has no AMX: int4w's products on such CPUs, one compiled source (kernels/gguf_amx.cpp) built per `variant()`, and
on a CPU with AVX2 but not AVX512-BF16 the `vnni` build's numbers from AVX2's instructions (kernels/gguf_avx2.cpp).

    kernel() -> the compiled module, or None where the CPU, the compiler or the OS refuses (logged once)
    build(kind) -> one build ("amx", "avx512", "vnni", "avx2"), whichever the process runs
    pack(raw [N, K/256*144] uint8, k) -> QBlocks(codes, dd, sm): the kernel's layout of a Q4_K tensor
    pack_q6k(raw [N, K/256*210] uint8, k) -> Q6Blocks(lo, hi, dd, sc): the same for Q6_K
    pack_q32(raw, k, "Q5_0" | "Q8_0") -> Q32Blocks(lo, hi, dd, kind): the same for Q5_0 and Q8_0
    (pack_*_fields: the same from the decoded fields, for a caller that checked them already)
    QBlocks.cat(*parts), Q6Blocks.cat(*parts) -> the layers side by side (one product for gate and up)
    matmul(x [M, K] float, blocks) -> [M, N] fp32

Why: torch's int4 product (`_weight_int4pack_mm_for_cpu`) decodes the weights again for every 4 rows, so a
draft tree of 16 rows costs 4-7x one row (17,920 x 1,536 on a 2-core Xeon with AMX: 0.70 ms at 1 row, 1.29 at
4, 4.98 at 16), and the 1.5B at int4w could afford trees of 2-3 nodes only; its Q6_K layers (the head, half the
down projections) were int8w, 8 bits a weight and the same growth. Here each super-block's weights are decoded
once into bf16 tiles and one tile product serves up to 16 rows: 0.64, 0.72 and 1.43 ms (docs/cpu.md). Without
AMX (a Zen4 EPYC) the "avx512" build decodes a group's codes into registers, by a permute each to their exact
bf16 values (Q8_0: converted), and every row of the call takes them from there with `vdpbf16ps` (the 1.5B's step
67 -> 44-46 ms, c(4) 106 -> 67-78; the 0.5B's, mostly Q5_0 and Q8_0, 24-27 -> 18 ms, c(4) 45-48 -> 29;
docs/cpu.md); its cost still grows with the rows (compute-bound at 16). The "vnni" build (that one with
`-DREST_VNNI`, where the CPU has AVX512-VNNI) multiplies every format by int8 activations (a scale per 32 inputs)
with `vpdpbusd`, 64 products an instruction against 32: the 1.5B's products of a 4-row tree 0.82x, of 16 rows
0.68x; other numerics, so int4w's quality has its own figures there (precision.INT4W_VNNI_QUALITY).

Exact as int4w requires (the AVX-512 build the same, without the 128: its codes decode to q, q - 16 or q - 32
exactly, and an element's two dot-product chains are fixed per row): the weights are the blocks' own (Q4_K: d*sc*q - dmin*m;
Q6_K: d*sc*(q - 32); the scales computed in fp32 as gguf does, not rounded to bf16 as torch's layout needs them). A
code q is decoded to the bf16 value 128 + q by one OR (0x4300 | q), each group is one tile product of exact bf16
products summed in fp32, and the 128 (Q6_K: 160) comes off through the group's activation sum; an output element's
operations depend on neither the rows nor the other columns of the call, so a row gets the same bits alone and in a
tree (`int4weight.weight_int4_exact` checks it at load; int4w is refused where it fails).

Worked example, Q4_K, one column and one group: q = (1, 0, 0, ..., 0), d*sc = 0.5, dmin*m = 0.25, x = (2, 254,
0, ...): the tile product gives 129*2 + 128*254 = 32770, the group's activations sum to 256, so the dot product
with q is 32770 - 128*256 = 2 and y = 0.5*2 - 0.25*256 = -63, which is sum((0.5*q - 0.25)*x) = 0.25*2 - 0.25*254.
(The vnni build: x rounds to int8 as (1, 127) with the scale 254 / 127 = 2, exactly; dot = 1 * 1 * 2.)
"""
from __future__ import annotations

import functools
import logging
import os
import sys
from pathlib import Path
from typing import Any, Callable, NamedTuple

import numpy as np
import torch

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("kernels") / "gguf_amx.cpp"
AVX2_SOURCE = SOURCE.with_name("gguf_avx2.cpp")  # the same entry points on AVX2, the vnni build's numbers
# built into the same module: a decoder layer's step around these products (decode_layer.py)
LAYER_SOURCE = SOURCE.with_name("decode_layer.cpp")
SOURCES = (SOURCE, AVX2_SOURCE, LAYER_SOURCE)
FLAGS = ["-O3", "-fopenmp"]
AVX512 = ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512bf16"]
VARIANT_FLAGS = {"amx": AVX512 + ["-mamx-tile", "-mamx-bf16"], "avx512": AVX512 + ["-DREST_AVX512"],
                 "vnni": AVX512 + ["-DREST_AVX512", "-DREST_VNNI", "-mavx512vnni"],
                 # no contraction the vnni build does not make: its bits are this build's too
                 "avx2": ["-mavx2", "-mfma", "-ffp-contract=off"]}
INT8_ACTIVATIONS = ("vnni", "avx2")  # the builds that round activations to int8 (one numerics: their own figures)

COLUMNS = 16  # a column block: one tile's width in fp32
SUPER = 256
Q4K_BYTES = 144
Q6K_BYTES = 210  # ql[128] (low four bits), qh[64] (top two), 16 int8 scales, d (fp16)
Q5_0_BYTES, Q8_0_BYTES = 22, 34  # per 32 weights: d (fp16), qh[4] and qs[16]; d (fp16) and qs[32]


def sources(kind: str) -> list[str]:
    return [str(AVX2_SOURCE if kind == "avx2" else SOURCE), str(LAYER_SOURCE)]


class QBlocks(NamedTuple):
    codes: torch.Tensor  # [N/16, K/4, 32] uint8: two nibble planes = two rows of a B tile
    dd: torch.Tensor  # [N/16, K/256, 2, 16] fp32: d and dmin per super-block and column
    sm: torch.Tensor  # [N/16, K/32, 2, 16] uint8: sc and m per group and column

    @property
    def width(self) -> int:  # K
        return self.codes.shape[1] * 4

    @staticmethod
    def cat(*parts: "QBlocks") -> "QBlocks":
        return QBlocks(*(torch.cat(t) for t in zip(*parts)))


class Q6Blocks(NamedTuple):
    lo: torch.Tensor  # [N/16, K/4, 32] uint8: the low four bits, laid out as QBlocks.codes
    hi: torch.Tensor  # [N/16, K/8, 32] uint8: byte j of chunk h, bits 2v: the top two of pair 4h + v, lane j
    dd: torch.Tensor  # [N/16, K/256, 16] fp32: d per super-block and column
    sc: torch.Tensor  # [N/16, K/16, 16] int8: a scale per 16 weights and column

    @property
    def width(self) -> int:
        return self.lo.shape[1] * 4

    @staticmethod
    def cat(*parts: "Q6Blocks") -> "Q6Blocks":
        return Q6Blocks(*(torch.cat(t) for t in zip(*parts)))


class Q32Blocks(NamedTuple):
    """Q5_0 or Q8_0 (`kind`): 32 weights a scale."""
    lo: torch.Tensor  # Q5_0: [N/16, K/4, 32] the low four bits as QBlocks.codes; Q8_0: [N/16, K/2, 32] int8 pairs (as uint8)
    hi: torch.Tensor  # Q5_0: [N/16, K/16, 32] byte j of chunk h, bit v: the top bit of pair 8h + v; Q8_0: empty
    dd: torch.Tensor  # [N/16, K/32, 16] fp32: d per group and column
    kind: str

    @property
    def width(self) -> int:
        return self.dd.shape[1] * 32

    @staticmethod
    def cat(*parts: "Q32Blocks") -> "Q32Blocks":
        if len({p.kind for p in parts}) != 1:
            raise ValueError("gguf_amx: Q5_0 and Q8_0 blocks do not share one product")
        return Q32Blocks(*(torch.cat(t) for t in zip(*(p[:3] for p in parts))), parts[0].kind)


def q32_fields(raw: np.ndarray, k: int, kind: str) -> tuple[np.ndarray, np.ndarray]:
    """A Q5_0 or Q8_0 tensor's rows -> q [N, K] (Q5_0: 0..31, weight d*(q - 16); Q8_0: int8, weight d*q) and d
    [N, K/32] fp32 (ggml's dequantize_row_q5_0: value j of a block has the low bits of qs[j % 16] (low nibble
    for j < 16) and bit j of the little-endian qh)."""
    size = Q5_0_BYTES if kind == "Q5_0" else Q8_0_BYTES
    n = raw.shape[0]
    if k % 32 or raw.shape[1] != k // 32 * size:
        raise ValueError(f"{kind} rows of width {k} take {k // 32 * size} bytes, got {raw.shape[1]}")
    blocks = np.ascontiguousarray(raw, dtype=np.uint8).reshape(n, k // 32, size)
    d = blocks[..., 0:2].copy().view(np.float16).astype(np.float32)[..., 0]
    if kind == "Q8_0":
        return blocks[..., 2:].copy().view(np.int8).reshape(n, k), d
    qh = blocks[..., 2:6].copy().view("<u4")  # [N, B, 1]
    qs = blocks[..., 6:22]
    top = ((qh >> np.arange(32, dtype=np.uint32)) & 1).astype(np.uint8)  # [N, B, 32]
    q = np.concatenate([qs & 15, qs >> 4], axis=-1) | (top << 4)
    return q.reshape(n, k), d


def q6k_fields(raw: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A Q6_K tensor's rows ([N, K/256*210] bytes) -> q [N, K] (0..63), d [N, K/256] fp32, sc [N, K/16] int8,
    with weight = d*sc*(q - 32) (ggml's dequantize_row_q6_K: each half of a super-block takes 64 bytes of ql,
    32 of qh and 8 scales; weight l + 32j of a half has the low bits of ql[l + 32(j % 2)] (low nibble for j < 2)
    and bits 2j..2j+1 of qh[l])."""
    n = raw.shape[0]
    if k % SUPER or raw.shape[1] != k // SUPER * Q6K_BYTES:
        raise ValueError(f"Q6_K rows of width {k} take {k // SUPER * Q6K_BYTES} bytes, got {raw.shape[1]}")
    blocks = np.ascontiguousarray(raw, dtype=np.uint8).reshape(n, k // SUPER, Q6K_BYTES)
    ql = blocks[..., 0:128].reshape(n, -1, 2, 64)  # [N, B, half, 64]
    qh = blocks[..., 128:192].reshape(n, -1, 2, 1, 32)
    sc = blocks[..., 192:208].copy().view(np.int8).reshape(n, -1)
    d = blocks[..., 208:210].copy().view(np.float16).astype(np.float32)[..., 0]
    low = np.stack([ql[..., 0:32] & 15, ql[..., 32:64] & 15, ql[..., 0:32] >> 4, ql[..., 32:64] >> 4], axis=3)
    high = (qh >> (2 * np.arange(4, dtype=np.uint8))[:, None]) & 3  # [N, B, half, 4, 32]
    q = (low | (high << 4)).reshape(n, k)
    return q, d, sc


def q4k_fields(raw: np.ndarray, k: int) -> tuple[np.ndarray, ...]:
    """A Q4_K tensor's rows -> q [N, K] (0..15), d and dmin [N, K/256] fp32, sc and m [N, K/32] (6-bit), with
    weight = d*sc*q - dmin*m per group of 32 (gguf's own decoding, int4weight.q4k_groups's parts)."""
    n = raw.shape[0]
    if k % SUPER or raw.shape[1] != k // SUPER * Q4K_BYTES:
        raise ValueError(f"Q4_K rows of width {k} take {k // SUPER * Q4K_BYTES} bytes, got {raw.shape[1]}")
    blocks = np.ascontiguousarray(raw, dtype=np.uint8).reshape(n, k // SUPER, Q4K_BYTES)
    d = blocks[..., 0:2].copy().view(np.float16).astype(np.float32)[..., 0]  # [N, B]
    dmin = blocks[..., 2:4].copy().view(np.float16).astype(np.float32)[..., 0]
    s = blocks[..., 4:16]
    lo_sc, lo_m, hi = s[..., 0:4], s[..., 4:8], s[..., 8:12]
    # groups 0-3: the low six bits of bytes 0-3 (scales) and 4-7 (mins); groups 4-7: a nibble of bytes 8-11
    # below the top two bits of bytes 0-3 (scales) and 4-7 (mins)
    sc = np.concatenate([lo_sc & 63, (hi & 15) | ((lo_sc >> 6) << 4)], axis=-1).reshape(n, -1)
    m = np.concatenate([lo_m & 63, (hi >> 4) | ((lo_m >> 6) << 4)], axis=-1).reshape(n, -1)
    # values: four runs of 32 bytes; a run's low nibbles are group 2c, its high nibbles group 2c + 1
    qs = blocks[..., 16:].reshape(n, k // SUPER, 4, 1, 32)
    q = np.concatenate([qs & 15, qs >> 4], axis=3).reshape(n, k)
    return q, d, dmin, sc, m


def _pairs(q: np.ndarray) -> np.ndarray:
    """q [N, K] (values below 16) -> [N/16, K/4, 32] uint8: byte j of chunk c holds column j // 2's k = 4c + j % 2
    (low nibble) and k = 4c + 2 + j % 2 (high nibble): two rows of a B tile."""
    n, k = q.shape
    qq = q.reshape(n // COLUMNS, COLUMNS, k // 4, 2, 2)  # [block, column, chunk, plane, k % 2]
    lo = qq[:, :, :, 0, :].transpose(0, 2, 1, 3).reshape(n // COLUMNS, k // 4, 32)
    hi = qq[:, :, :, 1, :].transpose(0, 2, 1, 3).reshape(n // COLUMNS, k // 4, 32)
    return np.ascontiguousarray(lo | (hi << 4), dtype=np.uint8)


def _per_block(dtype, *fields: np.ndarray) -> torch.Tensor:
    """[N, X] fields -> [N/16, X, len(fields), 16] (squeezed when one): a column block's values side by side."""
    nb = fields[0].shape[0] // COLUMNS
    both = np.stack([f.reshape(nb, COLUMNS, -1) for f in fields], axis=2).transpose(0, 3, 2, 1)
    out = torch.from_numpy(np.ascontiguousarray(both, dtype=dtype))
    return out[:, :, 0].contiguous() if len(fields) == 1 else out


def _whole_blocks(n: int) -> None:
    if n % COLUMNS:
        raise ValueError(f"gguf_amx: {n} output rows are not whole blocks of {COLUMNS}")


def pack(raw: np.ndarray, k: int) -> QBlocks:
    """A Q4_K tensor -> the kernel's layout (the worked example above)."""
    _whole_blocks(raw.shape[0])
    return pack_q4k_fields(*q4k_fields(raw, k))


def pack_q4k_fields(q, d, dmin, sc, m) -> QBlocks:
    """q4k_fields' parts -> the kernel's layout (for a caller that has decoded them already)."""
    _whole_blocks(q.shape[0])
    return QBlocks(torch.from_numpy(_pairs(q)), _per_block(np.float32, d, dmin), _per_block(np.uint8, sc, m))


def pack_q6k(raw: np.ndarray, k: int) -> Q6Blocks:
    _whole_blocks(raw.shape[0])
    return pack_q6k_fields(*q6k_fields(raw, k))


def pack_q6k_fields(q: np.ndarray, d: np.ndarray, sc: np.ndarray) -> Q6Blocks:
    n, k = q.shape
    _whole_blocks(n)
    # the top two bits: pair p = 4h + v of column c sits in lane 2c + (k % 2) of byte plane h at bits 2v
    top = (q >> 4).reshape(n // COLUMNS, COLUMNS, k // 8, 4, 2)  # [block, column, h, v, k % 2]
    top = top.transpose(0, 2, 1, 4, 3).reshape(n // COLUMNS, k // 8, 32, 4)
    hi = (top << (2 * np.arange(4, dtype=np.uint8))).sum(axis=-1, dtype=np.uint8)
    return Q6Blocks(torch.from_numpy(_pairs(q & 15)), torch.from_numpy(np.ascontiguousarray(hi)),
                    _per_block(np.float32, d), _per_block(np.int8, sc))


def pack_q32(raw: np.ndarray, k: int, kind: str) -> Q32Blocks:
    if raw.shape[0] % COLUMNS or k % 64:
        raise ValueError(f"gguf_amx: {raw.shape[0]} x {k} is not whole blocks of {COLUMNS} columns and 64 inputs")
    return pack_q32_fields(*q32_fields(raw, k, kind), kind)


def pack_q32_fields(q: np.ndarray, d: np.ndarray, kind: str) -> Q32Blocks:
    n, k = q.shape
    if n % COLUMNS or k % 64:
        raise ValueError(f"gguf_amx: {n} x {k} is not whole blocks of {COLUMNS} columns and 64 inputs")
    nb = n // COLUMNS
    dd = _per_block(np.float32, d)
    if kind == "Q8_0":  # byte j of chunk p: column j // 2, k = 2p + j % 2
        pairs = q.reshape(nb, COLUMNS, k // 2, 2).transpose(0, 2, 1, 3).reshape(nb, k // 2, 32)
        return Q32Blocks(torch.from_numpy(np.ascontiguousarray(pairs).view(np.uint8)), torch.empty(0, dtype=torch.uint8),
                         dd, kind)
    top = (q >> 4).reshape(nb, COLUMNS, k // 16, 8, 2).transpose(0, 2, 1, 4, 3).reshape(nb, k // 16, 32, 8)
    hi = (top << np.arange(8, dtype=np.uint8)).sum(axis=-1, dtype=np.uint8)
    return Q32Blocks(torch.from_numpy(_pairs(q & 15)), torch.from_numpy(np.ascontiguousarray(hi)), dd, kind)


def product(blocks: QBlocks | Q6Blocks | Q32Blocks) -> Callable[[torch.Tensor], torch.Tensor]:
    """The blocks' product bound once: x [M, K] contiguous float -> [M, N] fp32. A layer keeps it: a decoding
    step of the 0.5B makes 121 products, and looking up the kernel and its tensors each time cost about as much
    as the smaller products themselves."""
    k = kernel()
    kind, tensors = format_code(blocks)
    run = (k.q4k_amx_mm, k.q6k_amx_mm, k.q5_0_amx_mm, k.q8_0_amx_mm)[kind]
    return lambda x: run(x, *tensors)


def format_code(blocks: QBlocks | Q6Blocks | Q32Blocks) -> tuple[int, list[torch.Tensor]]:
    """The compiled `gguf_product`'s format number (0 Q4_K, 1 Q6_K, 2 Q5_0, 3 Q8_0) and the blocks' tensors."""
    if isinstance(blocks, Q6Blocks):
        return 1, list(blocks)
    if isinstance(blocks, Q32Blocks):
        return (3 if blocks.kind == "Q8_0" else 2), list(blocks[:3])
    return 0, list(blocks)


def matmul(x: torch.Tensor, blocks: QBlocks | Q6Blocks | Q32Blocks) -> torch.Tensor:
    return product(blocks)(x.contiguous())


@functools.cache
def source_digest() -> str:
    import hashlib

    return hashlib.sha256(b"".join(p.read_bytes() for p in SOURCES)).hexdigest()[:10]


def cpu_flags() -> set[str]:
    try:
        return set(Path("/proc/cpuinfo").read_text().split("flags", 2)[1].split("\n", 1)[0].split())
    except (OSError, IndexError):
        return set()


@functools.cache
def variant() -> str | None:
    """Which build this CPU takes: "amx" (AMX tiles), "vnni" (int8 activations and AVX512-VNNI's `vpdpbusd`: a
    Zen4 EPYC), "avx512" (AVX512-BF16 dot products), "avx2" (the vnni build's numbers on AVX2's `vpmaddubsw`: a CPU
    with AVX2 and FMA but not AVX512-BF16), or None (torch's int4 product): REST_LSP_INT4_KERNEL=
    torch|avx2|avx512|vnni|amx|auto overrides (avx2, avx512 or vnni on a larger CPU are for comparing builds).
    vnni's and avx2's numerics differ from the others': their own quality figures (precision.py)."""
    flags, asked = cpu_flags(), os.environ.get("REST_LSP_INT4_KERNEL", "auto")
    avx2 = {"avx2", "fma"} <= flags
    avx512 = {"avx512f", "avx512bw", "avx512vl", "avx512_bf16"} <= flags
    amx = avx512 and {"amx_tile", "amx_bf16"} <= flags
    vnni = avx512 and "avx512_vnni" in flags
    if asked == "torch" or (asked == "amx" and not amx) or (asked == "vnni" and not vnni):
        return None
    if asked == "avx2" or not avx512:
        return "avx2" if avx2 and asked in ("auto", "avx2") else None
    if asked in ("avx512", "vnni"):
        return asked
    return "amx" if amx else "vnni" if vnni else "avx512"


def kernel() -> Any | None:
    """This process's build (`variant()`), or None where the CPU, the compiler or the OS refuses (torch's product
    then)."""
    kind = variant()
    return None if kind is None else build(kind)


def build_dir(kind: str) -> Path:
    """Where build `kind` is compiled and loaded from: one folder per source, since a daemon and a `rest-lsp
    complete` of two versions would otherwise rebuild each other's module in place (ninja compares the source
    it was given)."""
    from restbase.storage import cache_root

    return cache_root() / "kernels" / f"gguf_{kind}-{source_digest()}-torch{torch.__version__.replace('+', '_')}"


@functools.cache
def build(kind: str) -> Any | None:
    """The build `kind` ("amx", "avx512", "vnni", "avx2"): built once per source, variant and torch version under the
    cache directory (about 20 s on 2 AVX-512 cores, 56 s on the 2-core AVX2 EPYC), then loaded; None where the
    compiler or the OS refuses. A process multiplies with kernel()'s only; tests build another to check it."""
    from torch.utils.cpp_extension import load

    from restbase.storage import file_lock

    build = build_dir(kind)
    build.mkdir(parents=True, exist_ok=True)
    # the compiler runs ninja; a venv's own (the `ninja` requirement) when the venv is not on PATH
    path = os.environ.get("PATH", "")
    os.environ["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), path])
    try:
        # torch's own lock is a file its holder deletes: one killed while loading (a daemon closed with its
        # editor) leaves it, and every later load waits for it forever. Under a lock that dies with its holder,
        # no live load of ours holds torch's, so a file there is such a leftover.
        with file_lock(build / "load.lock"):
            (build / "lock").unlink(missing_ok=True)
            mod = load(name=f"rest_lsp_gguf_{kind}", sources=sources(kind),
                       extra_cflags=FLAGS + VARIANT_FLAGS[kind], extra_ldflags=["-fopenmp"],
                       build_directory=str(build), verbose=False)
        if not mod.q4k_amx_ready():
            raise RuntimeError("the OS refused AMX tile state")
    except Exception as e:  # noqa: BLE001 - no compiler, no ninja, an assembler without AMX: torch's product
        log.warning("int4w: the %s kernel is not available (%s); torch's int4 product is used", kind, e)
        return None
    finally:
        os.environ["PATH"] = path
    return mod
