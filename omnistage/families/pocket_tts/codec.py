"""Pocket TTS's audio decoder: 32-d latents at 12.5 Hz -> 24 kHz audio, streamed with its state carried.

Mirrors transformers' ``PocketTTSAudioTokenizerModel.decode`` (names from ``latent_proj`` and ``decoder.*`` in
``audio_tokenizer/model.safetensors``): a 1x1 projection into Mimi's decoding half (the shared
:class:`omnistage.models.mimi.MimiDecoder`: a depthwise transposed conv up to the SEANet rate, the windowed
transformer, the SEANet decoder). ``T`` frames give exactly ``frame_size * T`` samples, and a stream's
:class:`ConvStream` carries each conv's tail and each layer's KV window, so chunks join to the whole decode.
"""

from __future__ import annotations

import torch
from torch import nn

from omnistage.families.pocket_tts.config import CodecConfig
from omnistage.models.mimi import MimiDecoder
from omnistage.models.mimi_convs import ConvStream


class LatentDecoder(nn.Module):
    """The audio tokenizer's decoding half: ``latent_proj`` and ``decoder``."""

    def __init__(self, cfg: CodecConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.latent_proj = nn.Conv1d(cfg.latent_dim, cfg.hidden_size, 1, bias=False)
        self.decoder = MimiDecoder(cfg)

    @property
    def samples_per_frame(self) -> int:
        return self.cfg.frame_size

    def new_state(self) -> ConvStream:
        return self.decoder.new_stream()

    @torch.inference_mode()
    def decode(self, latents: torch.Tensor, state: ConvStream | None = None) -> torch.Tensor:
        """Latents ``[n, latent]`` (the tokenizer's space) continuing ``state`` (a fresh one: a whole decode) ->
        their ``frame_size * n`` samples ``[S]``."""
        state = self.new_state() if state is None else state
        state.begin()
        weight = self.latent_proj.weight
        x = self.latent_proj(latents.T[None].to(weight.device, weight.dtype))
        return self.decoder(x, state)[0, 0]
