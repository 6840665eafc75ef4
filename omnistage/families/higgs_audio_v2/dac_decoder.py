"""Higgs Audio v2's DAC decoder as the tokenizer runs it, with cheaper modules where transformers' cost the most.

transformers' ``DacModel`` decoder is built as is, then adjusted before its weights load: the tokenizer's
transposed-conv output padding and no final tanh (as ``HiggsAudioV2TokenizerModel`` does), and two of its module
kinds swapped for ones with the same parameters and math in fewer passes, measured on the tiny tokenizer
(3 windows of 64 frames, one thread): :class:`Snake` (38% of the decode in ``sin``) and :class:`MonoConv1d`
(oneDNN's 1-channel convolutions at 24 kHz, ~2.5x a sum of shifted copies). Both equal the originals within
float rounding (~1e-7 of the signal; tests pin it against transformers' decoder).
"""

from __future__ import annotations

import torch
from torch import nn

from omnistage.layers.snake import sin_squared_


class Snake(nn.Module):
    """transformers' ``Snake1d`` (``x + sin(alpha x)^2 / (alpha + 1e-9)``) in one new tensor and passes in place."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.ones(1, channels, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        wave = sin_squared_(x * self.alpha)
        return torch.addcmul(x, wave, (self.alpha + 1e-9).reciprocal())


class MonoConv1d(nn.Conv1d):
    """A 1-channel ``Conv1d`` keeping its length (stride 1, padding ``dilation * (kernel - 1) / 2``) as the sum of
    its taps' shifted copies of the input: no padded copy, and no oneDNN call that runs 1 channel slowly."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        kernel, dilation = self.kernel_size[0], self.dilation[0]
        pad = self.padding[0] if isinstance(self.padding, tuple) else None
        if pad is None or 2 * pad != dilation * (kernel - 1) or self.stride[0] != 1 or x.shape[1] != 1:
            return super().forward(x)
        taps = self.weight.reshape(-1).tolist()
        centre, length = kernel // 2, x.shape[-1]
        out = x * taps[centre]
        for j, tap in enumerate(taps):
            shift = (j - centre) * dilation  # output t reads input t + shift
            if j == centre or abs(shift) >= length:
                continue
            if shift > 0:
                out[..., :length - shift].add_(x[..., shift:], alpha=tap)
            else:
                out[..., -shift:].add_(x[..., :length + shift], alpha=tap)
        return out if self.bias is None else out.add_(self.bias.reshape(1, -1, 1))


def adjust_dac_decoder(decoder: nn.Module) -> None:
    """As transformers' ``_adjust_dac_decoder``: output padding ``stride % 2`` on each transposed conv (a window of
    ``n`` frames decodes to exactly ``n * hop`` samples) and no final tanh; then :class:`Snake` and
    :class:`MonoConv1d` in place of ``Snake1d`` and 1-channel convs (before the weights load: same names)."""
    for module in decoder.modules():
        if isinstance(module, nn.ConvTranspose1d):
            module.output_padding = (module.stride[0] % 2,)
    if isinstance(getattr(decoder, "tanh", None), nn.Tanh):
        decoder.tanh = nn.Identity()
    for parent in list(decoder.modules()):
        for name, child in list(parent.named_children()):
            if type(child).__name__ == "Snake1d":
                setattr(parent, name, Snake(child.alpha.shape[1]))
            elif type(child) is nn.Conv1d and child.in_channels == child.out_channels == 1 and child.groups == 1:
                setattr(parent, name, MonoConv1d(1, 1, child.kernel_size, dilation=child.dilation,
                                                 padding=child.padding, bias=child.bias is not None))
