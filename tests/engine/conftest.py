import pytest


@pytest.fixture(params=["qwen2", "llama"])
def kind(request):
    return request.param
