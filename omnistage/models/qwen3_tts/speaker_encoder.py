"""The Base model's speaker encoder: 24 kHz reference audio -> one x-vector, the cloned voice's codec-track row.

Mirrors ``Qwen3TTSSpeakerEncoder`` (ECAPA-TDNN; names relative to ``speaker_encoder.`` in ``model.safetensors``)
and the log-mel front end of ``Qwen3TTSForConditionalGeneration.extract_speaker_embedding``: n_fft 1024, hop 256,
128 Slaney mel bins up to 12 kHz, reflect padding, magnitude with a 1e-9 floor, natural log clamped at 1e-5.
Every conv pads "same" by reflection. Blocks: a TDNN, SE-Res2Net blocks, multi-layer aggregation (``mfa``),
attentive statistics pooling (``asp``), and a 1x1 conv to ``enc_dim``.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from omnistage.models.qwen3_tts.config import SpeakerEncoderConfig

N_FFT, HOP, FMAX = 1024, 256, 12000


def _conv(in_dim: int, out_dim: int, kernel: int, dilation: int = 1) -> nn.Conv1d:
    return nn.Conv1d(in_dim, out_dim, kernel, dilation=dilation, padding="same", padding_mode="reflect")


class TDNNBlock(nn.Module):
    def __init__(self, in_dim: int, out_dim: int, kernel: int, dilation: int) -> None:
        super().__init__()
        self.conv = _conv(in_dim, out_dim, kernel, dilation)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.conv(x))


class Res2NetBlock(nn.Module):
    """Channels split in ``scale`` parts; part i > 0 goes through its TDNN after adding part i - 1's output."""

    def __init__(self, dim: int, scale: int, kernel: int, dilation: int) -> None:
        super().__init__()
        self.scale = scale
        self.blocks = nn.ModuleList(TDNNBlock(dim // scale, dim // scale, kernel, dilation) for _ in range(scale - 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        outputs: list[torch.Tensor] = []
        for i, part in enumerate(torch.chunk(x, self.scale, dim=1)):
            if i > 0:
                part = self.blocks[i - 1](part if i == 1 else part + outputs[-1])
            outputs.append(part)
        return torch.cat(outputs, dim=1)


class SqueezeExcitation(nn.Module):
    def __init__(self, dim: int, se_dim: int) -> None:
        super().__init__()
        self.conv1 = _conv(dim, se_dim, 1)
        self.conv2 = _conv(se_dim, dim, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = torch.sigmoid(self.conv2(torch.relu(self.conv1(x.mean(dim=2, keepdim=True)))))
        return x * gate


class SERes2NetBlock(nn.Module):
    def __init__(self, in_dim: int, out_dim: int, cfg: SpeakerEncoderConfig, kernel: int, dilation: int) -> None:
        super().__init__()
        self.tdnn1 = TDNNBlock(in_dim, out_dim, 1, 1)
        self.res2net_block = Res2NetBlock(out_dim, cfg.enc_res2net_scale, kernel, dilation)
        self.tdnn2 = TDNNBlock(out_dim, out_dim, 1, 1)
        self.se_block = SqueezeExcitation(out_dim, cfg.enc_se_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.se_block(self.tdnn2(self.res2net_block(self.tdnn1(x)))) + x


class AttentiveStatsPooling(nn.Module):
    """Mean and std over time, weighted by attention that also sees the global mean and std."""

    def __init__(self, dim: int, attention_dim: int) -> None:
        super().__init__()
        self.tdnn = TDNNBlock(dim * 3, attention_dim, 1, 1)
        self.conv = _conv(attention_dim, dim, 1)

    @staticmethod
    def _stats(x: torch.Tensor, weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mean = (weights * x).sum(2)
        std = torch.sqrt((weights * (x - mean.unsqueeze(2)).pow(2)).sum(2).clamp(1e-12))
        return mean, std

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        length = x.shape[-1]
        uniform = torch.full((x.shape[0], 1, length), 1.0 / length, dtype=x.dtype, device=x.device)
        mean, std = self._stats(x, uniform)
        context = torch.cat([x, mean.unsqueeze(2).expand(-1, -1, length), std.unsqueeze(2).expand(-1, -1, length)], 1)
        attention = torch.softmax(self.conv(torch.tanh(self.tdnn(context))), dim=2)
        mean, std = self._stats(x, attention)
        return torch.cat((mean, std), dim=1).unsqueeze(2)


class SpeakerEncoder(nn.Module):
    def __init__(self, cfg: SpeakerEncoderConfig) -> None:
        super().__init__()
        self.config = cfg
        ch, ks, dil = cfg.enc_channels, cfg.enc_kernel_sizes, cfg.enc_dilations
        blocks: list[nn.Module] = [TDNNBlock(cfg.mel_dim, ch[0], ks[0], dil[0])]
        blocks += [SERes2NetBlock(ch[i - 1], ch[i], cfg, ks[i], dil[i]) for i in range(1, len(ch) - 1)]
        self.blocks = nn.ModuleList(blocks)
        self.mfa = TDNNBlock(ch[-1], ch[-1], ks[-1], dil[-1])
        self.asp = AttentiveStatsPooling(ch[-1], cfg.enc_attention_channels)
        self.fc = _conv(ch[-1] * 2, cfg.enc_dim, 1)
        self.register_buffer("mel_basis", torch.from_numpy(mel_filters(cfg)), persistent=False)

    def forward(self, mels: torch.Tensor) -> torch.Tensor:
        """Log-mels ``[B, frames, mel_dim]`` -> x-vectors ``[B, enc_dim]``."""
        x = mels.transpose(1, 2)
        outputs = []
        for block in self.blocks:
            x = block(x)
            outputs.append(x)
        x = self.mfa(torch.cat(outputs[1:], dim=1))
        return self.fc(self.asp(x)).squeeze(-1)

    @torch.inference_mode()
    def embed(self, audio: torch.Tensor) -> torch.Tensor:
        """Mono audio ``[L]`` at ``sample_rate`` -> the x-vector ``[enc_dim]``."""
        if audio.dim() != 1 or audio.numel() <= N_FFT or not audio.is_floating_point():
            raise ValueError(f"reference audio must be a float [samples] tensor longer than {N_FFT} samples")
        return self(self.log_mels(audio)[None])[0]

    def log_mels(self, audio: torch.Tensor) -> torch.Tensor:
        """``[L]`` -> ``[frames, mel_dim]`` (computed in fp32, then the encoder's dtype)."""
        weight = self.fc.weight
        y = audio.to(weight.device, torch.float32)
        pad = (N_FFT - HOP) // 2
        y = torch.nn.functional.pad(y[None, None], (pad, pad), mode="reflect")[0]
        window = torch.hann_window(N_FFT, device=y.device)
        spec = torch.stft(y, N_FFT, hop_length=HOP, win_length=N_FFT, window=window, center=False,
                          normalized=False, onesided=True, return_complex=True)
        magnitude = torch.sqrt(torch.view_as_real(spec).pow(2).sum(-1) + 1e-9)
        mel = torch.matmul(self.mel_basis.float(), magnitude)
        return torch.log(mel.clamp(min=1e-5))[0].T.to(weight.dtype)


def mel_filters(cfg: SpeakerEncoderConfig) -> np.ndarray:
    """Slaney-scale, Slaney-normalised triangular filters ``[mel_dim, N_FFT // 2 + 1]`` (librosa's defaults)."""
    from transformers.audio_utils import mel_filter_bank

    bank = mel_filter_bank(num_frequency_bins=N_FFT // 2 + 1, num_mel_filters=cfg.mel_dim, min_frequency=0.0,
                           max_frequency=float(FMAX), sampling_rate=cfg.sample_rate, norm="slaney",
                           mel_scale="slaney")
    return np.ascontiguousarray(bank.T.astype(np.float32))
