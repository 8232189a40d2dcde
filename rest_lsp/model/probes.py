"""What this machine's CPU kernels can do and how they round, asked once per process (no model needed).

    packing_available() / bf16_packing_available()   oneDNN's prepacked fp32 / bf16 products exist here
    cpu_has_bf16()          native bf16 dot products (AVX512-BF16, AMX): bf16 costs half of fp32 here
    sdpa_row_invariant()    torch's CPU attention gives a query row the same bits alone and among other rows
    rows_alike(attention)   the same check of any attention function (the compiled tree attention's too)
    eager_row_invariant(dt) transformers' own forward (attention and F.linear) does, in dtype dt
    attend(q, k, v, mask, dtype)   the CPU forward's attention call (rest_lsp/model/fast.py), kept beside the
                            probe that checks it so that both run the same call

rest_lsp/model/verifiers.py reads them to choose a verifier and to say whether its tree rows are exact; the
quantized products' own probes (int8row.int_mm_exact, int8weight.weight_int8_exact,
int4weight.weight_int4_exact) stay with their kernels and gate `precision: auto` (rest_lsp/model/precision.py).
"""
from __future__ import annotations

import functools
from pathlib import Path

import torch
import torch.nn.functional as F


def packing_available() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")


def bf16_packing_available() -> bool:
    """oneDNN packs and multiplies bf16 here: it needs AVX512-BW/VL/DQ, AVX-NE-CONVERT or AMX (an AVX2-only CPU
    has none; torch's own bf16 matmul still runs there, through the eager verifier)."""
    return packing_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()


NO_BF16 = "need oneDNN's bf16 kernels (AVX512-BW/VL/DQ, AVX-NE-CONVERT or AMX), which this CPU lacks"


def cpu_has_bf16() -> bool:
    """Native bf16 dot products (AVX512-BF16 or AMX): where a bf16 product costs half an fp32 one."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return ("avx512_bf16" in flags or "amx_bf16" in flags) and bf16_packing_available()


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
           dtype: torch.dtype | None) -> torch.Tensor:
    """q [nh, q, hd], k/v [nkv, span, hd], mask [q, span] -> [nh, q, hd] in q's dtype; computed in `dtype`
    (float64: see sdpa_row_invariant) or, None, in q's own."""
    if dtype is None:
        return F.scaled_dot_product_attention(q[None], k[None], v[None], attn_mask=mask, enable_gqa=True)[0]
    out = F.scaled_dot_product_attention(q[None].to(dtype), k[None].to(dtype), v[None].to(dtype), attn_mask=mask,
                                         enable_gqa=True)
    return out[0].to(q.dtype)


@functools.cache
def sdpa_row_invariant() -> bool:
    """Whether torch's CPU attention gives a query row the same bits alone and among other rows (checked once
    per process). Tree speculation is exact only if it does: a tree row and plain decoding's single row must
    round alike. A tree call differs from the single row in two ways, both checked: more query rows, and more
    keys (the tree's own, masked out for the root), so the row's span is longer. On the AVX-512 development
    CPUs both gave the same bits; on an AVX2-only EPYC (Zen3) neither did (rows 1-3 of each block of 32 query
    rows, and trailing masked keys, changed the last bits), nor on a Xeon with AMX or a Zen4 EPYC. The fast
    verifier then attends with rest_lsp/model/attention.py's kernel, exact by construction, or in float64 where
    that kernel cannot be built (as rest_lsp/model/static.py always does): results agree to ~1e-16 whatever the
    kernel's order, far below the rounding to fp32 that follows. The cost of float64 there: a 1,536-token
    prefill of the embedded model 11.5 -> 14.0-14.7 s, an 8-row step +17% (docs/cpu.md)."""
    return rows_alike(lambda q, k, v, mask: attend(q, k, v, mask, None))


def rows_alike(attention) -> bool:
    """Whether `attention(q [nh, n, hd], k, v [nkv, span, hd], mask [n, span])` gives each query row the same bits
    alone (over its own span) as among 1-69 rows whose span grows as a draft tree's does, after 41 and 300
    cached keys: sdpa_row_invariant's probe, also run on the compiled tree attention before it is used."""
    g = torch.Generator().manual_seed(0)
    n, keys = 70, 400
    q, k, v = (torch.randn(shape, generator=g) for shape in ((4, n, 64), (2, keys, 64), (2, keys, 64)))
    for past in (41, 300):
        mask = torch.zeros(n, past + n, dtype=torch.bool)
        mask[:, :past] = True
        mask[:, past] = True  # every row sees the root (row 0) ...
        mask[torch.arange(n), past + torch.arange(n)] = True  # ... and itself: siblings below the root
        full = attention(q, k[:, :past + n], v[:, :past + n], mask)
        for m in range(1, n):
            if not torch.equal(attention(q[:, :m], k[:, :past + m], v[:, :past + m], mask[:m, :past + m]),
                               full[:, :m]):
                return False
    return True


@functools.cache
def eager_row_invariant(dtype: torch.dtype = torch.float32) -> bool:
    """Whether transformers' own forward (`eager`, HFVerifier: the fallback for architectures the fast paths do
    not run) gives a row the same bits alone and among other rows on this CPU: its attention (as
    `sdpa_row_invariant`) and its products (F.linear with 1-33 rows against 40). Where it does not (an AVX2-only
    EPYC: all six tiny test models' root rows differed, docs/cpu.md), REST through it can part from plain
    decoding at a near tie; the daemon says so (`ModelLimits.exact_trees`)."""
    if not sdpa_row_invariant():
        return False
    g = torch.Generator().manual_seed(1)
    x, w = torch.randn(40, 512, generator=g).to(dtype), torch.randn(1024, 512, generator=g).to(dtype)
    full = F.linear(x, w)
    return all(torch.equal(F.linear(x[:m], w), full[:m]) for m in (1, 2, 3, 4, 5, 8, 13, 33))
