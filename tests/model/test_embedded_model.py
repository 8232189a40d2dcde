"""The embedded Qwen2.5-Coder-0.5B end to end (downloads ~490 MB and converts once into the user cache)."""
import pytest
import torch

pytestmark = pytest.mark.embedded


@pytest.fixture(scope="module")
def embedded_model():
    from rest_lsp.model.host import load_model

    return load_model(None, device="cpu", precision="fp32")


def test_embedded_loads_and_writes_python(embedded_model):
    lm = embedded_model
    assert lm.name == "Qwen2.5-Coder-0.5B-Instruct" and lm.fim is not None and lm.fim.name == "qwen"
    # Qwen2.5's 151,665 ids (the last, <|file_sep|>, 151,664) in an embedding of 151,936 rows; the GGUF's token
    # list names the padding rows too, so the tokenizer is as long as the embedding
    assert lm.vocab_size == 151_936 and len(lm.tokenizer) == 151_936
    assert lm.tokenizer.convert_tokens_to_ids("<|file_sep|>") == 151_664
    ids = lm.build_prompt("def fibonacci(n):\n", max_new_tokens=24)
    with torch.no_grad():
        out = lm.model.generate(torch.tensor([ids]), max_new_tokens=24, do_sample=False)
    text = lm.tokenizer.decode(out[0, len(ids):], skip_special_tokens=True)
    assert text.startswith("    "), text  # an indented function body
    assert any(w in text for w in ("if ", "return", "for ", "while ", "a, b")), text
    lines = [ln for ln in text.split("\n")[:-1] if ln.strip()]
    assert lines and all(ln.startswith("    ") for ln in lines), text  # stays inside the function


def test_embedded_fim(embedded_model):
    lm = embedded_model
    ids = lm.build_prompt("def add(a, b):\n    return ", "\n\nprint(add(1, 2))\n", max_new_tokens=8)
    with torch.no_grad():
        out = lm.model.generate(torch.tensor([ids]), max_new_tokens=8, do_sample=False,
                                eos_token_id=lm.stop_ids)
    text = lm.tokenizer.decode(out[0, len(ids):], skip_special_tokens=True)
    assert text.strip().startswith("a + b"), text
