import pytest
import torch


@pytest.fixture(params=["qwen2", "llama"])
def kind(request):
    return request.param


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models run fastest on one thread, and the machine is shared."""
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)
