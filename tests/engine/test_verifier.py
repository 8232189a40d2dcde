import pytest
import torch

from rest_lsp.engine.tree import DraftTree
from rest_lsp.engine.verifier import HFVerifier, Verifier, chain_mask

from ._models import plain_greedy, random_prompt, tiny_model


def _chain(v, tokens):
    return v.forward(torch.tensor(tokens), torch.arange(len(tokens)), chain_mask(len(tokens)))


def test_hfverifier_satisfies_protocol():
    assert isinstance(HFVerifier(tiny_model()), Verifier)


def test_tree_rows_equal_each_branch_run_alone(kind):
    model = tiny_model(kind, 1)
    prompt = random_prompt(1, 17)
    a, b = [5, 9, 11], [7, 3]
    # root 40, then branch a (depths 1..3) and branch b (depths 1..2) flattened into one forward
    tree = DraftTree([40] + a + b, [-1, 0, 1, 2, 0, 4], [0, 1, 2, 3, 1, 2], [1.0] * 6, [""] * 6)
    v = HFVerifier(model)
    _chain(v, prompt)
    tree_logits = v.forward(*tree.tensors())
    for branch, rows in ((a, [0, 1, 2, 3]), (b, [0, 4, 5])):
        ref = HFVerifier(model)
        _chain(ref, prompt)
        alone = _chain(ref, [40] + branch)
        assert torch.allclose(tree_logits[rows], alone, atol=1e-4)
    # a plain causal mask over the same flattened tokens gives different logits for branch b
    causal = HFVerifier(model)
    _chain(causal, prompt)
    wrong = _chain(causal, [40] + a + b)
    assert (wrong[4:] - tree_logits[4:]).abs().max() > 1e-2


def test_keep_prunes_cache_to_accepted_path(kind):
    model = tiny_model(kind, 2)
    prompt = random_prompt(2, 12)
    ref = plain_greedy(model, prompt, 4)
    v = HFVerifier(model)
    _chain(v, prompt)
    # root ref[0]; a wrong sibling first, then the right path ref[1], ref[2]
    wrong = (ref[1] + 1) % model.config.vocab_size
    tree = DraftTree([ref[0], wrong, ref[1], ref[2]], [-1, 0, 0, 2], [0, 1, 1, 2], [1.0] * 4, [""] * 4)
    logits = v.forward(*tree.tensors())
    assert logits[3].argmax().item() == ref[3]
    v.keep([0, 2, 3])
    assert v.past_len == len(prompt) + 3
    nxt = _chain(v, [ref[3]])
    expected = model(torch.tensor([prompt + ref[:4]])).logits[0, -1]
    assert torch.allclose(nxt[0], expected, atol=1e-4)


def test_truncate_then_recompute_matches():
    model = tiny_model("qwen2", 3)
    prompt = random_prompt(3, 20)
    v = HFVerifier(model)
    full = _chain(v, prompt)
    v.truncate(8)
    assert v.past_len == 8
    again = _chain(v, prompt[8:])
    assert torch.allclose(again, full[8:], atol=1e-4)
    v.truncate(0)
    assert v.past_len == 0
    assert torch.allclose(_chain(v, prompt), full, atol=1e-4)


def test_keep_rejects_indices_outside_last_forward():
    v = HFVerifier(tiny_model())
    _chain(v, [1, 2, 3])
    with pytest.raises(IndexError):
        v.keep([0, 3])
