"""A packed wide linear is the same product as ``F.linear`` (float32 rounding apart) for every batch a step has,
any leading shape, and falls back to ``F.linear`` where oneDNN cannot take the input."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from omnistage.layers.packed_linear import PackedLinear


@pytest.mark.parametrize("rows", [1, 3, 8, 13])
def test_the_packed_product_equals_the_linear(rows: int) -> None:
    generator = torch.Generator().manual_seed(rows)
    weight = torch.randn(2052, 64, generator=generator)
    x = torch.randn(rows, 1, 64, generator=generator)
    head = PackedLinear(weight)
    assert head.packed is not None or not torch.backends.mkldnn.is_available()
    out = head(x)
    assert out.shape == (rows, 1, 2052)
    # one K = 64 dot product per output, summed in another order: float32 rounding of values up to ~30
    torch.testing.assert_close(out, F.linear(x, weight), rtol=1e-5, atol=1e-5)
    strided = torch.randn(rows, 5, 64, generator=generator)[:, -1]  # a last position's view, not contiguous
    torch.testing.assert_close(head(strided), F.linear(strided, weight), rtol=1e-5, atol=1e-5)


def test_other_dtypes_take_the_plain_linear() -> None:
    weight = torch.randn(256, 32)
    head = PackedLinear(weight.bfloat16())
    assert head.packed is None
    x = torch.randn(4, 32).bfloat16()
    torch.testing.assert_close(head(x), F.linear(x, weight.bfloat16()), rtol=0, atol=0)
