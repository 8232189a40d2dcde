"""int4w's AMX kernels (rest_lsp/model/gguf_amx.py, kernels/gguf_amx.cpp): Q4_K and Q6_K blocks times
activations on AMX tiles.

The products are checked against gguf's own dequantization (an independent implementation) in float64 on the
same bf16-rounded activations, and a row's bits alone against the same row inside batches of every size."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from rest_lsp.model import gguf_amx
from rest_lsp.model.int4weight import Int4WeightLinear, fuse_weight_only

pytestmark = pytest.mark.skipif(gguf_amx.kernel() is None, reason="no AMX here (or no compiler): torch's int4 product")


def gguf_weights(raw: np.ndarray, k: int, kind: str = "Q4_K") -> torch.Tensor:
    import gguf

    return torch.from_numpy(gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[kind]).reshape(raw.shape[0], k))


def reference(x: torch.Tensor, raw: np.ndarray, k: int, kind: str = "Q4_K") -> torch.Tensor:
    return x.to(torch.bfloat16).double() @ gguf_weights(raw, k, kind).double().T


def random_blocks(kind: str, n: int, k: int, rng) -> np.ndarray:
    from testmodels.tiny import random_q4k_blocks, random_q6k_blocks

    if kind == "Q4_K":
        return random_q4k_blocks(n, k, rng)
    if kind == "Q6_K":
        return random_q6k_blocks(n, k, rng)
    size = {"Q5_0": 22, "Q8_0": 34}[kind]  # every bit pattern of the values, d set to a small scale
    raw = rng.integers(0, 256, (n, k // 32 * size), dtype=np.uint8)
    raw.reshape(n, -1, size)[..., 0:2] = np.array([0.004], np.float16).view(np.uint8)
    return raw


def pack(kind: str, raw: np.ndarray, k: int):
    return {"Q4_K": lambda: gguf_amx.pack(raw, k), "Q6_K": lambda: gguf_amx.pack_q6k(raw, k)}.get(
        kind, lambda: gguf_amx.pack_q32(raw, k, kind))()


@pytest.mark.parametrize("kind", ["Q5_0", "Q8_0"])
def test_q32_fields_decode_as_gguf_does(kind):
    raw = random_blocks(kind, 32, 512, np.random.default_rng(8))
    q, d = gguf_amx.q32_fields(raw, 512, kind)
    assert (q.min(), q.max()) == ((0, 31) if kind == "Q5_0" else (-128, 127))
    w = np.repeat(d, 32, axis=1) * (q.astype(np.float32) - (16 if kind == "Q5_0" else 0))
    assert np.array_equal(w, gguf_weights(raw, 512, kind).numpy())


SHAPES = [(16, 256), (48, 768), (272, 1536)]  # K-quants take whole super-blocks of 256; Q5_0, Q8_0 also 896


@pytest.mark.parametrize("kind,n,k", [(kind, n, k) for kind in ("Q4_K", "Q6_K") for n, k in SHAPES]
                         + [(kind, n, k) for kind in ("Q5_0", "Q8_0") for n, k in SHAPES + [(32, 896)]])
def test_every_formats_products_are_ggufs_weights_times_the_bf16_activations(kind, n, k):
    rng = np.random.default_rng(n + k)
    raw = random_blocks(kind, n, k, rng)
    x = torch.from_numpy(rng.standard_normal((7, k)).astype(np.float32))
    y = gguf_amx.matmul(x, pack(kind, raw, k))
    # this process's build: the vnni build takes int8 activations (its own tests below)
    expected = int8_reference if gguf_amx.variant() in gguf_amx.INT8_ACTIVATIONS else reference
    ref = expected(x, raw, k, kind)
    # fp32 sums of exact products (128 + q, 144 or 160 taken off again): a few fp32 roundings, no more
    assert torch.allclose(y.double(), ref, rtol=0, atol=1e-5 * float(ref.abs().max()))
    assert not torch.allclose(y.double(), expected(x, random_blocks(kind, n, k, rng), k, kind), atol=1e-2)


def test_q6k_fields_decode_as_gguf_does():
    from testmodels.tiny import random_q6k_blocks

    raw = random_q6k_blocks(32, 512, np.random.default_rng(9))  # every bit pattern of values and scales
    q, d, sc = gguf_amx.q6k_fields(raw, 512)
    assert q.min() == 0 and q.max() == 63 and sc.dtype == np.int8 and sc.shape == (32, 32)
    w = np.repeat(d, 16, axis=1)[:, :, None] * sc.astype(np.float32)[:, :, None] * (q.reshape(32, -1, 16) - 32.0)
    assert np.array_equal(w.reshape(32, 512).astype(np.float32), gguf_weights(raw, 512, "Q6_K").numpy())


def test_the_docstrings_worked_example():
    raw = np.zeros((16, 144), np.uint8)
    raw[:, 0:4] = np.array([0.5, 0.25], np.float16).view(np.uint8)  # d, dmin
    raw[:, 4], raw[:, 8] = 1, 1  # group 0: sc 1, m 1 -> d*sc = 0.5, dmin*m = 0.25
    raw[0, 16] = 0x01  # column 0: q = 1 at k = 0, the rest of group 0 zero
    x = torch.zeros(1, 256)
    x[0, 0], x[0, 1] = 2.0, 254.0  # exact in bf16 and, scaled by 254 / 127, in int8 (the vnni build)
    y = gguf_amx.matmul(x, gguf_amx.pack(raw, 256))
    assert y[0, 0].item() == -63.0
    assert torch.equal(y[0, 1:], torch.full((15,), -64.0))  # q = 0: only the mins, -0.25 * 256


@pytest.mark.parametrize("kind", ["Q4_K", "Q6_K", "Q5_0", "Q8_0"])
def test_a_row_gets_the_same_bits_alone_and_in_every_batch(kind):
    rng = np.random.default_rng(5)
    blocks = pack(kind, random_blocks(kind, 64, 512, rng), 512)
    x = torch.from_numpy(rng.standard_normal((40, 512)).astype(np.float32)) * torch.logspace(-3, 3, 40)[:, None]
    alone = torch.cat([gguf_amx.matmul(x[i:i + 1], blocks) for i in range(40)])
    for m in range(2, 41):  # one tile of m rows up to 16, then tiles of 16 over zero-padded rows
        assert torch.equal(gguf_amx.matmul(x[:m], blocks), alone[:m]), m


def test_layers_fuse_column_block_by_column_block():
    from testmodels.tiny import random_q4k_blocks

    rng = np.random.default_rng(6)
    layers = [Int4WeightLinear.from_q4k(random_q4k_blocks(n, 512, rng), 512,
                                        torch.from_numpy(rng.standard_normal(n).astype(np.float32))) for n in (48, 16, 80)]
    assert all(m.amx for m in layers)
    fused = fuse_weight_only(*layers)
    assert isinstance(fused, Int4WeightLinear) and fused.out_features == 144
    x = torch.randn(9, 512)
    assert torch.equal(fused(x), torch.cat([m(x) for m in layers], dim=1))


def test_a_layers_bound_product_follows_its_tensors():
    from testmodels.tiny import random_q4k_blocks

    rng = np.random.default_rng(7)
    layer = Int4WeightLinear.from_q4k(random_q4k_blocks(32, 512, rng), 512,
                                      torch.from_numpy(rng.standard_normal(32).astype(np.float32)))
    x = torch.randn(3, 512)
    before = layer(x)  # binds the product to the layer's tensors
    assert torch.equal(layer(x.reshape(1, 3, 512)), before.reshape(1, 3, 32))  # the general path, same bits
    old_dd = layer.dd
    layer._apply(lambda t: t.clone())  # what .to() and the like do: new tensors in the layer
    old_dd.zero_()  # a product still bound to the old tensors would now give the mins alone
    assert torch.equal(layer(x), before)


def test_bad_shapes_are_refused():
    with pytest.raises(ValueError, match="whole blocks of 16"):
        gguf_amx.pack(np.zeros((8, 144), np.uint8), 256)
    with pytest.raises(ValueError, match="width 512"):
        gguf_amx.pack(np.zeros((16, 144), np.uint8), 512)
    with pytest.raises(ValueError, match="Q6_K rows of width 512"):
        gguf_amx.pack_q6k(np.zeros((16, 210), np.uint8), 512)


def test_a_lock_left_by_a_load_killed_midway_does_not_stop_the_next_one():
    """torch's lock file, as a daemon killed while loading the kernel leaves it: the next load goes on (torch's
    own would wait for the file to go, forever)."""
    import threading

    kind = gguf_amx.variant()
    (gguf_amx.build_dir(kind) / "lock").touch()
    loaded = []
    t = threading.Thread(target=lambda: loaded.append(gguf_amx.build.__wrapped__(kind)), daemon=True)
    t.start()
    t.join(300)
    assert loaded and loaded[0] is not None
    assert not (gguf_amx.build_dir(kind) / "lock").exists()


@pytest.mark.parametrize("flags,asked,expected", [
    ({"avx512f", "avx512bw", "avx512vl", "avx512_bf16", "amx_tile", "amx_bf16"}, "auto", "amx"),
    ({"avx512f", "avx512bw", "avx512vl", "avx512_bf16", "amx_tile", "amx_bf16"}, "avx512", "avx512"),
    ({"avx512f", "avx512bw", "avx512vl", "avx512_bf16"}, "auto", "avx512"),
    ({"avx512f", "avx512bw", "avx512vl", "avx512_bf16", "avx512_vnni"}, "auto", "vnni"),  # a Zen4 EPYC
    ({"avx512f", "avx512bw", "avx512vl", "avx512_bf16", "avx512_vnni"}, "avx512", "avx512"),
    ({"avx512f", "avx512bw", "avx512vl", "avx512_bf16", "avx512_vnni", "amx_tile", "amx_bf16"}, "auto", "amx"),
    ({"avx512f", "avx512bw", "avx512vl", "avx512_bf16"}, "amx", None),
    ({"avx512f", "avx512bw", "avx512vl", "avx2", "fma"}, "auto", "avx2"),  # AVX-512 without BF16 (an Ice Lake Xeon)
    ({"avx2", "fma"}, "auto", "avx2"),  # an AVX2-only EPYC
    ({"avx2"}, "auto", None),  # no FMA
    ({"avx2", "fma"}, "vnni", None),  # not this CPU's: torch's product, as asked
    ({"avx2", "fma"}, "torch", None),
    ({"avx512f", "avx512bw", "avx512vl", "avx512_bf16", "avx512_vnni", "avx2", "fma"}, "avx2", "avx2"),
    ({"avx512f", "avx512bw", "avx512vl", "avx512_bf16", "amx_tile", "amx_bf16"}, "torch", None),
    ({"avx512f", "avx512bw", "avx512vl", "avx512_bf16", "avx512_vnni"}, "vnni", "vnni"),
    ({"avx512f", "avx512bw", "avx512vl", "avx512_bf16"}, "vnni", None),  # no VNNI: torch's product, as asked
])
def test_the_build_follows_the_cpu_and_the_setting(monkeypatch, flags, asked, expected):
    monkeypatch.setattr(gguf_amx, "cpu_flags", lambda: flags)
    monkeypatch.setenv("REST_LSP_INT4_KERNEL", asked)
    gguf_amx.variant.cache_clear()
    try:
        assert gguf_amx.variant() == expected
    finally:
        gguf_amx.variant.cache_clear()


# The VNNI build (`REST_LSP_INT4_KERNEL=vnni`): every format on int8 activations, checked here whichever build
# this process runs. Its reference: the activations rounded as the kernel rounds them (a scale per 32 inputs,
# amax / 127 in fp32, ties to even), then exact float64 products of gguf's own weights; Q4_K's mins take the
# inputs' own sums.
VNNI_FLAGS = {"avx512f", "avx512bw", "avx512vl", "avx512_bf16", "avx512_vnni"}
needs_vnni = pytest.mark.skipif(not VNNI_FLAGS <= gguf_amx.cpu_flags(), reason="no AVX512-VNNI here")


def build_product(build: str, x: torch.Tensor, blocks):
    """The product of `build` (a build other than this process's, for comparing them)."""
    code, tensors = gguf_amx.format_code(blocks)
    return getattr(gguf_amx.build(build), ("q4k_amx_mm", "q6k_amx_mm", "q5_0_amx_mm", "q8_0_amx_mm")[code])(x, *tensors)


def vnni_product(kind: str, x: torch.Tensor, blocks):
    return build_product("vnni", x, blocks)


def int8_reference(x: torch.Tensor, raw: np.ndarray, k: int, kind: str) -> torch.Tensor:
    g = x.numpy().reshape(x.shape[0], -1, 32)
    amax = np.abs(g).max(axis=-1, keepdims=True)
    inv = np.where(amax > 0, np.float32(127) / np.maximum(amax, np.float32(1e-30)), np.float32(0)).astype(np.float32)
    q = np.clip(np.rint(g * inv), -128, 127)
    scale = (amax / np.float32(127)).astype(np.float32)
    xq = torch.from_numpy((q.astype(np.float64) * scale.astype(np.float64)).reshape(x.shape))
    ref = xq @ gguf_weights(raw, k, kind).double().T
    if kind == "Q4_K":  # the mins times the inputs' own sums, not the rounded ones'
        _, _, dmin, _, m = gguf_amx.q4k_fields(raw, k)
        mins = torch.from_numpy(np.repeat(dmin, 8, axis=1).astype(np.float64) * m)  # [N, K/32]
        ref = ref + (xq.reshape(x.shape[0], -1, 32).sum(-1) - torch.from_numpy(g.astype(np.float64).sum(-1))) @ mins.T
    return ref


@needs_vnni
@pytest.mark.parametrize("kind,n,k", [(kind, n, k) for kind in ("Q4_K", "Q6_K") for n, k in SHAPES]
                         + [(kind, n, k) for kind in ("Q5_0", "Q8_0") for n, k in SHAPES + [(32, 896)]])
def test_the_vnni_build_multiplies_the_weights_by_int8_activations(kind, n, k):
    rng = np.random.default_rng(n + k + 1)
    raw = random_blocks(kind, n, k, rng)
    x = torch.from_numpy(rng.standard_normal((7, k)).astype(np.float32))
    y = vnni_product(kind, x, pack(kind, raw, k)).double()
    ref = int8_reference(x, raw, k, kind)
    assert torch.allclose(y, ref, rtol=0, atol=1e-5 * float(ref.abs().max()))
    # not the bf16 builds' product: the activations were rounded to int8 (a few 1e-3 of the largest output)
    bf16 = reference(x, raw, k, kind)
    assert not torch.allclose(y, bf16, rtol=0, atol=1e-4 * float(bf16.abs().max()))


@needs_vnni
@pytest.mark.parametrize("kind", ["Q4_K", "Q6_K", "Q5_0", "Q8_0"])
def test_the_vnni_builds_rows_get_the_same_bits_alone_and_in_every_batch(kind):
    rng = np.random.default_rng(9)
    blocks = pack(kind, random_blocks(kind, 64, 512, rng), 512)
    x = torch.from_numpy(rng.standard_normal((40, 512)).astype(np.float32)) * torch.logspace(-3, 3, 40)[:, None]
    alone = torch.cat([vnni_product(kind, x[i:i + 1], blocks) for i in range(40)])
    for m in range(2, 41):
        assert torch.equal(vnni_product(kind, x[:m], blocks), alone[:m]), m


# The AVX2 build (kernels/gguf_avx2.cpp, `REST_LSP_INT4_KERNEL=avx2`; an AVX2-only CPU's): the vnni build's
# numbers from VPMADDUBSW, checked against the same reference wherever AVX2 runs, and bit for bit against the
# vnni build itself where both run.
needs_avx2 = pytest.mark.skipif(not {"avx2", "fma"} <= gguf_amx.cpu_flags(), reason="no AVX2 here")


def avx2_product(kind: str, x: torch.Tensor, blocks):
    return build_product("avx2", x, blocks)


@needs_avx2
@pytest.mark.parametrize("kind,n,k", [(kind, n, k) for kind in ("Q4_K", "Q6_K") for n, k in SHAPES]
                         + [(kind, n, k) for kind in ("Q5_0", "Q8_0") for n, k in SHAPES + [(32, 896)]])
def test_the_avx2_build_multiplies_the_weights_by_int8_activations(kind, n, k):
    rng = np.random.default_rng(n + k + 2)
    raw = random_blocks(kind, n, k, rng)
    x = torch.from_numpy(rng.standard_normal((7, k)).astype(np.float32))
    y = avx2_product(kind, x, pack(kind, raw, k)).double()
    ref = int8_reference(x, raw, k, kind)
    assert torch.allclose(y, ref, rtol=0, atol=1e-5 * float(ref.abs().max()))
    bf16 = reference(x, raw, k, kind)
    assert not torch.allclose(y, bf16, rtol=0, atol=1e-4 * float(bf16.abs().max()))


def extreme_rows(k: int, rng) -> torch.Tensor:
    """Rows that drive the int16 sums to their bounds: every group's inputs +-amax (q = +-127, the largest
    pair sums against the largest codes), rows of one sign, zero rows, rows 1000x apart."""
    x = rng.standard_normal((24, k)).astype(np.float32) * np.logspace(-3, 3, 24, dtype=np.float32)[:, None]
    x[0], x[1], x[2] = 1.0, -1.0, 0.0
    x[3] = np.where(rng.random(k) < 0.5, 3.0, -3.0)
    return torch.from_numpy(x)


@needs_avx2
@pytest.mark.parametrize("kind", ["Q4_K", "Q6_K", "Q5_0", "Q8_0"])
def test_the_avx2_builds_rows_get_the_same_bits_alone_and_in_every_batch(kind):
    rng = np.random.default_rng(10)
    blocks = pack(kind, random_blocks(kind, 64, 512, rng), 512)
    x = extreme_rows(512, rng)
    alone = torch.cat([avx2_product(kind, x[i:i + 1], blocks) for i in range(len(x))])
    for m in range(2, len(x) + 1):
        assert torch.equal(avx2_product(kind, x[:m], blocks), alone[:m]), m


@needs_avx2
@pytest.mark.parametrize("kind", ["Q4_K", "Q6_K", "Q5_0", "Q8_0"])
def test_the_avx2_builds_int16_sums_do_not_saturate(kind):
    """The largest codes of every format against inputs of +-amax: the integer dot products exactly, so the
    output is the int8 reference's to fp32 rounding (a saturated int16 sum would be off by thousands)."""
    rng = np.random.default_rng(11)
    raw = random_blocks(kind, 32, 512, rng)
    blk = raw.reshape(32, -1, {"Q4_K": 144, "Q6_K": 210, "Q5_0": 22, "Q8_0": 34}[kind])
    if kind == "Q4_K":
        blk[:, :, 16:] = 0xFF  # every code 15 (after d, dmin and the 12 bytes of scales)
    elif kind == "Q6_K":
        blk[:, :, :192] = 0xFF  # every code 63 (the low and the high bits; scales and d after them)
    else:
        blk[:, :, 2:] = 0xFF if kind == "Q5_0" else 0x80  # Q5_0 code 31, Q8_0 -128
    x = extreme_rows(512, rng)[:4]
    y = avx2_product(kind, x, pack(kind, raw, 512)).double()
    ref = int8_reference(x, raw, 512, kind)
    assert torch.allclose(y, ref, rtol=0, atol=1e-5 * float(ref.abs().max()) + 1e-6)


@needs_vnni
@pytest.mark.parametrize("kind,n,k", [(kind, n, k) for kind in ("Q4_K", "Q6_K", "Q5_0", "Q8_0") for n, k in SHAPES])
def test_the_avx2_build_gives_the_vnni_builds_bits(kind, n, k):
    """The same numbers by construction (exact integers, then the same float operations in the same order): so
    int4w takes the vnni build's quality figures on an AVX2 CPU."""
    rng = np.random.default_rng(n + k + 3)
    blocks = pack(kind, random_blocks(kind, n, k, rng), k)
    x = extreme_rows(k, rng)
    assert torch.equal(avx2_product(kind, x, blocks), vnni_product(kind, x, blocks))
