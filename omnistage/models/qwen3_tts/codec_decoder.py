"""The 12 Hz codec's decoder: codes ``[B, 16, T]`` -> 24 kHz waveform, 1920 samples per frame.

Mirrors ``Qwen3TTSTokenizerV2Decoder`` (names relative to ``decoder.`` in ``speech_tokenizer/model.safetensors``):
a split residual-VQ dequantiser (codebook 0 through ``rvq_first``, the rest through ``rvq_rest``, each summed
then projected by a 1x1 conv), a causal conv, the sliding-window transformer (``input_proj`` -> layers with layer
scale -> norm -> ``output_proj``), two transposed-conv + ConvNeXt upsamplers, and a SnakeBeta conv decoder.

Unlike Qwen3-Omni's vocoder, every layer is causal: the decoder's transposed convs drop their overhang on the
right only, so sample ``s`` depends on frames ``<= s // 1920`` and ``T`` frames give exactly ``1920 T`` samples.
That makes streamed decoding exact with left context alone (:mod:`omnistage.models.qwen3_tts.codec_stream`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from omnistage.models.codec_transformer import Code2WavConfig, KVWindow, PreTransformer
from omnistage.models.codec_convs import CausalConv1d, ConvNeXtBlock, ResidualUnit, SnakeBeta
from omnistage.models.qwen3_tts.codec_config import CodecDecoderConfig

_EPSILON = 1e-5  # the codebooks' cluster-usage floor


class Codebook(nn.Module):
    """A codebook stored as running sums: entry ``i`` is ``embedding_sum[i] / max(cluster_usage[i], eps)``."""

    def __init__(self, size: int, dim: int) -> None:
        super().__init__()
        self.cluster_usage = nn.Parameter(torch.ones(size))
        self.embedding_sum = nn.Parameter(torch.zeros(size, dim))

    def table(self) -> torch.Tensor:
        return self.embedding_sum / self.cluster_usage.clamp(min=_EPSILON)[:, None]


class VectorQuantizer(nn.Module):
    def __init__(self, size: int, dim: int) -> None:
        super().__init__()
        self._codebook = Codebook(size, dim)


class QuantizerLayers(nn.Module):
    def __init__(self, count: int, size: int, dim: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(VectorQuantizer(size, dim) for _ in range(count))


class ResidualDequantizer(nn.Module):
    """``vq.layers`` summed, then ``output_proj``; ``input_proj`` is only the encoding side's, kept for the names."""

    def __init__(self, count: int, size: int, dim: int, outer_dim: int) -> None:
        super().__init__()
        self.vq = QuantizerLayers(count, size, dim)
        self.input_proj = nn.Conv1d(outer_dim, dim, 1, bias=False)
        self.output_proj = nn.Conv1d(dim, outer_dim, 1, bias=False)

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """codes ``[B, K, T]`` -> ``[B, outer_dim, T]``."""
        quantized = codes.new_zeros((), dtype=self.output_proj.weight.dtype)
        for layer, layer_codes in zip(self.vq.layers, codes.unbind(1)):
            quantized = quantized + F.embedding(layer_codes, layer._codebook.table()).transpose(1, 2)
        return self.output_proj(quantized)


class SplitDequantizer(nn.Module):
    def __init__(self, cfg: CodecDecoderConfig) -> None:
        super().__init__()
        dim = cfg.codebook_dim // 2
        self.rvq_first = ResidualDequantizer(1, cfg.codebook_size, dim, cfg.codebook_dim)
        self.rvq_rest = ResidualDequantizer(cfg.num_quantizers - 1, cfg.codebook_size, dim, cfg.codebook_dim)

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """codes ``[B, G, T]`` -> ``[B, codebook_dim, T]``."""
        return self.rvq_first.decode(codes[:, :1]) + self.rvq_rest.decode(codes[:, 1:])


class CodecTransformer(PreTransformer):
    """Qwen3-Omni's sliding-window transformer (KV windows for streams) between a latent-width in/out projection."""

    def __init__(self, cfg: CodecDecoderConfig) -> None:
        super().__init__(transformer_config(cfg))
        self.input_proj = nn.Linear(cfg.latent_dim, cfg.hidden_size)
        self.output_proj = nn.Linear(cfg.hidden_size, cfg.latent_dim)

    def forward(self, x: torch.Tensor, windows: list[KVWindow] | None = None, offset: int = 0) -> torch.Tensor:
        """``[B, T, latent]`` -> ``[B, T, latent]`` (a stream's frames continue at ``offset``, see the parent)."""
        return self.output_proj(super().forward(self.input_proj(x), windows, offset))


