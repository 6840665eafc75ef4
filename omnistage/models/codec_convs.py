"""Code2Wav's convolutional blocks: causal convs, trimmed transposed convs, ConvNeXt, SnakeBeta residual units.

Names and math are transformers' ``Qwen3OmniMoeCode2Wav`` blocks. Every conv is causal (padded on the left) except
the transposed convs, whose outputs also mix the next input step (the decoder's 555-sample lookahead).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class CausalConv1d(nn.Module):
    """Stride-1 conv padded on the left only, so output t sees inputs <= t.

    The conv pads both ends itself and the outputs of the right padding are dropped: the same samples as
    padding the input on the left, without copying the whole activation (tens of thousands of samples a chunk)
    into a padded tensor first.
    """

    def __init__(self, in_dim: int, out_dim: int, kernel: int, dilation: int = 1, groups: int = 1) -> None:
        super().__init__()
        self.left_pad = (kernel - 1) * dilation
        self.conv = nn.Conv1d(in_dim, out_dim, kernel, dilation=dilation, groups=groups, padding=self.left_pad)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)[..., :x.shape[-1]]


class TrimmedConvTranspose1d(nn.Module):
    """Upsampling by ``stride`` with ``kernel - stride`` samples cut from each end. With kernel = 2 *
    stride (the decoder) an output mixes its own input step and the next one: L steps -> (L - 1) * stride."""

    def __init__(self, in_dim: int, out_dim: int, kernel: int, stride: int) -> None:
        super().__init__()
        self.conv = nn.ConvTranspose1d(in_dim, out_dim, kernel, stride=stride)
        self.trim = kernel - stride

    @property
    def left_trim(self) -> int:
        """Samples before the causal blocks' output: a streamed decode drops them once."""
        return self.trim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv(x)
        return x[..., self.trim : x.shape[-1] - self.trim]


class ConvNeXtBlock(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dwconv = CausalConv1d(dim, dim, kernel=7, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.pwconv2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(torch.full((dim,), 1e-6))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.dwconv(x).transpose(1, 2)  # channels last for LayerNorm / Linear
        h = self.pwconv2(F.gelu(self.pwconv1(self.norm(h))))
        return x + (self.gamma * h).transpose(1, 2)


class SnakeBeta(nn.Module):
    """x + sin^2(x * e^alpha) / e^beta per channel (log-scale parameters, as trained)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.zeros(dim))
        self.beta = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Runs at every sample rate up to 24 kHz: one new tensor and passes over it in place (the per-channel
        # factors are tiny), not a new tensor per operation.
        alpha, inverse_beta = self.alpha.exp()[:, None], 1.0 / (self.beta.exp()[:, None] + 1e-9)
        wave = (x * alpha).sin_().square_()
        return torch.addcmul(x, wave, inverse_beta)


class ResidualUnit(nn.Module):
    def __init__(self, dim: int, dilation: int) -> None:
        super().__init__()
        self.act1 = SnakeBeta(dim)
        self.conv1 = CausalConv1d(dim, dim, kernel=7, dilation=dilation)
        self.act2 = SnakeBeta(dim)
        self.conv2 = CausalConv1d(dim, dim, kernel=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv2(self.act2(self.conv1(self.act1(x))))


class DecoderBlock(nn.Module):
    def __init__(self, in_dim: int, out_dim: int, rate: int) -> None:
        super().__init__()
        units = [ResidualUnit(out_dim, dilation) for dilation in (1, 3, 9)]
        self.block = nn.ModuleList([SnakeBeta(in_dim), TrimmedConvTranspose1d(in_dim, out_dim, 2 * rate, rate), *units])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.block:
            x = layer(x)
        return x
