"""int4w: the GGUF's own Q4_K blocks as 4-bit products (rest_lsp/model/int4weight.py).

The decoding is checked against gguf's own dequantization (an independent implementation), the model against
a tiny Qwen2 whose weights are what random Q4_K blocks decode to, and REST over the int4w model against
transformers' own greedy `generate` on the same model (never engine against engine)."""
from __future__ import annotations

import dataclasses
import os
import time

import numpy as np
import pytest
import torch

from rest_lsp.model.int4weight import (Int4WeightLinear, Parts, dequantize, fuse_weight_only, pack, q4k_groups,
                                       quantize_from_gguf, weight_int4_exact)
from rest_lsp.model import gguf_amx
from rest_lsp.model.int4weight import BlockLinear
from rest_lsp.model.int8weight import Int8WeightLinear

needs_kernel = pytest.mark.skipif(not weight_int4_exact(), reason="int4w is refused where its kernel is missing or "
                                  "not batch-invariant")


def test_q4k_decoding_is_ggufs_own():
    import gguf

    rng = np.random.default_rng(1)
    raw = rng.integers(0, 256, (48, 3 * 144), dtype=np.uint8)  # every bit pattern of scales, mins and values
    raw.reshape(48, 3, 144)[..., 0:4] = np.array([0.0123, 0.0071], np.float16).view(np.uint8)
    ref = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType.Q4_K).reshape(48, 768)
    q, scale, low = q4k_groups(raw, 768)
    assert q.min() == 0 and q.max() == 15 and scale.shape == (48, 24)
    assert torch.equal(dequantize(q, scale, low), torch.from_numpy(ref))


def test_the_docstrings_worked_example():
    block = np.zeros((1, 144), np.uint8)
    block[0, 0:4] = np.array([0.5, 0.25], np.float16).view(np.uint8)
    block[0, 4], block[0, 8], block[0, 16] = 3, 2, 0x7A  # group 0: sc 3, m 2; first value byte
    block[0, 5], block[0, 9] = 1, 5  # group 1: sc 1, m 5
    w = dequantize(*q4k_groups(block, 256))[0]
    assert float(w[0]) == 0.5 * 3 * 0xA - 0.25 * 2
    assert float(w[32]) == 0.5 * 1 * 7 - 0.25 * 5


def test_a_wrong_width_is_refused():
    with pytest.raises(ValueError, match="Q4_K rows of width 512"):
        q4k_groups(np.zeros((16, 144), np.uint8), 512)


@needs_kernel
def test_products_match_the_decoded_weights_and_fuse_exactly():
    from testmodels.tiny import random_q4k_blocks

    rng = np.random.default_rng(2)
    raws = [random_q4k_blocks(n, 512, rng) for n in (192, 64, 48)]
    layers = [Int4WeightLinear.from_q4k(r, 512) for r in raws]
    x = torch.randn(5, 512)
    for layer, raw in zip(layers, raws):
        ref = x @ dequantize(*q4k_groups(raw, 512)).T
        # bf16 activations, scale and zero: within bf16's rounding of a 512-term sum, far from the weights' own
        assert torch.allclose(layer(x), ref, rtol=0.03, atol=0.05 * float(ref.abs().max()))
    fused = fuse_weight_only(*layers)
    assert isinstance(fused, Int4WeightLinear)
    assert torch.equal(fused(x), torch.cat([m(x) for m in layers], dim=1))
    # a layer before the last that does not fill whole 64-row blocks cannot share torch's packing (parts);
    # the AMX kernel's blocks are 16 columns wide, so there it fuses
    odd = Int4WeightLinear.from_q4k(random_q4k_blocks(48, 512, rng), 512)
    parts = fuse_weight_only(odd, layers[0])
    assert isinstance(parts, Int4WeightLinear if odd.amx else Parts)
    assert torch.equal(parts(x), torch.cat([odd(x), layers[0](x)], dim=1))


