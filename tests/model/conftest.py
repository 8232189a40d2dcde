import pytest


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A tiny random Qwen2-architecture model with a trained BPE tokenizer carrying Qwen's FIM tokens."""
    from testmodels.tiny import make_tiny_model_dir

    return make_tiny_model_dir(tmp_path_factory.mktemp("tiny") / "model", seed=0)


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_model_dir))


@pytest.fixture(scope="session")
def tiny_codellama_dir(tmp_path_factory):
    """A tiny random Llama model in CodeLlama's layout: 32,016-id vocabulary, its infill tokens and hub files."""
    from testmodels.tiny import make_tiny_codellama_dir

    return make_tiny_codellama_dir(tmp_path_factory.mktemp("tiny-codellama") / "model", seed=0)


@pytest.fixture(scope="session")
def codellama_tokenizer(tiny_codellama_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_codellama_dir))
