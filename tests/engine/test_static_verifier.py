"""The static verifier (the GPU path, run here on the CPU): a row's logits are bit-for-bit the same however it
was batched (alone, in a tree, in a prompt chunk, across pieces), so REST through it is plain decoding through
it, in bf16 too; and it stays close to transformers' own forward."""
import pytest
import torch

from rest_lsp.engine import ContextSource, Engine, GenerationConfig
from rest_lsp.engine.cost import measure_cost
from rest_lsp.engine.tree import DraftTree
from rest_lsp.engine.verifier import Verifier, chain_mask
from rest_lsp.model.static import StaticVerifier, UnsupportedModel

from ._models import ScriptedSource, plain_greedy, random_prompt, tiny_model

# root, then two branches interleaved in the flattened order: 0 -> 1 -> 3 -> 5 -> 7 is one path
TREE = DraftTree([5, 9, 11, 13, 12, 2, 3, 7], [-1, 0, 0, 1, 1, 3, 3, 5], [0, 1, 1, 2, 2, 3, 3, 4],
                 [1.0] * 8, [""] * 8)
PATH_ROWS, PATH = [0, 1, 3, 5, 7], [5, 9, 13, 2, 7]


def _chain(v, tokens):
    return v.forward(torch.tensor(tokens), torch.arange(len(tokens)), chain_mask(len(tokens)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [3, 8])   # 3: the tree and the prompt span several pieces
def test_a_rows_logits_do_not_depend_on_its_batch(kind, dtype, rows):
    model = tiny_model(kind, 0).to(dtype)
    prompt = random_prompt(0, 21)
    v = StaticVerifier(model, rows=rows)
    assert isinstance(v, Verifier) and v.kind == "static"
    _chain(v, prompt)
    plain = [v.forward(torch.tensor([t]), torch.zeros(1, dtype=torch.long), chain_mask(1))[0] for t in PATH]
    v.truncate(len(prompt))
    tree = v.forward(*TREE.tensors())
    assert all(torch.equal(tree[r], p) for r, p in zip(PATH_ROWS, plain))
    # the cache a tree step leaves (keep the path) is the one plain decoding left: the next row agrees too
    v.keep(PATH_ROWS)
    after_tree = _chain(v, [4])[0]
    v.truncate(len(prompt) + len(PATH))
    v2 = StaticVerifier(model, rows=rows)
    chunk = _chain(v2, prompt + PATH + [4])   # the whole sequence as one prompt
    assert all(torch.equal(chunk[len(prompt) + i], p) for i, p in enumerate(plain))
    assert torch.equal(chunk[-1], after_tree)
    if dtype == torch.float32:   # and it computes the model: transformers' forward, no cache
        with torch.no_grad():
            hf = model(torch.tensor([prompt + PATH])).logits[0, len(prompt):]
        assert torch.allclose(hf, torch.stack(plain), atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rest_through_it_is_plain_decoding_through_it(kind, dtype):
    model = tiny_model(kind, 1).to(dtype)
    prompt = random_prompt(1, 30)
    n = 40
    plain = Engine(model, verifier=StaticVerifier(model, rows=8), eos_token_ids=[])
    want = plain.generate(prompt, GenerationConfig(max_new_tokens=n)).tokens
    if dtype == torch.float32:
        assert want == plain_greedy(model, prompt, n)
    oracle = ScriptedSource(prompt + want, corrupt_at=4, wrong_branch=0.5)
    engine = Engine(model, [(oracle, 0.6), (ContextSource(), 0.4)], verifier=StaticVerifier(model, rows=8),
                    eos_token_ids=[])
    r = engine.generate(prompt, GenerationConfig(max_new_tokens=n, draft_budget=12))
    assert r.tokens == want and r.steps < n // 2
    # a second call reuses the cache (prefix reuse, then more drafts) and stays exact
    r2 = engine.generate(prompt + want[:10], GenerationConfig(max_new_tokens=20, draft_budget=12))
    assert r2.reused_tokens > len(prompt) and r2.tokens == want[10:30]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("arch", ["qwen3", "starcoder2"])
def test_other_architectures_through_it_batch_invariant_and_exact(arch, dtype):
    # Qwen3's per-head q/k norms, StarCoder2's LayerNorm and GELU MLP (the `kind` fixture's two have neither)
    test_a_rows_logits_do_not_depend_on_its_batch(arch, dtype, 3)
    test_rest_through_it_is_plain_decoding_through_it(arch, dtype)


def test_state_export_import_rows_and_limits():
    model = tiny_model("llama", 2)
    prompt = random_prompt(2, 12)
    v = StaticVerifier(model, rows=4, max_len=64)
    _chain(v, prompt)
    saved = v.export_state()
    assert saved.length == len(prompt) and saved.nbytes > 0
    first = _chain(v, [3, 4])
    _chain(v, [9, 9, 9])
    v.import_state(saved)
    assert v.past_len == len(prompt) and torch.equal(_chain(v, [3, 4]), first)
    only_last = v.forward(torch.tensor([1, 2, 3]), torch.arange(3), chain_mask(3), rows=[2])
    assert only_last.shape == (1, v.vocab_size)
    with pytest.raises(ValueError, match="exceed"):
        _chain(v, list(range(60)))
    with pytest.raises(UnsupportedModel, match="CUDA device"):
        StaticVerifier(model, graphs=True)
    # the engine's own calibration runs through it (on a GPU: on the device)
    c = measure_cost(v, v.vocab_size, qs=(1, 2, 5), past=8, repeats=1)
    assert c.qs == [1, 2, 5] and all(m > 0 for m in c.ms) and v.past_len == 0


def test_verifier_kinds_pick_it(tmp_path):
    from rest_lsp.model.verifiers import make_verifier, make_verifier_or_eager, verifier_kind

    model = tiny_model("qwen2", 0)
    assert verifier_kind(make_verifier_or_eager(model, "static")) == "static"
    assert verifier_kind(make_verifier(model, "auto")) != "static"   # on the CPU: the prepacked verifier
    from transformers import GPT2Config, GPT2LMHeadModel

    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64)).eval()
    with pytest.raises(UnsupportedModel, match="architecture 'gpt2'"):
        make_verifier(gpt2, "static")


def test_the_graph_path_plumbing_with_an_eager_stand_in():
    """The CUDA-graph path (static inputs per span, outputs copied out before the next replay, spare slots
    for the capture) with the capture replaced by running the function again: what the graphs replay."""
    model = tiny_model("llama", 3)
    prompt = random_prompt(3, 40)
    ref = StaticVerifier(model, rows=4, span_step=16)
    v = StaticVerifier(model, rows=4, span_step=16)
    v.graphs, captured = True, []

    def eager_grapher(fn):
        out = fn()
        captured.append(out)
        return (lambda: out.copy_(fn())), out

    v._grapher = eager_grapher
    for w in (ref, v):
        _chain(w, prompt)
    a, b = ref.forward(*TREE.tensors()), v.forward(*TREE.tensors())
    assert torch.equal(a, b) and len(v._graphs) >= 2 and len(captured) == len(v._graphs)   # one per span
    for w in (ref, v):
        w.keep(PATH_ROWS)
    assert torch.equal(_chain(ref, [4, 5, 6]), _chain(v, [4, 5, 6]))   # and the cache they leave is the same