def test_torchs_kernel_packing_fuses_only_whole_blocks():
    from testmodels.tiny import random_q4k_blocks

    if not hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu"):
        pytest.skip("this torch build has no CPU int4 kernel")
    rng = np.random.default_rng(3)
    odd, whole = (Int4WeightLinear(pack(*q4k_groups(random_q4k_blocks(n, 512, rng), 512)), None) for n in (48, 64))
    assert not odd.amx
    x = torch.randn(3, 512)
    parts = fuse_weight_only(odd, whole)
    assert isinstance(parts, Parts)
    assert torch.equal(parts(x), torch.cat([odd(x), whole(x)], dim=1))


@pytest.fixture(scope="module")
def q4k_model(tmp_path_factory):
    from testmodels.tiny import make_tiny_q4k_model

    return make_tiny_q4k_model(tmp_path_factory.mktemp("q4k") / "model",
                               q8_layers=("model.layers.1.self_attn.v_proj", "model.layers.0.mlp.down_proj"),
                               q6_layers=("model.layers.1.mlp.down_proj",))


def int4w_model(q4k_model):
    """(the fp32 LoadedModel, the same converted to int4w in place as precision auto converts it)."""
    from rest_lsp.model.host import load_model
    from rest_lsp.model.precision import as_precision

    model_dir, gguf_file = q4k_model
    lm = load_model(str(model_dir), device="cpu", precision="fp32")
    return lm, as_precision(dataclasses.replace(lm, gguf=gguf_file), "int4w")


@needs_kernel
def test_q4k_layers_become_int4_and_the_others_int8(q4k_model):
    from rest_lsp.model.host import load_model

    model_dir, gguf_file = q4k_model
    lm = load_model(str(model_dir), device="cpu", precision="fp32")
    layers = lm.model.model.layers
    counts = quantize_from_gguf(lm.model, gguf_file)
    # 2 x 7 projections + the head: two stored as Q8_0, one as Q6_K (their own blocks where the AMX kernel runs)
    amx = gguf_amx.kernel() is not None
    assert counts == {"int4": 12, "blocks": 3 if amx else 0, "int8": 0 if amx else 3}
    assert type(layers[0].self_attn.q_proj) is Int4WeightLinear
    for q8_0 in (layers[1].self_attn.v_proj, layers[0].mlp.down_proj):
        assert isinstance(q8_0, BlockLinear if amx else Int8WeightLinear)
    assert isinstance(layers[1].mlp.down_proj, BlockLinear if amx else Int8WeightLinear)
    assert type(lm.model.lm_head) is Int4WeightLinear


@needs_kernel
def test_blocks_that_do_not_decode_to_the_weight_are_not_used(q4k_model, monkeypatch):
    from rest_lsp.model import packed_cache
    from rest_lsp.model.host import load_model

    # the weights change in memory here, not in the files packed_cache's key is made of: nothing kept
    monkeypatch.setattr(packed_cache, "cache_key", lambda *a: None)
    model_dir, gguf_file = q4k_model
    lm = load_model(str(model_dir), device="cpu", precision="fp32")
    with torch.no_grad():
        lm.model.model.layers[0].self_attn.q_proj.weight[3, 7] += 1e-3  # a converter that changed one weight
    quantize_from_gguf(lm.model, gguf_file)
    assert isinstance(lm.model.model.layers[0].self_attn.q_proj, Int8WeightLinear)
    assert isinstance(lm.model.model.layers[0].self_attn.k_proj, Int4WeightLinear)
    lm = load_model(str(model_dir), device="cpu", precision="fp32")
    with torch.no_grad():
        lm.model.model.layers[1].mlp.down_proj.weight[0, 0] += 1e-3  # the Q6_K layer
    quantize_from_gguf(lm.model, gguf_file)
    assert type(lm.model.model.layers[1].mlp.down_proj) is Int8WeightLinear


def test_int4w_needs_a_gguf(q4k_model):
    from rest_lsp.model.host import ModelLoadError, load_model

    with pytest.raises(ModelLoadError, match="int4w.*GGUF"):
        load_model(str(q4k_model[0]), device="cpu", precision="int4w")


