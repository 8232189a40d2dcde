"""The compiled tree attention (rest_lsp/model/attention.py): a query row gets the same bits alone as among any other
rows of a draft tree, over the same model-dtype cache, and the values attention has (float64 attention's, within
fp32 rounding)."""
from __future__ import annotations

import os
import platform
import shutil

import pytest
import torch

from rest_lsp.model import attention as attention_module
from rest_lsp.model.attention import TreeAttention, tree_attention
from rest_lsp.model.probes import attend, rows_alike

if shutil.which("g++") is None and shutil.which("c++") is None:
    pytest.skip("no C++ compiler: the daemon attends in float64 here", allow_module_level=True)


def random_tree(n: int, g: torch.Generator) -> torch.Tensor:
    """A draft tree's mask [n, n]: node 0 the root, every other node below an earlier one, each seeing its
    ancestors and itself."""
    mask = torch.eye(n, dtype=torch.bool)
    for i in range(1, n):
        parent = int(torch.randint(0, i, (1,), generator=g))
        mask[i] |= mask[parent]
    return mask


def chain_of(tree: torch.Tensor, row: int) -> list[int]:
    return [int(i) for i in torch.nonzero(tree[row]).flatten()]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("nh,nkv,hd", [(14, 2, 64), (12, 2, 128), (4, 4, 24), (6, 1, 16)])
def test_a_tree_row_has_the_bits_of_the_same_row_decoded_alone(dtype, nh, nkv, hd):
    """Plain decoding computes a node's row with only its ancestors after the cached keys (a chain); the tree
    computes it among siblings, cousins and their keys. Both must give the same bits, for every node, whatever
    the cache length (not a multiple of the kernel's lanes or tiles)."""
    att = tree_attention(dtype)
    assert att is not None
    assert_tree_rows_exact(att, dtype, nh, nkv, hd)


def cpu_has(*flags: str) -> bool:
    text = open("/proc/cpuinfo").read() if os.path.exists("/proc/cpuinfo") else ""
    have = next((l.split(":", 1)[1].split() for l in text.splitlines() if l.startswith("flags")), [])
    return all(f in have for f in flags)


