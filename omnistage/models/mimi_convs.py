"""Mimi's causal convs with their state carried between chunks, so a stream's chunks join to the whole pass.

A :class:`ConvStream` keeps, per conv in the order a pass calls them, the inputs the next chunk's first window
reaches back to (and a strided conv's inputs not yet a whole window), per transformer layer its KV window, and
the frames passed so far. A whole pass is one chunk on a fresh stream with ``final`` set: the first chunk sees
the causal left padding (zeros, or its first input repeated under ``replicate``), and the last pads on the right
what makes a strided conv's last window whole, as transformers' ``MimiConv1d`` pads a whole input.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from omnistage.models.codec_transformer import KVWindow
from omnistage.models.mimi_config import MimiConfig


@dataclass
class ConvStream:
    """One stream's carried state through one half of the codec (encoder or decoder)."""

    windows: list[KVWindow]
    tails: list[torch.Tensor] = field(default_factory=list)
    slot: int = 0  # the next conv's tail during a chunk
    position: int = 0  # transformer frames so far
    final: bool = False  # this chunk ends the stream: strided convs finish their last window

    def begin(self, final: bool = False) -> None:
        self.slot, self.final = 0, final

    def joined(self, x: torch.Tensor, first: torch.Tensor) -> torch.Tensor:
        """``x`` ``[B, C, n]`` after this conv's kept inputs (``first`` before the stream's first chunk)."""
        slot, self.slot = self.slot, self.slot + 1
        kept = self.tails[slot] if slot < len(self.tails) else first
        return torch.cat([kept, x], dim=-1)

    def keep(self, tail: torch.Tensor) -> None:
        """The conv just run keeps ``tail`` for the stream's next chunk."""
        slot = self.slot - 1
        if slot < len(self.tails):
            self.tails[slot] = tail
        else:
            self.tails.append(tail)


class CausalConv(nn.Module):
    """``*.conv`` of transformers' ``MimiConv1d`` (causal): ``kernel - stride`` inputs of left padding; a stream
    keeps what its next window reaches back to."""

    def __init__(self, in_dim: int, out_dim: int, kernel: int, stride: int = 1, dilation: int = 1,
                 bias: bool = True, pad_mode: str = "constant") -> None:
        super().__init__()
        self.conv = nn.Conv1d(in_dim, out_dim, kernel, stride, dilation=dilation, bias=bias)
        self.kernel, self.stride, self.pad_mode = (kernel - 1) * dilation + 1, stride, pad_mode
        self.padding = self.kernel - stride

    def forward(self, x: torch.Tensor, state: ConvStream) -> torch.Tensor:
        x = state.joined(x, self._left_padding(x))
        windows = max(0, (x.shape[-1] - self.kernel) // self.stride + 1)
        pending = x.shape[-1] - self.padding - windows * self.stride  # inputs no window has started at
        if state.final and pending > 0 and self.stride > 1:
            extra = self.stride - pending
            x = F.pad(x, (0, extra)) if self.pad_mode == "constant" else F.pad(x, (0, extra), mode="replicate")
            windows += 1
        state.keep(x[..., windows * self.stride:])
        return self.conv(x[..., :(windows - 1) * self.stride + self.kernel]) if windows else x[..., :0].new_zeros(
            x.shape[0], self.conv.out_channels, 0)

    def _left_padding(self, x: torch.Tensor) -> torch.Tensor:
        if self.pad_mode == "replicate":
            return x[..., :1].expand(-1, -1, self.padding)
        return x.new_zeros(x.shape[0], x.shape[1], self.padding)


class CausalConvTranspose(nn.Module):
    """``MimiConvTranspose1d`` (causal, overhang trimmed on the right): block ``j`` of ``stride`` samples reads
    inputs ``j - 1`` and ``j`` (kernel ``2 * stride``), so a stream keeps its last input."""

    def __init__(self, in_dim: int, out_dim: int, stride: int, groups: int = 1, bias: bool = True) -> None:
        super().__init__()
        self.conv = nn.ConvTranspose1d(in_dim, out_dim, 2 * stride, stride, groups=groups, bias=bias)
        self.stride = stride

    def forward(self, x: torch.Tensor, state: ConvStream) -> torch.Tensor:
        steps = x.shape[-1]
        joined = state.joined(x, x.new_zeros(x.shape[0], x.shape[1], 1))
        state.keep(joined[..., -1:])
        return self.conv(joined)[..., self.stride:(1 + steps) * self.stride]


class ResnetBlock(nn.Module):
    """SEANet's residual block: ELU, conv k (dilated), ELU, conv 1, plus the input (no conv shortcut)."""

    def __init__(self, cfg: MimiConfig, dim: int, dilation: int) -> None:
        super().__init__()
        hidden = dim // cfg.compress
        self.block = nn.ModuleList([nn.ELU(), CausalConv(dim, hidden, cfg.residual_kernel_size, dilation=dilation),
                                    nn.ELU(), CausalConv(hidden, dim, 1)])

    def forward(self, x: torch.Tensor, state: ConvStream) -> torch.Tensor:
        h = x
        for layer in self.block:
            h = layer(h, state) if isinstance(layer, CausalConv) else layer(h)
        return x + h


class SeanetEncoder(nn.Module):
    """``encoder_seanet.layers`` (published: ``encoder.layers``), at transformers' indices."""

    def __init__(self, cfg: MimiConfig) -> None:
        super().__init__()
        layers: list[nn.Module] = [CausalConv(1, cfg.num_filters, cfg.kernel_size)]
        scale = 1
        for ratio in reversed(cfg.upsampling_ratios):
            dim = scale * cfg.num_filters
            layers += [ResnetBlock(cfg, dim, cfg.dilation_growth_rate**j) for j in range(cfg.num_residual_layers)]
            layers += [nn.ELU(), CausalConv(dim, dim * 2, 2 * ratio, stride=ratio)]
            scale *= 2
        layers += [nn.ELU(), CausalConv(scale * cfg.num_filters, cfg.hidden_size, cfg.last_kernel_size)]
        self.layers = nn.ModuleList(layers)

    def forward(self, x: torch.Tensor, state: ConvStream) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x) if isinstance(layer, nn.ELU) else layer(x, state)
        return x


class SeanetDecoder(nn.Module):
    """``decoder_seanet.layers`` (published: ``decoder.layers``), at transformers' indices."""

    def __init__(self, cfg: MimiConfig) -> None:
        super().__init__()
        scale = 2 ** len(cfg.upsampling_ratios)
        layers: list[nn.Module] = [CausalConv(cfg.hidden_size, scale * cfg.num_filters, cfg.kernel_size)]
        for ratio in cfg.upsampling_ratios:
            dim = scale * cfg.num_filters
            layers += [nn.ELU(), CausalConvTranspose(dim, dim // 2, ratio)]
            layers += [ResnetBlock(cfg, dim // 2, cfg.dilation_growth_rate**j) for j in range(cfg.num_residual_layers)]
            scale //= 2
        layers += [nn.ELU(), CausalConv(cfg.num_filters, 1, cfg.last_kernel_size)]
        self.layers = nn.ModuleList(layers)

    def forward(self, x: torch.Tensor, state: ConvStream) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x) if isinstance(layer, nn.ELU) else layer(x, state)
        return x