@needs_kernel
def test_int4w_follows_the_float_model(q4k_model):
    from rest_lsp.model.host import load_model

    _, lm4 = int4w_model(q4k_model)
    ref = load_model(str(q4k_model[0]), device="cpu", precision="fp32")
    ids = torch.tensor([ref.tokenizer.encode("def moving_average(values, window):\n    total = 0\n")])
    # a call of up to MAX_ROWS rows, as a step or a tree makes: more take the float layers (`wide`, fp32 where
    # the CPU has no native bf16, as on an AVX2-only one: then fp32's own logits)
    ids = ids[:, :Int4WeightLinear.MAX_ROWS]
    with torch.no_grad():
        a, b = ref.model(ids).logits[0], lm4.model(ids).logits[0]
    assert not torch.equal(a, b)  # int4 products, not the float layers
    agree = (a.argmax(-1) == b.argmax(-1)).float().mean()
    assert agree >= 0.8, f"int4w's greedy tokens agree with fp32's at {float(agree):.2f} of positions"


@needs_kernel
def test_prompts_on_the_kernel_keep_no_float_layer(q4k_model, monkeypatch):
    """Where int4weight.prompts_on_kernel says so (the avx2 build, a model measured so), every 4-bit layer computes
    calls of any number of rows on its blocks and holds no float copy: a prompt chunk's rows get the bits they
    get one at a time, and a model's logits over more than MAX_ROWS tokens are no longer the float layers'."""
    from rest_lsp.model import int4weight
    from rest_lsp.model.probes import cpu_has_bf16

    ref, floats = int4w_model(q4k_model)
    monkeypatch.setattr(int4weight, "prompts_on_kernel", lambda name: name == ref.name)
    _, kernel = int4w_model(q4k_model)
    layers = [m for m in kernel.model.modules() if isinstance(m, Int4WeightLinear)]
    assert len(layers) == 15 and all(m.wide is None for m in layers)
    assert all(m.wide is not None for m in floats.model.modules() if isinstance(m, Int4WeightLinear))
    q_proj = kernel.model.model.layers[0].self_attn.q_proj
    x = torch.randn(3 * Int4WeightLinear.MAX_ROWS, q_proj.in_features, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(q_proj(x), torch.cat([q_proj(x[i:i + 1]) for i in range(len(x))]))
        ids = torch.tensor([ref.tokenizer.encode("def moving_average(values, window):\n    total = 0\n    for v in values:\n")])
        assert ids.shape[1] > Int4WeightLinear.MAX_ROWS
        a, b, c = (m.model(ids).logits[0] for m in (ref, floats, kernel))
    assert not torch.equal(b, c) and not torch.equal(a, c)
    if not cpu_has_bf16():  # more than MAX_ROWS rows: the float layers, fp32 here, so fp32's own logits
        assert torch.equal(a, b)


def _layer_kinds(model) -> dict[str, type]:
    return {name: type(m) for name, m in model.named_modules() if isinstance(m, (Int4WeightLinear, Int8WeightLinear))}


def _gguf_reads(monkeypatch) -> list[str]:
    """The GGUF files opened by gguf's reader from now on."""
    import gguf

    reads, real = [], gguf.GGUFReader

    def reader(path, *a, **k):
        reads.append(str(path))
        return real(path, *a, **k)
    monkeypatch.setattr(gguf, "GGUFReader", reader)
    return reads


@needs_kernel
def test_a_later_start_reads_the_kept_layers_and_computes_the_same_bits(q4k_model, tmp_path, monkeypatch):
    """packed_cache: the second int4w build of a model reads what the first kept, not the GGUF, and its
    products are bit-identical to the first's, for one row and for a tree's rows."""
    import shutil

    from rest_lsp.model.host import load_model

    monkeypatch.setenv("REST_LSP_CACHE", str(tmp_path / "cache"))
    model_dir = tmp_path / "model"
    shutil.copytree(q4k_model[0], model_dir)
    gguf_file = q4k_model[1]
    reads = _gguf_reads(monkeypatch)
    built = []
    for _ in range(2):
        lm = load_model(str(model_dir), device="cpu", precision="fp32")
        counts = quantize_from_gguf(lm.model, gguf_file)
        built.append((lm, counts))
    assert reads == [str(gguf_file)]  # the first build only
    (a, ca), (b, cb) = built
    assert ca == cb and ca["int4"] == 12, (ca, cb)
    assert _layer_kinds(a.model) == _layer_kinds(b.model)
    ids = torch.tensor([a.tokenizer.encode("def moving_average(values, window):\n    total = 0\n")])
    with torch.no_grad():
        for rows in (ids[:, :1], ids[:, :9]):  # one row; a tree's worth (int4 products up to MAX_ROWS)
            assert torch.equal(a.model(rows).logits, b.model(rows).logits)
    assert len(list((tmp_path / "cache" / "packed").iterdir())) == 1

    # a new conversion of the model (its weight file rewritten): decoded and checked again, replacing the entry
    weights = model_dir / "model.safetensors"
    os.utime(weights, ns=(weights.stat().st_atime_ns, weights.stat().st_mtime_ns + 10**9))
    c = load_model(str(model_dir), device="cpu", precision="fp32")
    assert quantize_from_gguf(c.model, gguf_file) == ca
    assert len(reads) == 2
    assert len(list((tmp_path / "cache" / "packed").iterdir())) == 1


@needs_kernel
def test_a_damaged_kept_entry_is_rebuilt_from_the_gguf(q4k_model, tmp_path, monkeypatch, caplog):
    from rest_lsp.model.host import load_model

    monkeypatch.setenv("REST_LSP_CACHE", str(tmp_path / "cache"))
    model_dir, gguf_file = q4k_model
    reads = _gguf_reads(monkeypatch)
    first = load_model(str(model_dir), device="cpu", precision="fp32")
    counts = quantize_from_gguf(first.model, gguf_file)
    (entry,) = (tmp_path / "cache" / "packed").iterdir()
    entry.write_bytes(entry.read_bytes()[: entry.stat().st_size // 2])  # a torn write (a crash, a full disk)
    again = load_model(str(model_dir), device="cpu", precision="fp32")
    assert quantize_from_gguf(again.model, gguf_file) == counts
    assert len(reads) == 2 and "unreadable" in caplog.text
    ids = torch.tensor([first.tokenizer.encode("x = [i * i for i in range(10)]\n")])
    with torch.no_grad():
        assert torch.equal(first.model(ids[:, :5]).logits, again.model(ids[:, :5]).logits)
    third = load_model(str(model_dir), device="cpu", precision="fp32")
    quantize_from_gguf(third.model, gguf_file)
    assert len(reads) == 2  # the rewritten entry serves


def test_kept_entries_stay_within_their_budget(tmp_path, monkeypatch):
    """The least recently used entries go first once KEPT_FILES (or KEPT_BYTES) is passed; a read counts as a use."""
    from rest_lsp.model import packed_cache
    from rest_lsp.model.gguf_amx import QBlocks

    monkeypatch.setenv("REST_LSP_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(packed_cache, "KEPT_FILES", 2)
    layer = Int4WeightLinear(QBlocks(torch.zeros(1, 64, 32, dtype=torch.uint8), torch.zeros(1, 1, 2, 16),
                                     torch.zeros(1, 8, 2, 16, dtype=torch.uint8)), None)
    ggufs = [tmp_path / f"m{i}.gguf" for i in range(3)]
    for g in ggufs:
        g.write_bytes(b"GGUF")
    packed_cache.save(ggufs[0], "k0", {"l": layer})
    time.sleep(0.01)
    packed_cache.save(ggufs[1], "k1", {"l": layer})
    time.sleep(0.01)
    assert set(packed_cache.load(ggufs[0], "k0")) == {"l"}  # used: now the most recent
    time.sleep(0.01)
    packed_cache.save(ggufs[2], "k2", {"l": layer})
    assert packed_cache.load(ggufs[1], "k1") is None
    kept = packed_cache.load(ggufs[0], "k0")["l"]
    assert kept.kind == "int4" and all(torch.equal(x, y) for x, y in zip(kept.blocks, layer.blocks))
    assert packed_cache.load(ggufs[2], "k2") is not None
    assert packed_cache.load(ggufs[2], "another key") is None
