"""Pocket TTS's audio encoder: a 24 kHz voice recording -> its 32-d latents, the voice prompt of a cloned voice.

Mirrors transformers' ``PocketTTSAudioTokenizerEncoderModel`` and feature extractor (names under ``encoder.``
in ``audio_tokenizer/model.safetensors``): the recording ends on a short pause (trailing silence cut, 20 ms
faded out, 80 ms of zeros), is zero-padded to whole frames, then runs through the SEANet encoder (causal convs,
strided downsampling), the windowed transformer and a strided downsampling conv padded by replication (Mimi's
encoding half, :class:`omnistage.models.mimi.MimiEncoder`). Whole
recordings only: a voice is encoded once, when it is registered.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from omnistage.families.pocket_tts.config import CodecConfig
from omnistage.models.mimi import MimiEncoder

PAUSE_S, FADE_OUT_S, SILENCE_FLOOR_DB, ANALYSIS_FRAME_S = 0.08, 0.02, 35.0, 0.02


class VoiceEncoder(nn.Module):
    """The audio tokenizer's encoding half (``encoder.*``)."""

    def __init__(self, cfg: CodecConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.encoder = MimiEncoder(cfg)

    @torch.inference_mode()
    def encode(self, samples: torch.Tensor) -> torch.Tensor:
        """A mono 24 kHz recording ``[S]`` -> its voice latents ``[n, latent]``."""
        wave = prepare_voice_audio(samples.float(), self.cfg.sampling_rate, self.cfg.frame_size)
        weight = self.encoder.downsample.conv.weight
        state = self.encoder.new_stream()  # a fresh stream per call: zeros before the recording
        state.begin(final=True)
        return self.encoder(wave[None, None].to(weight), state)[0].T.float()


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
