"""Kyutai's Mimi codec: 24 kHz audio <-> 32 codebooks at 12.5 Hz, both ways streamed with their state carried.

Module names are transformers' ``MimiModel``'s (``encoder.{encoder_seanet,encoder_transformer,downsample}``,
``decoder.{upsample,decoder_transformer,decoder_seanet}``, ``quantizer``); :func:`load_mimi` also reads the
published flat layout (``encoder.layers``, ``encoder_transformer``, ``downsample``...) that ``kyutai/mimi`` and
CSM's ``codec_model.`` keep. Every conv is causal and every transposed conv drops its overhang on the right, so a
stream's chunks (:class:`ConvStream`, one per half) join to the whole pass: ``T`` frames decode to exactly
``frame_size * T`` samples, and audio fed in whole frames encodes to the whole encode's codes.
"""

from __future__ import annotations

import torch
from torch import nn

from omnistage.models.mimi_config import MimiConfig
from omnistage.models.mimi_convs import CausalConv, CausalConvTranspose, ConvStream, SeanetDecoder, SeanetEncoder
from omnistage.models.mimi_quantizer import SplitQuantizer
from omnistage.models.mimi_transformer import WindowTransformer
from omnistage.models.weights import Checkpoint, LoadResult, load_module

# Our names -> the published flat layout's (substring replacements, as ``load_module`` applies them).
FLAT_LAYOUT = {
    "encoder.encoder_seanet.": "encoder.", "encoder.encoder_transformer.": "encoder_transformer.",
    "encoder.downsample.": "downsample.", "decoder.upsample.": "upsample.",
    "decoder.decoder_transformer.": "decoder_transformer.", "decoder.decoder_seanet.": "decoder.",
}


class MimiEncoder(nn.Module):
    """Audio ``[B, 1, L]`` -> latents ``[B, latent_dim, frames]``."""

    def __init__(self, cfg: MimiConfig) -> None:
        super().__init__()
        self.encoder_seanet = SeanetEncoder(cfg)
        self.encoder_transformer = WindowTransformer(cfg)
        self.downsample = CausalConv(cfg.hidden_size, cfg.latent_dim, 2 * cfg.latent_stride, stride=cfg.latent_stride,
                                     bias=False, pad_mode="replicate")

    def new_stream(self) -> ConvStream:
        return ConvStream(self.encoder_transformer.windows())

    def forward(self, audio: torch.Tensor, state: ConvStream) -> torch.Tensor:
        x = self.encoder_seanet(audio, state)
        x = self.encoder_transformer(x.transpose(1, 2), state).transpose(1, 2)
        return self.downsample(x, state)


class MimiDecoder(nn.Module):
    """Latents ``[B, hidden, frames]`` -> audio ``[B, 1, frame_size * frames]``."""

    def __init__(self, cfg: MimiConfig) -> None:
        super().__init__()
        self.upsample = CausalConvTranspose(cfg.hidden_size, cfg.hidden_size, cfg.latent_stride,
                                            groups=cfg.upsample_groups, bias=False)
        self.decoder_transformer = WindowTransformer(cfg)
        self.decoder_seanet = SeanetDecoder(cfg)

    def new_stream(self) -> ConvStream:
        return ConvStream(self.decoder_transformer.windows())

    def forward(self, latents: torch.Tensor, state: ConvStream) -> torch.Tensor:
        x = self.upsample(latents, state)
        x = self.decoder_transformer(x.transpose(1, 2), state).transpose(1, 2)
        return self.decoder_seanet(x, state)


class MimiCodec(nn.Module):
    """The whole codec, or one half of it (a decoder-only codec stage holds no encoder)."""

    def __init__(self, cfg: MimiConfig, encoder: bool = True, decoder: bool = True) -> None:
        super().__init__()
        self.cfg = cfg
        self.encoder = MimiEncoder(cfg) if encoder else None
        self.decoder = MimiDecoder(cfg) if decoder else None
        self.quantizer = SplitQuantizer(cfg)

    @property
    def samples_per_frame(self) -> int:
        return self.cfg.frame_size

    def _dtype_device(self) -> tuple[torch.dtype, torch.device]:
        weight = self.quantizer.semantic_residual_vector_quantizer.layers[0].codebook.embed_sum
        return weight.dtype, weight.device

    @torch.inference_mode()
    def encode(self, audio: torch.Tensor, state: ConvStream | None = None, final: bool = True,
               num_quantizers: int | None = None) -> torch.Tensor:
        """Audio ``[B, L]`` continuing ``state`` (None: a whole encode) -> codes ``[B, K, frames]``. Chunks of whole
        frames with ``final`` on the last give the whole encode's codes."""
        if self.encoder is None:
            raise ValueError("this Mimi codec was built without its encoder")
        state = self.encoder.new_stream() if state is None else state
        state.begin(final)
        dtype, device = self._dtype_device()
        latents = self.encoder(audio[:, None].to(device, dtype), state)
        return self.quantizer.encode(latents, num_quantizers or self.cfg.num_quantizers)

    @torch.inference_mode()
    def decode(self, codes: torch.Tensor, state: ConvStream | None = None) -> torch.Tensor:
        """Codes ``[B, K, frames]`` continuing ``state`` (None: a whole decode) -> their samples ``[B, S]``."""
        if self.decoder is None:
            raise ValueError("this Mimi codec was built without its decoder")
        state = self.decoder.new_stream() if state is None else state
        state.begin()
        _, device = self._dtype_device()
        return self.decoder(self.quantizer.decode(codes.to(device)), state)[:, 0]


def layout_of(ckpt: Checkpoint, prefix: str = "") -> dict[str, str]:
    """The rename for ``load_module``: none for transformers' module names, :data:`FLAT_LAYOUT` for the published."""
    nested = any(ckpt.has(prefix + part) for part in (
        "encoder.encoder_seanet.layers.0.conv.weight", "decoder.decoder_seanet.layers.0.conv.weight"))
    return {} if nested else dict(FLAT_LAYOUT)


def load_mimi(ckpt: Checkpoint, cfg: MimiConfig, prefix: str = "", *, encoder: bool = True, decoder: bool = True,
              dtype: torch.dtype = torch.float32, device: str = "cpu") -> tuple[MimiCodec, LoadResult]:
    """A codec (or half) filled from ``ckpt`` under ``prefix`` in either layout; what it left is in the result."""
    codec = MimiCodec(cfg, encoder=encoder, decoder=decoder)
    result = load_module(codec, ckpt, prefix, layout_of(ckpt, prefix), dtype=dtype, device=device)
    return codec.to(device).eval(), result
