"""RMSNorm's float32 CPU path is written out op by op: it must give torch's own RMSNorm bit for bit."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from omnistage.layers.norm import rms_norm


@pytest.mark.parametrize("shape", [(1, 128), (8, 128), (16, 2048), (7, 33), (24, 3, 64), (2, 16, 128)])
def test_float32_cpu_rms_norm_is_torchs_bit_for_bit(shape: tuple[int, ...]) -> None:
    gen = torch.Generator().manual_seed(sum(shape))
    for scale in (1e-3, 1.0, 40.0):
        x = torch.randn(shape, generator=gen) * scale
        dim = shape[-1]
        weight = torch.randn(dim, generator=gen)
        assert torch.equal(rms_norm(x, weight, 1e-6), F.rms_norm(x, (dim,), weight, 1e-6))
        heads = torch.randn(*shape[-2:], generator=gen) if len(shape) == 3 else weight  # HeadNorms' 2-D weight
        assert torch.equal(rms_norm(x, heads, 1e-6), heads * F.rms_norm(x, (dim,), None, 1e-6))


def test_bfloat16_keeps_the_reference_order() -> None:
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    weight = torch.randn(64, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    expected = weight * (x.float() * torch.rsqrt(x.float().square().mean(-1, keepdim=True) + 1e-6)).to(torch.bfloat16)
    assert torch.equal(rms_norm(x, weight, 1e-6), expected)
