"""Exactness on the embedded Qwen2.5-Coder-0.5B (slow: loads the real model)."""
import pytest
import torch

pytestmark = pytest.mark.embedded

PREFIX = '''def fibonacci(n):
    """Return the n-th Fibonacci number."""
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a


def factorial(n):
    """Return n factorial."""
'''


@pytest.fixture(scope="module")
def loaded():
    from rest_lsp.model.host import load_model

    return load_model(None, device="cpu", precision="fp32")


def test_rest_equals_plain_greedy_on_the_embedded_model(loaded):
    from rest_lsp.engine import Engine, GenerationConfig, make_sources

    prompt = loaded.tokenizer(PREFIX)["input_ids"]
    ids = torch.tensor([prompt])
    with torch.no_grad():
        ref = loaded.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=40, do_sample=False)
    ref = ref[0, len(prompt):].tolist()
    engine = Engine(loaded, make_sources("rest"))
    res = engine.generate(prompt, GenerationConfig(max_new_tokens=40, draft_budget=6))
    stop = next((i for i, t in enumerate(ref) if t in engine.eos_token_ids), len(ref))
    assert res.tokens == ref[:stop]
    assert res.steps < len(res.tokens)  # the docstring/loop pattern in the prompt gets drafted and accepted
