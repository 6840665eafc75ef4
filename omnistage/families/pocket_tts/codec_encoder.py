"""Pocket TTS's audio encoder: a 24 kHz voice recording -> its 32-d latents, the voice prompt of a cloned voice.

Mirrors transformers' ``PocketTTSAudioTokenizerEncoderModel`` and feature extractor (names under ``encoder.``
in ``audio_tokenizer/model.safetensors``): the recording ends on a short pause (trailing silence cut, 20 ms
faded out, 80 ms of zeros), is zero-padded to whole frames, then runs through the SEANet encoder (causal convs,
strided downsampling), the windowed transformer and a strided downsampling conv padded by replication. Whole
recordings only: a voice is encoded once, when it is registered.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from omnistage.families.pocket_tts.codec import CausalConv, DecoderTransformer, DecodeState, ResnetBlock
from omnistage.families.pocket_tts.config import CodecConfig

PAUSE_S, FADE_OUT_S, SILENCE_FLOOR_DB, ANALYSIS_FRAME_S = 0.08, 0.02, 35.0, 0.02


class StridedConv(nn.Module):
    """A causal conv of stride > 1: ``kernel - stride`` samples padded on the left, and on the right what makes
    the last window whole (transformers' ``PocketTTSAudioTokenizerConv1d`` without a cache)."""

    def __init__(self, in_dim: int, out_dim: int, kernel: int, stride: int, bias: bool = True,
                 pad_mode: str = "constant") -> None:
        super().__init__()
        self.conv = nn.Conv1d(in_dim, out_dim, kernel, stride, bias=bias)
        self.kernel, self.stride, self.pad_mode = kernel, stride, pad_mode

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        padding = self.kernel - self.stride
        length = x.shape[-1]
        frames = math.ceil((length - self.kernel + padding) / self.stride + 1) - 1
        extra = frames * self.stride + self.kernel - padding - length
        return self.conv(F.pad(x, (padding, extra), mode=self.pad_mode))


class SeanetEncoder(nn.Module):
    """``encoder.encoder_seanet.layers``, at transformers' indices."""

    def __init__(self, cfg: CodecConfig) -> None:
        super().__init__()
        layers: list[nn.Module] = [CausalConv(1, cfg.num_filters, cfg.kernel_size)]
        scale = 1
        for ratio in reversed(cfg.upsampling_ratios):
            dim = scale * cfg.num_filters
            layers += [ResnetBlock(cfg, dim, cfg.dilation_growth_rate**j) for j in range(cfg.num_residual_layers)]
            layers += [nn.ELU(), StridedConv(dim, dim * 2, 2 * ratio, ratio)]
            scale *= 2
        layers += [nn.ELU(), CausalConv(scale * cfg.num_filters, cfg.hidden_size, cfg.last_kernel_size)]
        self.layers = nn.ModuleList(layers)

    def forward(self, x: torch.Tensor, state: DecodeState) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x, state) if isinstance(layer, (CausalConv, ResnetBlock)) else layer(x)
        return x


class EncoderModel(nn.Module):
    def __init__(self, cfg: CodecConfig) -> None:
        super().__init__()
        self.encoder_seanet = SeanetEncoder(cfg)
        self.encoder_transformer = DecoderTransformer(cfg)  # the same windowed layers as the decoder's
        self.downsample = StridedConv(cfg.hidden_size, cfg.latent_dim, 2 * cfg.latent_stride, cfg.latent_stride,
                                      bias=False, pad_mode="replicate")


class VoiceEncoder(nn.Module):
    """The audio tokenizer's encoding half (``encoder.*``)."""

    def __init__(self, cfg: CodecConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.encoder = EncoderModel(cfg)

    @torch.inference_mode()
    def encode(self, samples: torch.Tensor) -> torch.Tensor:
        """A mono 24 kHz recording ``[S]`` -> its voice latents ``[n, latent]``."""
        wave = prepare_voice_audio(samples.float(), self.cfg.sampling_rate, self.cfg.frame_size)
        weight = self.encoder.downsample.conv.weight
        # A fresh state per call: zeros before the recording, each conv's causal padding.
        state = DecodeState([KVWindowless() for _ in range(self.cfg.num_hidden_layers)])
        x = self.encoder.encoder_seanet(wave[None, None].to(weight), state)
        x = self.encoder.encoder_transformer(x.transpose(1, 2), state).transpose(1, 2)
        return self.encoder.downsample(x)[0].T.float()


class KVWindowless:
    """A window that keeps nothing: one whole pass attends within itself (the mask bounds it)."""

    length = 0

    def extend(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return k, v


def prepare_voice_audio(wave: torch.Tensor, rate: int, frame_size: int) -> torch.Tensor:
    """The feature extractor's ``end_on_pause``, then zero padding to whole frames."""
    frame = max(1, int(ANALYSIS_FRAME_S * rate))
    count = wave.shape[-1] // frame
    if count:
        rms = wave[:count * frame].reshape(count, frame).square().mean(-1).sqrt()
        level = 20 * torch.log10(rms + 1e-12)
        end = (int(torch.nonzero(level > level.max() - SILENCE_FLOOR_DB).flatten()[-1]) + 1) * frame
        wave = wave[:end].clone()
        fade = min(int(FADE_OUT_S * rate), end)
        wave[end - fade:] *= torch.linspace(1, 0, fade, dtype=wave.dtype)
        wave = torch.cat([wave, wave.new_zeros(int(PAUSE_S * rate))])
    return F.pad(wave, (0, -wave.shape[-1] % frame_size))
