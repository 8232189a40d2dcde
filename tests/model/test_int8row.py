"""Per-row W8A8 int8 (rest_lsp/model/int8row.py): batch-invariant products and exact fusion (greedy tree
speculation over an int8 model: tests/model/test_fast.py, tests/engine/test_precision_exact.py)."""
from __future__ import annotations

import pytest
import torch

from rest_lsp.model.int8row import Int8RowLinear, int_mm_exact, quantize_rows


def rows_with_spread(m: int, k: int, seed: int) -> torch.Tensor:
    """[m, k] rows whose magnitudes differ by orders (row i scaled by 10^(i mod 4 - 1)), one with an outlier
    channel: one scale shared by all rows would round the small rows very differently from their own scale."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g) * (10.0 ** (torch.arange(m) % 4 - 1))[:, None]
    x[1, 3] = 500.0
    return x


def batch_invariant(layer, x: torch.Tensor) -> bool:
    """Every row's output is bit-identical alone and inside the batch of all rows (and of the first three)."""
    with torch.no_grad():
        full, part = layer(x), layer(x[:3])
        return all(torch.equal(layer(x[i:i + 1])[0], full[i]) for i in range(len(x))) and \
            all(torch.equal(part[i], full[i]) for i in range(3))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_int8_row_linear_is_batch_invariant(dtype):
    torch.manual_seed(0)
    lin = torch.nn.Linear(72, 40)
    x = rows_with_spread(9, 72, 0).to(dtype)
    assert batch_invariant(Int8RowLinear.from_linear(lin), x)
    # 3-d input as transformers passes it: the same rows, the same values
    layer = Int8RowLinear.from_linear(lin)
    with torch.no_grad():
        assert torch.equal(layer(x[None])[0], layer(x))
        assert layer(x).dtype == dtype


def test_the_check_discriminates_one_scale_per_call():
    """quantize_dynamic (one activation scale per call, what `int8` used to be) fails the same check."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(72, 40)
    dyn = torch.ao.quantization.quantize_dynamic(torch.nn.Sequential(lin), {torch.nn.Linear}, dtype=torch.qint8)
    assert not batch_invariant(dyn, rows_with_spread(9, 72, 0))


def test_close_to_the_float_product():
    torch.manual_seed(1)
    lin = torch.nn.Linear(256, 64)
    x = torch.randn(5, 256)
    with torch.no_grad():
        ref, got = lin(x), Int8RowLinear.from_linear(lin)(x)
    assert torch.nn.functional.cosine_similarity(ref.flatten(), got.flatten(), dim=0) > 0.999
    q, s = quantize_rows(x)
    assert q.dtype == torch.int8 and s.shape == (5, 1) and int(q.abs().max()) == 127
    assert torch.equal(quantize_rows(torch.zeros(2, 8))[0], torch.zeros(2, 8, dtype=torch.int8))


def test_fused_layers_equal_the_separate_ones():
    torch.manual_seed(2)
    a, b, c = torch.nn.Linear(48, 32), torch.nn.Linear(48, 16, bias=False), torch.nn.Linear(48, 8)
    qa, qb, qc = (Int8RowLinear.from_linear(m) for m in (a, b, c))
    x = rows_with_spread(6, 48, 2)
    with torch.no_grad():
        assert torch.equal(Int8RowLinear.fuse(qa, qb, qc)(x), torch.cat([qa(x), qb(x), qc(x)], dim=-1))


def test_int_mm_is_exact_here():
    assert int_mm_exact()
