"""The 12 Hz codec's encoder: 24 kHz reference audio -> codes ``[T, 16]`` (voice cloning's reference codes).

Mimi's encoding half as ``Qwen3TTSTokenizerV2Encoder`` keeps it (names relative to ``encoder.`` in
``speech_tokenizer/model.safetensors``, the published flat layout): the SEANet conv encoder (``encoder.layers``),
the windowed transformer (``encoder_transformer``), the stride-2 ``downsample`` conv (replicate padding) to
12.5 Hz, then the split residual VQ whose first ``encoder_valid_num_quantizers`` codes are kept. The modules are
the shared Mimi ones (:mod:`omnistage.models.mimi`), run as one whole pass.
"""

from __future__ import annotations

import torch
from torch import nn

from omnistage.models.mimi_convs import CausalConv, ConvStream, SeanetEncoder
from omnistage.models.mimi_quantizer import SplitQuantizer
from omnistage.models.mimi_transformer import WindowTransformer
from omnistage.models.qwen3_tts.codec_config import CodecEncoderConfig


class CodecEncoder(nn.Module):
    def __init__(self, cfg: CodecEncoderConfig, valid_quantizers: int, samples_per_frame: int) -> None:
        super().__init__()
        if not cfg.num_semantic_quantizers < valid_quantizers <= cfg.num_quantizers:
            raise ValueError(f"codec encoder: {valid_quantizers} valid quantizers of {cfg.num_quantizers}")
        self.config, self.valid_quantizers, self.samples_per_frame = cfg, valid_quantizers, samples_per_frame
        mimi = cfg.mimi()
        self.encoder = SeanetEncoder(mimi)
        self.encoder_transformer = WindowTransformer(mimi)
        self.downsample = CausalConv(mimi.hidden_size, mimi.hidden_size, 2 * mimi.latent_stride,
                                     stride=mimi.latent_stride, bias=False, pad_mode="replicate")
        self.quantizer = SplitQuantizer(mimi)

    @torch.inference_mode()
    def encode(self, audio: torch.Tensor) -> torch.Tensor:
        """Mono 24 kHz audio ``[L]`` (float, any length >= 1) -> codes ``[ceil(L / 1920), valid_quantizers]``."""
        if audio.dim() != 1 or audio.numel() == 0 or not audio.is_floating_point():
            raise ValueError(f"audio must be a non-empty float [samples] tensor, got {audio.dtype} {tuple(audio.shape)}")
        weight = self.downsample.conv.weight
        state = ConvStream(self.encoder_transformer.windows())
        state.begin(final=True)  # one whole pass: causal padding on the left, the last windows completed
        hidden = self.encoder(audio.to(weight.device, weight.dtype)[None, None], state)  # [1, H, L / 960]
        hidden = self.encoder_transformer(hidden.transpose(1, 2), state).transpose(1, 2)
        codes = self.quantizer.encode(self.downsample(hidden, state), self.valid_quantizers)[0]  # [Q, T]
        return codes[:, : -(-audio.numel() // self.samples_per_frame)].T
