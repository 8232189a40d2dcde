"""rest_lsp/model/ops.py: the fused RMSNorm path rounds as transformers' formula does."""
import pytest
import torch

from rest_lsp.model.ops import rms_norm


def reference(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' Qwen2RMSNorm, written out."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return w * xf.to(x.dtype)


@pytest.mark.parametrize("width", [64, 896, 1536])
@pytest.mark.parametrize("weight_dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_is_transformers_formula_bit_for_bit_and_row_by_row(width, weight_dtype):
    gen = torch.Generator().manual_seed(width)
    # rows of very different sizes: a reduction that depended on the batch would show in the small ones
    x = torch.randn(37, width, generator=gen) * torch.logspace(-3, 3, 37)[:, None]
    w = torch.randn(width, generator=gen).to(weight_dtype)
    out = rms_norm(x, w, 1e-6)
    assert out.dtype == reference(x, w, 1e-6).dtype
    assert torch.equal(out, reference(x, w, 1e-6))
    assert torch.equal(torch.cat([rms_norm(x[i:i + 1], w, 1e-6) for i in range(len(x))]), out)


def test_rms_norm_of_bf16_inputs_keeps_the_formula():
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(5, 896, generator=gen).to(torch.bfloat16)
    w = torch.randn(896, generator=gen).to(torch.bfloat16)
    assert torch.equal(rms_norm(x, w, 1e-6), reference(x, w, 1e-6))
