"""Higgs Audio v2's DAC decoder as the tokenizer runs it, with cheaper modules where transformers' cost the most.

transformers' ``DacModel`` decoder is built as is, then adjusted before its weights load: the tokenizer's
transposed-conv output padding and no final tanh (as ``HiggsAudioV2TokenizerModel`` does), and its module kinds
swapped for ones with the same parameters and math in fewer passes, measured on the tiny tokenizer (one thread):
:class:`Snake` (38% of the decode in ``sin``), :class:`MonoConv1d` (oneDNN's 1-channel convolutions at 24 kHz,
~2.5x a sum of shifted copies), and :class:`GemmConv1d` / :class:`PolyphaseConvTranspose1d` for the rest. Those
two are one matrix product each, the same code for every length: oneDNN builds (JIT-compiles) a primitive for each
new input shape, and streamed windows come in many lengths (every utterance's last chunk, each batch size), which
made a served window of 60 frames cost 4-25 ms instead of 4. All equal the originals within float rounding (tests
pin them against transformers' decoder).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from omnistage.families.higgs_audio_v2 import dac_native
from omnistage.layers.snake import sin_squared_

# Up to this many input channels a conv runs in dac_kernels.c (one pass, its block of outputs in L1): 2.5x the
# matrix product at 1-2 channels, 1.8x at 4, 1.3x at 8, even at 16 (the tiny tokenizer's widths, one thread).
NATIVE_MAX_CHANNELS = 8


class Snake(nn.Module):
    """transformers' ``Snake1d`` (``x + sin(alpha x)^2 / (alpha + 1e-9)``) in one new tensor and passes in place."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.ones(1, channels, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # one pass (3-4x the torch ops below on one thread; the C loop is single-threaded, torch's ops are not)
        if x.shape[1] <= NATIVE_MAX_CHANNELS or torch.get_num_threads() == 1:
            native = dac_native.snake(x, self.alpha)
            if native is not None:
                return native
        wave = sin_squared_(x * self.alpha)
        return torch.addcmul(x, wave, (self.alpha + 1e-9).reciprocal())


class MonoConv1d(nn.Conv1d):
    """A 1-channel ``Conv1d`` keeping its length (stride 1, padding ``dilation * (kernel - 1) / 2``) in
    ``dac_kernels.c``, else as the sum of its taps' shifted copies of the input: no padded copy, and no oneDNN call
    that runs 1 channel slowly. (Built as a plain ``Conv1d`` draws: make-tiny's checkpoints hold those draws.)"""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        kernel, dilation = self.kernel_size[0], self.dilation[0]
        pad = self.padding[0] if isinstance(self.padding, tuple) else None
        if pad is None or 2 * pad != dilation * (kernel - 1) or self.stride[0] != 1 or x.shape[1] != 1:
            return super().forward(x)
        native = dac_native.conv1d(x, self.weight, self.bias, dilation, pad)
        if native is not None:
            return native
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


class ResidualUnit(nn.Module):
    """transformers' ``DacResidualUnit`` (``x + conv2(snake2(conv1(snake1(x))))``, lengths kept) holding the same
    (swapped) modules, its whole body one pass of dac_kernels.c where the channels are few: at 1-8 channels and
    4-24 kHz the unit's five passes and three intermediate tensors cost more than its arithmetic."""

    def __init__(self, unit: nn.Module) -> None:
        super().__init__()  # no parameters of its own: it draws nothing
        self.snake1, self.conv1, self.snake2, self.conv2 = unit.snake1, unit.conv1, unit.snake2, unit.conv2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.conv1.in_channels <= NATIVE_MAX_CHANNELS:
            native = dac_native.residual_unit(x, self.snake1.alpha, self.conv1, self.snake2.alpha, self.conv2)
            if native is not None:
                return native
        out = self.conv2(self.snake2(self.conv1(self.snake1(x))))
        trim = (x.shape[-1] - out.shape[-1]) // 2
        return (x[..., trim:-trim] if trim > 0 else x) + out