@pytest.mark.parametrize("march", ["x86-64", "haswell"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_narrower_vectors_keep_tree_rows_exact(march, dtype):
    """Built for another CPU's vector width than this one's (4 lanes without AVX, 8 with AVX2 and its fused
    multiply-adds), as on an AVX2-only machine: the same guarantee."""
    if platform.machine() not in ("x86_64", "AMD64") or (march == "haswell" and not cpu_has("avx2", "fma", "bmi2")):
        pytest.skip(f"this CPU cannot run a {march} build")
    lib, tag = attention_module.build_library(march)
    att = TreeAttention(lib, dtype, tag)
    assert att.rows_alike()
    for nh, nkv, hd in ((14, 2, 64), (6, 1, 16)):
        assert_tree_rows_exact(att, dtype, nh, nkv, hd)


def assert_tree_rows_exact(att, dtype, nh, nkv, hd):
    g = torch.Generator().manual_seed(hd + nh)
    cache = torch.randn(2, nkv, 512, hd, generator=g).to(dtype)
    for past, n in ((1, 5), (37, 16), (300, 23)):
        tree = random_tree(n, g)
        q = torch.randn(nh, n, hd, generator=g).to(dtype)
        mask = torch.cat([torch.ones(n, past, dtype=torch.bool), tree], dim=1)
        span = past + n
        full = att(q, cache[0, :, :span], cache[1, :, :span], mask)
        for row in range(n):
            chain = chain_of(tree, row)  # what plain decoding has in its cache when it reaches this node
            cached = torch.cat([cache[:, :, :past], cache[:, :, [past + i for i in chain]]], dim=2).contiguous()
            alone = att(q[:, row:row + 1], cached[0], cached[1], torch.ones(1, past + len(chain), dtype=torch.bool))
            assert torch.equal(alone[:, 0], full[:, row]), (past, n, row)
        want = attend(q, cache[0, :, :span], cache[1, :, :span], mask, torch.float64)
        tol = 1e-5 if dtype == torch.float32 else 1e-2
        torch.testing.assert_close(full, want, atol=tol, rtol=tol)


def test_it_passes_the_row_probe_that_torch_attention_is_judged_by_and_the_probe_can_fail():
    att = tree_attention(torch.float32)
    assert rows_alike(att)

    def counts_rows(q, k, v, mask):  # an attention whose rows change with the call's row count
        return att(q, k, v, mask) * (1 + 1e-6 * q.shape[1])

    assert not rows_alike(counts_rows)


def test_bad_shapes_and_dtypes_are_refused_with_the_reason():
    att = tree_attention(torch.bfloat16)
    q, kv = torch.randn(4, 2, 16), torch.randn(2, 2, 8, 16)
    with pytest.raises(ValueError, match="bfloat16"):
        att(q, kv[0], kv[1], torch.ones(2, 8, dtype=torch.bool))  # fp32 keys for the bf16 kernel
    kv = kv.bfloat16()
    with pytest.raises(ValueError, match="mask"):
        att(q, kv[0], kv[1], torch.ones(2, 7, dtype=torch.bool))
    with pytest.raises(ValueError, match="query heads"):
        att(torch.randn(3, 2, 16), kv[0], kv[1], torch.ones(2, 8, dtype=torch.bool))  # 3 heads over 2


def test_float64_is_kept_when_asked_for_or_for_another_dtype(monkeypatch):
    monkeypatch.setenv("REST_LSP_ATTENTION", "float64")
    tree_attention.cache_clear()
    try:
        assert tree_attention(torch.float32) is None
    finally:
        tree_attention.cache_clear()
    monkeypatch.delenv("REST_LSP_ATTENTION")
    assert tree_attention(torch.float16) is None
    assert tree_attention(torch.float32) is not None


@pytest.mark.parametrize("kernel_ms,float64_ms,kept", [(0.25, 1.1, True), (1.1, 1.0, True), (3.47, 1.1, False)])
def test_a_kernel_slower_than_float64_on_this_cpu_is_not_used(monkeypatch, caplog, kernel_ms, float64_ms, kept):
    """Measured at its first use against the float64 attention it replaces, on the model's heads: kept unless
    clearly slower (the 16-lane build on AVX2 code: 3.47 ms a layer against float64's 1.1)."""
    asked = []

    def timings(att, heads):
        asked.append(heads)
        return kernel_ms, float64_ms

    monkeypatch.setattr(attention_module, "timings", timings)
    tree_attention.cache_clear()
    try:
        with caplog.at_level("INFO", logger="rest_lsp.model.attention"):
            att = tree_attention(torch.float32, (12, 2, 128))
    finally:
        tree_attention.cache_clear()
    assert (att is not None) == kept and asked == [(12, 2, 128)]
    assert ("slower on this CPU" in caplog.text) == (not kept) and f"{kernel_ms:.3f}" in caplog.text


def test_the_kernel_is_timed_on_the_heads_and_the_dtype_asked_for():
    att = tree_attention(torch.bfloat16)
    assert att is not None
    seen = []

    class Spy:
        dtype = att.dtype

        def __call__(self, q, k, v, mask):
            seen.append((tuple(q.shape), tuple(k.shape), k.dtype, int(mask.sum())))
            return att(q, k, v, mask)

    attention_module.timings(Spy(), (6, 1, 16), cached=64, rows=4, rounds=2)
    # one warm-up call and 2 rounds of 3; 4 rows over 64 cached keys, the tree's root and each row itself
    assert seen == [((6, 4, 16), (1, 68, 16), torch.bfloat16, 4 * 64 + 4 + 3)] * 7


def test_a_missing_compiler_falls_back_to_float64(monkeypatch, tmp_path):
    monkeypatch.setenv("REST_LSP_CACHE", str(tmp_path))  # nothing built yet there
    monkeypatch.setattr(attention_module, "_compiler", lambda: None)
    tree_attention.cache_clear()
    try:
        assert tree_attention(torch.float32) is None
    finally:
        tree_attention.cache_clear()


def test_the_daemon_says_how_its_tree_rows_attend(tmp_path):
    """rest/stats `model.trees.attention`: which of the exact paths the verifier took on this CPU."""
    from rest_lsp.engine.verifier import HFVerifier
    from rest_lsp.model.fast import FastVerifier
    from rest_lsp.model.host import load_model
    from rest_lsp.model.probes import sdpa_row_invariant
    from rest_lsp.model.verifiers import attention_kind
    from rest_lsp.service.backend import EngineBackend
    from rest_lsp.service.datastores import DatastoreSet
    from testmodels.tiny import make_tiny_model_dir

    loaded = load_model(make_tiny_model_dir(tmp_path / "m"), device="cpu", precision="fp32")
    backend = EngineBackend(loaded, DatastoreSet())
    here = "model dtype" if sdpa_row_invariant() else "kernel"
    assert backend.describe()["trees"]["attention"] == here
    fast = FastVerifier(loaded.model, max_len=64)
    assert attention_kind(fast) == here
    fast.lm.attention_dtype, fast.lm.tree_attention = torch.float64, None
    assert attention_kind(fast) == "float64"
    fast.lm.tree_attention = tree_attention(torch.float32)
    assert attention_kind(fast) == "kernel"
    assert attention_kind(HFVerifier(loaded.model)) == "transformers"