def transformer_config(cfg: CodecDecoderConfig) -> Code2WavConfig:
    """The transformer's shape in the form Qwen3-Omni's vocoder transformer takes it."""
    return Code2WavConfig(
        codebook_size=cfg.codebook_size, num_quantizers=cfg.num_quantizers, hidden_size=cfg.hidden_size,
        num_hidden_layers=cfg.num_hidden_layers, num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads, head_dim=cfg.head_dim, intermediate_size=cfg.intermediate_size,
        hidden_act=cfg.hidden_act, rms_norm_eps=cfg.rms_norm_eps, rope_theta=cfg.rope_theta,
        sliding_window=cfg.sliding_window, layer_scale_initial_scale=cfg.layer_scale_initial_scale,
        attention_bias=cfg.attention_bias, upsampling_ratios=cfg.upsampling_ratios,
        upsample_rates=cfg.upsample_rates, decoder_dim=cfg.decoder_dim)


class CausalConvTranspose1d(nn.Module):
    """Upsampling by ``stride`` with the ``kernel - stride`` overhang cut on the right: L steps -> L * stride,
    output ``j`` reading input steps ``<= j // stride``."""

    left_trim = 0  # its output is the causal blocks themselves (see omnistage.models.codec_conv_stream)

    def __init__(self, in_dim: int, out_dim: int, kernel: int, stride: int) -> None:
        super().__init__()
        self.conv = nn.ConvTranspose1d(in_dim, out_dim, kernel, stride=stride)
        self.right_trim = kernel - stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv(x)
        return x[..., : x.shape[-1] - self.right_trim]


class DecoderBlock(nn.Module):
    def __init__(self, in_dim: int, out_dim: int, rate: int) -> None:
        super().__init__()
        units = [ResidualUnit(out_dim, dilation) for dilation in (1, 3, 9)]
        self.block = nn.ModuleList([SnakeBeta(in_dim), CausalConvTranspose1d(in_dim, out_dim, 2 * rate, rate), *units])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.block:
            x = layer(x)
        return x


class CodecDecoder(nn.Module):
    sample_rate = 24000

    def __init__(self, cfg: CodecDecoderConfig) -> None:
        super().__init__()
        self.config = cfg
        latent = cfg.latent_dim
        self.quantizer = SplitDequantizer(cfg)
        self.pre_conv = CausalConv1d(cfg.codebook_dim, latent, 3)
        self.pre_transformer = CodecTransformer(cfg)
        self.upsample = nn.ModuleList(
            nn.ModuleList([CausalConvTranspose1d(latent, latent, r, r), ConvNeXtBlock(latent)])
            for r in cfg.upsampling_ratios)
        dims = [cfg.decoder_dim // 2**i for i in range(len(cfg.upsample_rates) + 1)]
        blocks = [DecoderBlock(dims[i], dims[i + 1], r) for i, r in enumerate(cfg.upsample_rates)]
        self.decoder = nn.ModuleList(
            [CausalConv1d(latent, cfg.decoder_dim, 7), *blocks, SnakeBeta(dims[-1]), CausalConv1d(dims[-1], 1, 7)])

    @property
    def samples_per_frame(self) -> int:
        return self.config.samples_per_frame

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        """``[B, G, T]`` codes -> ``[B, 1, 1920 T]`` in [-1, 1], as the reference decoder's ``forward``."""
        self.check_codes(codes)
        latent = self.pre_conv(self.quantizer.decode(codes)).transpose(1, 2)
        return self.vocode(self.pre_transformer(latent).transpose(1, 2))

    def vocode(self, hidden: torch.Tensor) -> torch.Tensor:
        """The convolutional part: transformer outputs ``[B, latent, T]`` -> ``[B, 1, 1920 T]``."""
        for upsample_conv, convnext in self.upsample:
            hidden = convnext(upsample_conv(hidden))
        for layer in self.decoder:
            hidden = layer(hidden)
        return hidden.clamp(min=-1.0, max=1.0)

    def check_codes(self, codes: torch.Tensor) -> None:
        groups = self.config.num_quantizers
        if codes.dim() != 3 or codes.shape[1] != groups or codes.shape[2] < 1 or codes.is_floating_point():
            raise ValueError(f"codes must be integer [B, {groups}, T >= 1], got {codes.dtype} {tuple(codes.shape)}")
        if bool(((codes < 0) | (codes >= self.config.codebook_size)).any()):
            raise ValueError(f"codes must lie in [0, {self.config.codebook_size})")
