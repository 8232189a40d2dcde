"""Exact attention for draft-tree rows where torch's CPU attention is not row-invariant: one compiled kernel
(kernels/attention.cpp) instead of float64.

    tree_attention(dtype, heads) -> TreeAttention | None   the kernel for a cache of this dtype (fp32, bf16), or
                             None (no compiler, another dtype, REST_LSP_ATTENTION=float64, its own check failed,
                             or measured slower than float64 attention on this CPU)
    TreeAttention(q [nh, nq, hd], k [nkv, span, hd], v [nkv, span, hd], mask [nq, span]) -> [nh, nq, hd] in q's dtype

Why: exact speculation needs a tree row to get the same bits as plain decoding's single row (probes.py
`sdpa_row_invariant`). torch's attention does not give them on the AVX2 EPYC, the AMX Xeon or the Zen4 EPYC
this project has run on, so the packed verifier attended in float64 there, and float64 attention grows with the
cached tokens: on a 2-core Zen4 EPYC, 4 rows of the 0.5B model over 1,200 cached tokens cost 0.59 ms a layer
(14 ms of a ~60 ms step over 24 layers) against 0.33 ms for bf16 SDPA, which is not exact. This kernel gives the
same bits by construction, in fp32 arithmetic over the cache as it is: 0.18 ms a layer there (docs/cpu.md).

How a row stays bit-identical: every operation on a score or a weight is elementwise on vectors of the CPU's width
(16 lanes with AVX-512, 8 with AVX2: wider ones spill to the stack, and 16 lanes built for AVX2 ran 13x slower
than 8; the same operations in every lane), the weighted sum of values visits the keys in slot order, and the
weights' sum adds them in lanes by each key's rank among the row's visible keys (a tree's path sits in scattered
slots, which plain decoding holds side by side), reduced in a fixed order; a key hidden from the row (another
branch of the tree, the padding of a tile) gets weight exactly 0, and adding 0 changes no sum. The other rows of a
call and the length of the span change nothing. The compiler is told not to fuse or reorder on its own
(-ffp-contract=off; the dot products' multiply-adds are fused where written, in every lane alike), and
`rows_alike` checks the compiled kernel once per process before it is used (a compiler that vectorises otherwise:
float64), as the load-time check of every verifier checks a kept tree path against single rows
(rest_lsp/model/verifiers.py).

Worked example (one head, hd = 1, scale 1): keys k = (1, 2), values v = (10, 20), q = 1. Plain decoding's row sees
both keys: weights exp(1 - 2), exp(0) = 0.368, 1, so (3.68 + 20) / 1.368 = 17.31. In a tree call with a third
key (a sibling's, hidden from this row) the row's weights are (0.368, 1, 0): the same sums, the same bits.

Built once per source, compiler and CPU (-march=native) under the cache root's `kernels/` with the system's C++
compiler (about 1 s), loaded with ctypes; the kernel runs its key/value heads on torch's own OpenMP threads (the
same libgomp.so.1 that torch loaded).
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import shutil
import statistics
import subprocess
import time
from pathlib import Path
from typing import Callable

import torch

from .probes import attend, rows_alike

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("kernels") / "attention.cpp"
FLAGS = ["-std=c++17", "-O3", "-ffp-contract=off", "-fno-fast-math", "-fPIC", "-shared"]
DTYPES = {torch.float32: "rest_attend_f32", torch.bfloat16: "rest_attend_bf16"}
# the kernel is kept unless clearly slower than float64 (everywhere measured it is 2-5x faster, docs/cpu.md): the
# 16-lane build ran 13x slower on AVX2 code, and a CPU nobody measured could hide another such case
SLOWER = 1.2
_P = ctypes.c_void_p
_ARGS = [_P, _P, _P, ctypes.c_int64, _P, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int,
         ctypes.c_float, _P]


class TreeAttention:
    """The compiled kernel for one cache dtype; called as `probes.attend` is, without its dtype."""

    def __init__(self, lib: ctypes.CDLL, dtype: torch.dtype, tag: str):
        self.fn = getattr(lib, DTYPES[dtype])
        self.fn.argtypes, self.fn.restype = _ARGS, ctypes.c_int
        self.dtype = dtype
        self.tag = tag  # which build: part of the cost cache's key (rest_lsp/engine/cost.py)

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        nh, nq, hd = q.shape
        nkv, span = k.shape[0], k.shape[1]
        if k.dtype != self.dtype or v.dtype != self.dtype or k.shape != v.shape or k.shape[2] != hd \
                or k.stride() != v.stride() or k.stride()[1:] != (hd, 1) or mask.shape != (nq, span):
            raise ValueError(f"tree attention: keys and values must be {self.dtype} [nkv, span, hd] rows of one "
                             f"cache layout, mask [{nq}, {span}]; got {tuple(k.shape)} {k.dtype} {k.stride()}, "
                             f"mask {tuple(mask.shape)}")
        qf = q.to(torch.float32).contiguous()
        m = mask.to(torch.bool).contiguous()
        out = torch.empty(nh, nq, hd)
        rc = self.fn(qf.data_ptr(), k.data_ptr(), v.data_ptr(), k.stride(0), m.data_ptr(), nh, nkv, nq, span, hd,
                     hd ** -0.5, out.data_ptr())
        if rc:
            raise ValueError(f"tree attention: {nh} query heads over {nkv} key/value heads, {nq} rows, {span} keys")
        return out.to(q.dtype)

    @property
    def address(self) -> int:
        """The kernel function's address, for compiled callers (decode_layer.py)."""
        return ctypes.cast(self.fn, ctypes.c_void_p).value

    def rows_alike(self) -> bool:
        """probes.rows_alike, the probe torch's attention is judged by, on this build (inputs in its dtype)."""
        d = self.dtype
        return rows_alike(lambda q, k, v, mask: self(q.to(d), k.to(d), v.to(d), mask))


