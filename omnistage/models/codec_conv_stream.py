"""A codec's convolutional decoder run on a stream's new frames only, each conv keeping its last inputs.

Every conv of the decoder (Qwen3-Omni's code2wav and Qwen3-TTS's codec decoder share the layout: upsampling
transposed convs with ConvNeXt blocks, then causal convs, SnakeBeta and decoder blocks of a transposed conv and
dilated residual units) is causal once its transposed convs are seen as emitting one block of ``stride`` samples
per input step, so a stream only needs, per conv, the last inputs its kernel reaches back to
(:class:`ConvTails`). A chunk of new frames then costs its own frames, where re-reading ~11 frames of context
through every conv (what a stateless chunk needs) cost more than the frames themselves at small chunk sizes.

Qwen3-Omni's transposed convs are trimmed on both ends (``left_trim`` samples): a whole decode's output at that
rate is the causal block sequence without its first ``left_trim`` samples, so a stream's first chunk drops them
there; its later chunks continue the sequence. Joined chunks equal the whole decode up to float rounding (convs
over other lengths), and rows of a batch are independent: padded on the right, which causal convs never read.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from omnistage.models.codec_convs import CausalConv1d, ConvNeXtBlock, ResidualUnit, SnakeBeta


@dataclass
class ConvTails:
    """One stream's kept conv inputs ``[channels, reach]``, in the decoder's order (empty before its first
    chunk: the convs then read zeros, a whole decode's padding)."""

    tensors: list[torch.Tensor] = field(default_factory=list)

    @property
    def started(self) -> bool:
        return bool(self.tensors)


class _Rows:
    """The batch being vocoded: each row's real length at the current rate and its stream's tails."""

    def __init__(self, lengths: Sequence[int], tails: Sequence[ConvTails]) -> None:
        self.lengths = list(lengths)
        self.tails = tails
        self.first = [not t.started for t in tails]
        self.slot = 0  # the next stateful conv, in the decoder's order

    def joined(self, x: torch.Tensor, reach: int) -> torch.Tensor:
        """``x`` after each row's kept last ``reach`` inputs; keeps the new last ``reach`` for the next chunk."""
        slot, self.slot = self.slot, self.slot + 1
        kept = [t.tensors[slot] if not first else x.new_zeros(x.shape[1], reach)
                for t, first in zip(self.tails, self.first)]
        joined = torch.cat([torch.stack(kept), x], dim=-1)
        for i, (tails, n) in enumerate(zip(self.tails, self.lengths)):
            last = joined[i, :, n:n + reach].clone()  # the row's real inputs end at reach + n
            if self.first[i]:
                tails.tensors.append(last)
            else:
                tails.tensors[slot] = last
        return joined


# On a CPU, oneDNN compiles and keeps one primitive per conv input shape (batch rows x width), up to 1,024 of them
# (~60 KiB each here). With a width per chunk length up to 16 frames and eight per octave above, a codec process's
# shapes outnumbered that cache: it grew for as long as rare lengths kept coming (+7% in an hour's soak, after ten
# minutes' warm-up) and then churned. Few widths keep every shape the traffic uses in the cache from the first
# minutes on.
MIN_BUCKET_FRAMES = 8


def bucket_frames(frames: int) -> int:
    """A right-padded batch's width for rows of at most ``frames``: at least ``MIN_BUCKET_FRAMES``, rounded up to
    at most three significant bits (8, 10, 12, 14, 16, 20, 24, 28, 32, 40, ...). Four widths per octave: at most
    1/4 more frames (1/8 on average) above 8, and 29 widths up to 1,024 frames."""
    if frames <= MIN_BUCKET_FRAMES:
        return MIN_BUCKET_FRAMES
    step = 1 << (frames.bit_length() - 3)
    return -(-frames // step) * step


Step = Callable[[torch.Tensor, _Rows], torch.Tensor]


class StreamedConvs:
    """Runs a decoder's ``upsample`` pairs and ``decoder`` layers (as its ``vocode`` does) chunk by chunk."""

    def __init__(self, upsample: Iterable[Sequence[nn.Module]], decoder: Iterable[nn.Module]) -> None:
        layers: list[nn.Module] = [m for pair in upsample for m in pair]
        for layer in decoder:
            layers.extend(getattr(layer, "block", [layer]))  # a decoder block: its layers in order
        # Each layer's streamed form, chosen once: a layer without one is refused when the stage starts.
        self.steps = [_step(layer) for layer in layers]

    @torch.inference_mode()
    def run(self, hidden: torch.Tensor, lengths: Sequence[int],
            tails: Sequence[ConvTails]) -> list[torch.Tensor]:
        """New transformer outputs ``[B, hidden, T]`` (row i: its first ``lengths[i]`` frames, right-padded) ->
        each row's new samples, clamped to [-1, 1]; ``tails[i]``: row i's stream, updated."""
        rows = _Rows(lengths, tails)
        x = hidden
        for step in self.steps:
            x = step(x, rows)
        wav = x[:, 0].clamp(min=-1.0, max=1.0)
        return [wav[i, :n] for i, n in enumerate(rows.lengths)]


def _step(layer: nn.Module) -> Step:
    if isinstance(layer, SnakeBeta):
        return lambda x, rows: layer(x)
    if isinstance(layer, CausalConv1d):
        return lambda x, rows: _causal(layer.conv, x, rows)
    if isinstance(layer, ConvNeXtBlock):
        return partial(_convnext, layer)
    if isinstance(layer, ResidualUnit):
        return partial(_residual, layer)
    conv = getattr(layer, "conv", None)
    if isinstance(conv, nn.ConvTranspose1d):
        return partial(_transposed, conv, getattr(layer, "left_trim", 0))
    raise TypeError(f"no streamed form for {type(layer).__name__}")


def _convnext(block: ConvNeXtBlock, x: torch.Tensor, rows: _Rows) -> torch.Tensor:
    h = _causal(block.dwconv.conv, x, rows).transpose(1, 2)
    h = block.pwconv2(F.gelu(block.pwconv1(block.norm(h))))
    return x + (block.gamma * h).transpose(1, 2)


def _residual(unit: ResidualUnit, x: torch.Tensor, rows: _Rows) -> torch.Tensor:
    h = _causal(unit.conv1.conv, unit.act1(x), rows)
    return x + _causal(unit.conv2.conv, unit.act2(h), rows)


def _causal(conv: nn.Conv1d, x: torch.Tensor, rows: _Rows) -> torch.Tensor:
    """A stride-1 conv whose output ``t`` reads inputs up to ``t``: over the kept inputs and the new ones."""
    reach = (conv.kernel_size[0] - 1) * conv.dilation[0]
    if reach:
        x = rows.joined(x, reach)
    return F.conv1d(x, conv.weight, conv.bias, dilation=conv.dilation, groups=conv.groups)


def _transposed(conv: nn.ConvTranspose1d, left_trim: int, x: torch.Tensor, rows: _Rows) -> torch.Tensor:
    """Upsampling by the stride: input step ``i`` completes the block of ``stride`` samples at ``i * stride``,
    which also reads the ``reach`` steps before it (kernel up to ``(reach + 1) * stride``)."""
    stride, kernel = conv.stride[0], conv.kernel_size[0]
    reach = -(-kernel // stride) - 1
    steps = x.shape[-1]
    if reach:
        x = rows.joined(x, reach)
    y = F.conv_transpose1d(x, conv.weight, conv.bias, stride=stride)[..., reach * stride:(reach + steps) * stride]
    for i, n in enumerate(rows.lengths):
        if rows.first[i] and left_trim:
            # The whole decode's samples at this rate start left_trim into the causal blocks: a first chunk drops
            # them (moving its row left; its padding on the right is never read by the causal layers after).
            y[i, :, :n * stride - left_trim] = y[i, :, left_trim:n * stride].clone()
            rows.lengths[i] = n * stride - left_trim
        else:
            rows.lengths[i] = n * stride
    return y