def _matmul(weight: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """``[O, K] @ [B, K, T]`` -> ``[B, O, T]`` as one (batched) product on the columns as laid out (``matmul``
    would fold the batch into rows by copying ``cols`` transposed, and copy the result back)."""
    if cols.shape[0] == 1:
        return torch.mm(weight, cols[0])[None]
    return torch.bmm(weight.expand(cols.shape[0], -1, -1), cols)


class GemmConv1d(nn.Conv1d):
    """A ``Conv1d`` (stride 1, zero padding, one group) as one matrix product over its taps' strided views."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out_ch, in_ch, kernel = self.weight.shape
        if self.stride[0] != 1 or self.groups != 1 or isinstance(self.padding, str) or self.padding_mode != "zeros":
            return super().forward(x)
        pad, dilation = self.padding[0], self.dilation[0]
        if in_ch <= NATIVE_MAX_CHANNELS and (native := dac_native.conv1d(x, self.weight, self.bias, dilation,
                                                                          pad)) is not None:
            return native
        if kernel == 1 and pad == 0:
            cols = x
        else:
            x = F.pad(x, (pad, pad)).contiguous()
            batch, length = x.shape[0], x.shape[-1] - dilation * (kernel - 1)
            cols = x.as_strided((batch, in_ch, kernel, length), (x.stride(0), x.stride(1), dilation, 1))
            cols = cols.reshape(batch, in_ch * kernel, length)
        out = _matmul(self.weight.reshape(out_ch, in_ch * kernel), cols)
        return out if self.bias is None else out.add_(self.bias[:, None])


class PolyphaseConvTranspose1d(nn.ConvTranspose1d):
    """DAC's upsampling ``ConvTranspose1d`` (kernel ``2 * stride``, padding ``ceil(stride / 2)``, output padding
    ``stride % 2``: ``T`` frames in, ``T * stride`` out) as ``stride`` phases of one 2-tap conv: output ``m * s + r``
    reads inputs ``m`` (tap ``r``) and ``m - 1`` (tap ``r + s``). One matrix product, then the phases interleaved."""

    def _polyphase(self) -> bool:
        stride, kernel = self.stride[0], self.kernel_size[0]
        return (self.groups == 1 and self.dilation[0] == 1 and kernel == 2 * stride
                and self.padding[0] == (stride + 1) // 2 and self.output_padding[0] == stride % 2)

    def forward(self, x: torch.Tensor, output_size: list[int] | None = None) -> torch.Tensor:
        if output_size is not None or not self._polyphase():
            return super().forward(x, output_size)
        in_ch, out_ch, kernel = self.weight.shape
        stride, batch, length = self.stride[0], x.shape[0], x.shape[-1]
        if in_ch <= NATIVE_MAX_CHANNELS and (native := dac_native.conv_transpose(x, self.weight, self.bias,
                                                                              stride)) is not None:
            return native
        # [in, out, 2s] -> rows (o, r), columns (c, tap): tap 0 reads x[m - 1] (weight r + s), tap 1 x[m] (weight r)
        taps = self.weight.reshape(in_ch, out_ch, 2, stride).flip(2).permute(1, 3, 0, 2)
        x = F.pad(x, (1, 1))
        cols = x.as_strided((batch, in_ch, 2, length + 1), (x.stride(0), x.stride(1), 1, 1))
        phases = _matmul(taps.reshape(out_ch * stride, in_ch * 2), cols.reshape(batch, in_ch * 2, length + 1))
        full = phases.view(batch, out_ch, stride, length + 1).transpose(2, 3).reshape(batch, out_ch, -1)
        start = self.padding[0]
        out = full[..., start:start + length * stride]
        return out + self.bias[:, None] if self.bias is not None else out.contiguous()


def adjust_dac_decoder(decoder: nn.Module) -> None:
    """As transformers' ``_adjust_dac_decoder``: output padding ``stride % 2`` on each transposed conv (a window of
    ``n`` frames decodes to exactly ``n * hop`` samples) and no final tanh; then :class:`ResidualUnit`,
    :class:`Snake`, :class:`MonoConv1d` (1 channel), :class:`GemmConv1d` (other convs) and
    :class:`PolyphaseConvTranspose1d` in place of transformers' modules (before the weights load: same names and
    shapes)."""
    for module in decoder.modules():
        if isinstance(module, nn.ConvTranspose1d):
            module.output_padding = (module.stride[0] % 2,)
    if isinstance(getattr(decoder, "tanh", None), nn.Tanh):
        decoder.tanh = nn.Identity()
    for parent in list(decoder.modules()):  # units first: their children are swapped below, in the new ones
        for name, child in list(parent.named_children()):
            if type(child).__name__ == "DacResidualUnit":
                setattr(parent, name, ResidualUnit(child))
    for parent in list(decoder.modules()):
        for name, child in list(parent.named_children()):
            if type(child).__name__ == "Snake1d":
                setattr(parent, name, Snake(child.alpha.shape[1]))
            elif type(child) is nn.Conv1d and child.in_channels == child.out_channels == 1 and child.groups == 1:
                setattr(parent, name, MonoConv1d(1, 1, child.kernel_size, dilation=child.dilation,
                                                 padding=child.padding, bias=child.bias is not None))
            elif type(child) is nn.Conv1d:
                setattr(parent, name, _taking_over(child, GemmConv1d(
                    child.in_channels, child.out_channels, child.kernel_size, stride=child.stride,
                    padding=child.padding, dilation=child.dilation, groups=child.groups,
                    bias=child.bias is not None, device="meta")))
            elif type(child) is nn.ConvTranspose1d:
                setattr(parent, name, _taking_over(child, PolyphaseConvTranspose1d(
                    child.in_channels, child.out_channels, child.kernel_size, stride=child.stride,
                    padding=child.padding, output_padding=child.output_padding, groups=child.groups,
                    bias=child.bias is not None, dilation=child.dilation, device="meta")))


def _taking_over(old: nn.Module, new: nn.Module) -> nn.Module:
    """``new`` (built on the meta device: it drew nothing from the global generator) with ``old``'s parameters, so
    a random codec made through this decoder (make-tiny) keeps the values and draws it had before the swap."""
    for name, param in old.named_parameters(recurse=False):
        setattr(new, name, param)
    return new
