"""RMSNorm's float32 CPU path takes the norm in fewer ops than torch's composite: it must agree with torch's own
RMSNorm to float32 rounding (a different summation order), at any scale, for zero rows, and for HeadNorms' 2-D weight."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from omnistage.layers.norm import rms_norm


@pytest.mark.parametrize("shape", [(1, 128), (8, 128), (16, 2048), (7, 33), (24, 3, 64), (2, 16, 128)])
def test_float32_cpu_rms_norm_matches_torchs(shape: tuple[int, ...]) -> None:
    gen = torch.Generator().manual_seed(sum(shape))
    for scale in (1e-4, 1e-3, 1.0, 40.0, 1e4):
        x = torch.randn(shape, generator=gen) * scale
        dim = shape[-1]
        weight = torch.randn(dim, generator=gen)
        # Normalised values are O(1) whatever the scale: float32 rounding of a 2048-term sum, with margin.
        torch.testing.assert_close(rms_norm(x, weight, 1e-6), F.rms_norm(x, (dim,), weight, 1e-6),
                                   rtol=1e-5, atol=1e-5)
        heads = torch.randn(*shape[-2:], generator=gen) if len(shape) == 3 else weight  # HeadNorms' 2-D weight
        torch.testing.assert_close(rms_norm(x, heads, 1e-6), heads * F.rms_norm(x, (dim,), None, 1e-6),
                                   rtol=1e-5, atol=1e-5)


def test_float32_cpu_rms_norm_eps_dominates_tiny_rows() -> None:
    # Where mean(x^2) is far below eps the norm must be x / sqrt(eps), not x / ||x|| (a normalize would be).
    x = torch.full((3, 64), 1e-6)
    x[1] = 0.0
    torch.testing.assert_close(rms_norm(x, torch.ones(64), 1e-2), x / 0.1, rtol=1e-6, atol=0.0)


def test_float32_cpu_rms_norm_keeps_autograd_usable() -> None:
    # Its cached constants are ordinary tensors: a norm outside inference mode must still differentiate.
    with torch.inference_mode():
        rms_norm(torch.randn(2, 8), torch.ones(8), 1e-6)
    x = torch.randn(2, 8, requires_grad=True)
    (rms_norm(x, torch.ones(8), 1e-6) ** 2).sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()


def test_bfloat16_keeps_the_reference_order() -> None:
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    weight = torch.randn(64, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    expected = weight * (x.float() * torch.rsqrt(x.float().square().mean(-1, keepdim=True) + 1e-6)).to(torch.bfloat16)
    assert torch.equal(rms_norm(x, weight, 1e-6), expected)