def _compiler() -> str | None:
    for name in (os.environ.get("CXX"), "g++", "c++"):
        if name and shutil.which(name):
            return name
    return None


def _cpu() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""
    lines = [l for l in text.splitlines() if l.startswith(("model name", "flags"))]
    return "\n".join(lines[:2])


def build_library(march: str = "native") -> tuple[ctypes.CDLL, str]:
    """The kernel's library for this source, compiler and CPU: built once (atomically), then loaded. `march`
    another target than this CPU (the tests build narrower vector widths, as an AVX2-only CPU's)."""
    from restbase.storage import cache_root, tmp_name

    cxx = _compiler()
    if cxx is None:
        raise RuntimeError("no C++ compiler (g++, c++ or $CXX)")
    version = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30).stdout
    flags = [*FLAGS, f"-march={march}"]
    digest = hashlib.sha256("\0".join([SOURCE.read_text(), " ".join(flags), version, _cpu()]).encode()).hexdigest()
    tag = digest[:16]
    out = cache_root() / "kernels" / f"attention-{tag}.so"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = tmp_name(out)
        errors = ""
        for openmp in (["-fopenmp"], []):  # without OpenMP (a compiler without libgomp): one thread
            r = subprocess.run([cxx, *flags, *openmp, str(SOURCE), "-o", str(tmp)], capture_output=True, text=True,
                               timeout=300)
            if r.returncode == 0:
                break
            errors = r.stderr.strip()[-400:]
        else:
            raise RuntimeError(f"{cxx} failed: {errors}")
        os.replace(tmp, out)
    return ctypes.CDLL(str(out)), tag


def interleaved_ms(arms: dict[str, Callable[[], object]], *, rounds: int, calls: int) -> dict[str, float]:
    """Median ms of one call of each arm: one call each first (OpenMP's threads start), then `rounds` rounds of
    `calls` calls, the arms in turn within a round, so that a busy CPU slows them alike."""
    for fn in arms.values():
        fn()
    times: dict[str, list[float]] = {a: [] for a in arms}
    for _ in range(rounds):
        for a, fn in arms.items():
            t = time.perf_counter()
            for _ in range(calls):
                fn()
            times[a].append((time.perf_counter() - t) / calls * 1e3)
    return {a: statistics.median(t) for a, t in times.items()}


def timings(att: TreeAttention, heads: tuple[int, int, int], *, cached: int = 1200, rows: int = 4,
            rounds: int = 5) -> tuple[float, float]:
    """Median ms of one call of the kernel and of float64 attention (the fallback) on `rows` tree rows of a
    model with `heads` (query heads, key/value heads, head size) over `cached` keys (`interleaved_ms`, 3 calls a
    round)."""
    nh, nkv, hd = heads
    g = torch.Generator().manual_seed(0)
    q = torch.randn(nh, rows, hd, generator=g).to(att.dtype)
    k, v = (torch.randn(nkv, cached + rows, hd, generator=g).to(att.dtype) for _ in range(2))
    mask = torch.ones(rows, cached + rows, dtype=torch.bool)
    mask[:, cached:] = torch.eye(rows, dtype=torch.bool) | (torch.arange(rows) == 0)  # root and self
    ms = interleaved_ms({"kernel": lambda: att(q, k, v, mask), "float64": lambda: attend(q, k, v, mask, torch.float64)},
                        rounds=rounds, calls=3)
    return ms["kernel"], ms["float64"]


@functools.cache
def tree_attention(dtype: torch.dtype, heads: tuple[int, int, int] = (14, 2, 64)) -> TreeAttention | None:
    """The kernel for a cache of `dtype` and a model with `heads` (query heads, key/value heads, head size:
    default the embedded 0.5B's), once per process: None where it cannot be built, is not exact on this CPU
    (`rows_alike`), or is slower here than the float64 attention it replaces (`SLOWER`)."""
    if os.environ.get("REST_LSP_ATTENTION", "auto") == "float64" or dtype not in DTYPES:
        return None
    try:
        lib, tag = build_library()
        att = TreeAttention(lib, dtype, tag)
    except (OSError, RuntimeError, subprocess.SubprocessError) as e:
        log.warning("tree attention: the compiled kernel is not available (%s); float64 attention is used", e)
        return None
    if not att.rows_alike():
        log.warning("tree attention: the compiled kernel's rows differ alone and in a tree on this CPU; float64 "
                    "attention is used")
        return None
    kernel_ms, float64_ms = timings(att, heads)
    if kernel_ms > SLOWER * float64_ms:
        log.warning("tree attention: the compiled kernel is slower on this CPU than float64 attention (%.3f against "
                    "%.3f ms a layer); float64 attention is used", kernel_ms, float64_ms)
        return None
    log.info("tree attention: the compiled kernel, %.3f ms a layer against float64's %.3f", kernel_ms, float64_ms)
    return att
