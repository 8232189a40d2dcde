"""int4w's decoder layers in one compiled call each (rest_lsp/model/decode_layer.py): the same bits as the packed
verifier's Python loop, for single rows and trees, on a tiny Qwen2 whose layers mix every GGUF format the loop's
products take (Q4_K, a Q4_K q/k beside a Q8_0 v, Q6_K and Q8_0 down projections); the Python loop where a layer
is not GGUF blocks; the interrupt still polled between layers. REST over this path against transformers' own
`generate`: tests/engine/test_precision_exact.py."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from rest_lsp.engine.tree import DraftTree
from rest_lsp.engine.verifier import Interrupted, chain_mask
from rest_lsp.model import gguf_amx
from rest_lsp.model.attention import tree_attention
from rest_lsp.model.fast import FastVerifier
from rest_lsp.model.int4weight import Parts, weight_int4_exact
from rest_lsp.model.int8weight import Int8WeightLinear
from rest_lsp.model.probes import sdpa_row_invariant
from rest_lsp.model.verifiers import check_tree_rows

pytestmark = pytest.mark.skipif(
    not weight_int4_exact() or gguf_amx.kernel() is None or sdpa_row_invariant()
    or tree_attention(torch.float32) is None,
    reason="the compiled layer needs gguf_amx's kernel and the compiled tree attention")


@pytest.fixture(scope="module")
def q4k_model(tmp_path_factory):
    from testmodels.tiny import make_tiny_q4k_model

    return make_tiny_q4k_model(tmp_path_factory.mktemp("q4k") / "model",
                               q8_layers=("model.layers.1.self_attn.v_proj", "model.layers.0.mlp.down_proj"),
                               q6_layers=("model.layers.1.mlp.down_proj",))


def int4w(q4k_model, change=None):
    from rest_lsp.model.host import load_model
    from rest_lsp.model.precision import as_precision

    model_dir, gguf_file = q4k_model
    lm = load_model(str(model_dir), device="cpu", precision="fp32")
    if change:
        with torch.no_grad():
            change(lm.model)
    return as_precision(dataclasses.replace(lm, gguf=gguf_file), "int4w")


class Counted:
    """A compiled layer whose steps are counted (the path taken, not assumed)."""

    def __init__(self, layer, calls: list):
        self.layer, self.calls = layer, calls

    def step(self, *args):
        self.calls.append(1)
        return self.layer.step(*args)


def tree(q: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q rows: a root, then each row a child of a random earlier row -> the engine's tokens, depths, mask [q, q]."""
    g = torch.Generator().manual_seed(seed)
    parents = [-1] + [int(torch.randint(0, i, (1,), generator=g)) for i in range(1, q)]
    depths = [0] * q
    for i in range(1, q):
        depths[i] = depths[parents[i]] + 1
    tokens = torch.randint(0, 200, (q,), generator=g).tolist()
    return DraftTree(tokens, parents, depths, [1.0] * q, [""] * q).tensors()


def test_the_compiled_layers_give_the_python_loops_bits(q4k_model):
    lm = int4w(q4k_model)
    compiled, loop = FastVerifier(lm.model, max_len=128), FastVerifier(lm.model, max_len=128)
    assert compiled.lm.decode_layers is not None and len(compiled.lm.decode_layers) == 2
    assert isinstance(compiled.lm.layers[1].qkv, Parts)  # a Q8_0 v beside the Q4_K q and k
    calls: list = []
    compiled.lm.decode_layers = [Counted(l, calls) for l in compiled.lm.decode_layers]
    loop.lm.decode_layers = None
    ids = torch.tensor(lm.tokenizer.encode("def moving_average(values, window):\n    total = 0\n"))
    for v in (compiled, loop):
        v.forward(ids, torch.arange(len(ids)), chain_mask(len(ids)), prompt=True)
    assert calls == []  # a prompt chunk attends in the model's dtype: the Python loop
    for q, seed in ((1, 0), (4, 1), (9, 2), (16, 3)):
        tokens, depths, mask = tree(q, seed)
        a, b = (v.forward(tokens, depths, mask) for v in (compiled, loop))
        assert torch.equal(a, b), q
        assert torch.equal(compiled.cache, loop.cache), q
        assert len(calls) == 2, q
        calls.clear()
        for v in (compiled, loop):
            v.truncate(len(ids))
    # more rows than the 4-bit products take: the float layers, in the Python loop
    tokens, depths, mask = tree(20, 4)
    assert torch.equal(compiled.forward(tokens, depths, mask), loop.forward(tokens, depths, mask))
    assert calls == []


def test_tree_rows_through_the_compiled_layers_round_as_single_rows(q4k_model):
    lm = int4w(q4k_model)
    v = FastVerifier(lm.model, max_len=128)
    assert v.lm.decode_layers is not None
    check = check_tree_rows(v, lm.tokenizer.encode("import os\nimport sys\n\n\ndef main(argv):\n"))
    assert check.exact, check.reason


def test_a_layer_that_is_not_gguf_blocks_keeps_the_python_loop(q4k_model, monkeypatch):
    from rest_lsp.model import packed_cache

    monkeypatch.setattr(packed_cache, "cache_key", lambda *a: None)  # the weights change in memory only

    def change(model):  # a converter that changed one weight: that layer's blocks are not used (int8w)
        model.model.layers[1].self_attn.o_proj.weight[2, 5] += 1e-3

    lm = int4w(q4k_model, change)
    assert isinstance(lm.model.model.layers[1].self_attn.o_proj, Int8WeightLinear)
    v = FastVerifier(lm.model, max_len=64)
    assert v.lm.decode_layers is None
    ids = torch.arange(3, 12)
    assert torch.isfinite(v.forward(ids, torch.arange(9), chain_mask(9))).all()


@pytest.mark.parametrize("polls", [1, 2])  # before the first layer, between the two
def test_the_interrupt_is_polled_between_compiled_layers(q4k_model, polls):
    lm = int4w(q4k_model)
    a, b = FastVerifier(lm.model, max_len=64), FastVerifier(lm.model, max_len=64)
    ids = torch.arange(3, 15)
    for v in (a, b):
        v.forward(ids, torch.arange(12), chain_mask(12), prompt=True)
    asked = []
    a.interrupt = lambda: asked.append(1) or len(asked) >= polls
    tokens, depths, mask = tree(5, 7)
    with pytest.raises(Interrupted):
        a.forward(tokens, depths, mask)
    assert len(asked) == polls and a.past_len == 12
    a.interrupt = None
    assert torch.equal(a.forward(tokens, depths, mask), b.forward(tokens, depths, mask))
