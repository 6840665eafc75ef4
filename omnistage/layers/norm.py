"""RMSNorm, computed in float32 whatever the activation dtype (as Qwen3 does; bf16 models keep it so)."""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F
from torch import nn


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The function behind :class:`RMSNorm`, for hot paths that skip the module call."""
    dtype = x.dtype
    if dtype == torch.float32 and weight.dtype == torch.float32:
        if x.is_cpu:
            return _cpu_rms_norm(x, weight, eps)
        # Already float32: torch's one-call RMSNorm is the same arithmetic in the same order (x * rsqrt(mean(x^2)
        # + eps), then the weight) in one launch.
        if weight.dim() == 1:
            return F.rms_norm(x, (x.shape[-1],), weight, eps)
        return weight * F.rms_norm(x, (x.shape[-1],), None, eps)  # per-head weights side by side (HeadNorms)
    x = x.to(torch.float32)
    x = x * torch.rsqrt(x.square().mean(-1, keepdim=True) + eps)
    # The cast back happens before the weight multiply: that is the reference order, and it matters in bf16.
    return weight * x.to(dtype)


def _cpu_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # On a CPU torch's RMSNorm is a composite of six ops, and its mean() alone (a sum, then a division by a wrapped
    # scalar) costs as much as the rest. The code predictor's loop is bound by per-op cost at serving batches (three
    # norms a layer, 75 layer calls a frame), so this takes the same quantity in four cheaper ops:
    # x / sqrt(mean(x^2) + eps) = x * sqrt(n) / hypot(||x||, sqrt(n * eps)). About half the time of the composite;
    # the result differs from it in the last bits only (a different summation), as any two reduction orders do.
    dim = x.shape[-1]
    zero, floor = _norm_constants(x.device, dim, eps)
    denominator = torch.hypot(torch.linalg.vector_norm(x, dim=-1, keepdim=True), floor)
    normed = torch.addcdiv(zero, x, denominator, value=math.sqrt(dim))
    return normed.mul_(weight) if weight.dim() == 1 else weight * normed


@functools.lru_cache(maxsize=64)
def _norm_constants(device: torch.device, dim: int, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """A float32 zero and sqrt(dim * eps) as 0-d tensors: made once, since a tensor from a Python number is itself
    a slow call. Constants only, never written to."""
    with torch.inference_mode(False):
        return (torch.zeros((), device=device),
                torch.tensor(math.sqrt(dim * eps), dtype=torch.float32, device=device))


class RMSNorm(nn.Module):
    """``weight * x / sqrt(mean(x^2) + eps)`` over the last dimension.

    Works on any leading shape, so the same module normalises hidden states
    ``[T, H]`` and per-head queries/keys ``[T, heads, head_dim]``.
    """

    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"
