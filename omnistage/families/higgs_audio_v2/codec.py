"""Higgs Audio v2's audio tokenizer (an xcodec: DAC acoustic + HuBERT semantic, 25 Hz, 8 codebooks) on
transformers' own sub-modules, named as ``HiggsAudioV2TokenizerModel`` names them.

transformers' model class needs torchaudio only to resample the encoder's input to 16 kHz; here the modules are
built directly (``DacModel``'s encoder and decoder with the tokenizer's transposed-conv padding and no final tanh,
``HubertModel``, the semantic encoder, the residual quantizer), so serving needs no torchaudio, and the encoder
resamples as torchaudio does (``sinc_resample``). Decoding is not causal (DAC's convs are centred): a chunk is
decoded as a window with ``past`` frames before and ``lookahead`` frames after its new ones, whose samples are
dropped (:meth:`HiggsCodec.decode_windows`). The decoder's receptive field is
``RECEPTIVE_FRAMES`` frames each side, so with at least that much context on both sides (the stream's true edges
excepted) the trimmed chunks equal the whole decode up to float rounding (tests pin the bound).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from omnistage.families.higgs_audio_v2.config import CODEC_FOLDER
from omnistage.families.higgs_audio_v2.dac_decoder import adjust_dac_decoder
from omnistage.families.higgs_audio_v2.sinc_resample import sinc_resample

RECEPTIVE_FRAMES = 4  # conv1 (kernel 7: 3 frames) + every upsampling stage's kernels (under one frame together)


def transformers_config(folder: str | Path) -> object:
    from transformers import HiggsAudioV2TokenizerConfig

    return HiggsAudioV2TokenizerConfig.from_pretrained(str(Path(folder) / CODEC_FOLDER))


class VectorQuantizer(nn.Module):
    """One codebook of the residual quantizer: xcodec's Euclidean codebook between Higgs's projections in and out
    (transformers' ``HiggsAudioV2TokenizerVectorQuantization``, whose module imports torchaudio)."""

    def __init__(self, config: object) -> None:
        from transformers.models.xcodec.modeling_xcodec import XcodecEuclideanCodebook

        super().__init__()
        self.codebook = XcodecEuclideanCodebook(config)
        self.project_in = nn.Linear(config.hidden_size, config.codebook_dim)
        self.project_out = nn.Linear(config.codebook_dim, config.hidden_size)

    def encode(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.codebook.encode(self.project_in(hidden.permute(0, 2, 1)))

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        return self.project_out(self.codebook.decode(codes)).permute(0, 2, 1)


class ResidualQuantizer(nn.Module):
    """``quantizer.quantizers.N``: codes ``[G, B, T]`` <-> ``[B, hidden, T]`` (every codebook, full bandwidth)."""

    def __init__(self, config: object) -> None:
        super().__init__()
        count = int(1000 * config.target_bandwidths[-1] // (config.frame_rate * config.codebook_nbits))
        self.quantizers = nn.ModuleList(VectorQuantizer(config) for _ in range(count))

    def encode(self, embeddings: torch.Tensor) -> torch.Tensor:
        residual, codes = embeddings, []
        for quantizer in self.quantizers:
            indices = quantizer.encode(residual)
            residual = residual - quantizer.decode(indices)
            codes.append(indices)
        return torch.stack(codes)

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        return sum(quantizer.decode(indices) for quantizer, indices in zip(self.quantizers, codes))


class HiggsCodec(nn.Module):
    """The tokenizer's encoding and decoding halves (``decoder_semantic`` and ``fc1`` are training-only)."""

    def __init__(self, config: object, encoder: bool = True) -> None:
        from transformers import DacModel, HubertModel
        from transformers.models.xcodec.modeling_xcodec import SemanticEncoder

        super().__init__()
        self.config = config
        self.hop = int(np.prod(config.acoustic_model_config.downsampling_ratios))
        self.codebook_size = int(config.codebook_size)
        acoustic = DacModel(config.acoustic_model_config)
        self.acoustic_decoder = acoustic.decoder
        adjust_dac_decoder(self.acoustic_decoder)
        self.fc2 = nn.Linear(config.hidden_size, config.acoustic_model_config.hidden_size)
        self.quantizer = ResidualQuantizer(config)
        self.has_encoder = encoder
        if encoder:
            self.acoustic_encoder = acoustic.encoder
            self.encoder_semantic = SemanticEncoder(config)
            self.semantic_model = HubertModel(config.semantic_model_config)
            self.fc = nn.Linear(config.hidden_size, config.hidden_size)

    @property
    def samples_per_frame(self) -> int:
        return self.hop

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """Codes ``[B, G, T]`` -> waveforms ``[B, T * hop]``. Stream markers (a final frame's EOS) clip to the last
        code, as the reference's ``batch_decode`` does."""
        codes = codes.clamp(0, self.codebook_size - 1).transpose(0, 1)
        quantized = self.quantizer.decode(codes)
        acoustic = self.fc2(quantized.transpose(1, 2)).transpose(1, 2)
        return self.acoustic_decoder(acoustic)[:, 0]

    def decode_windows(self, ids: list[str], indices: list[int], chunks: list[torch.Tensor],
                       left_contexts: list[int], lookaheads: list[int], lasts: list[bool]) -> list[torch.Tensor]:
        """Each chunk ``[G, left + new + ahead]`` decoded alone -> the samples of its new and look-ahead frames (the
        left context's dropped here, the look-ahead's by the engine); windows of one length are one batch
        (right-padding would change a non-causal decode's last samples)."""
        out: list[torch.Tensor | None] = [None] * len(chunks)
        by_length: dict[int, list[int]] = {}
        for i, chunk in enumerate(chunks):
            by_length.setdefault(chunk.shape[-1], []).append(i)
        for group in by_length.values():
            wavs = self.decode(torch.stack([chunks[i] for i in group]))
            for row, i in enumerate(group):
                out[i] = wavs[row, left_contexts[i] * self.hop:]
        return [w for w in out if w is not None]

    def drop(self, stream_id: str) -> None:
        """Nothing is kept per stream: every window carries its own context."""

    @torch.inference_mode()
    def encode(self, wave: torch.Tensor) -> torch.Tensor:
        """Mono audio ``[S]`` at the codec's rate -> codes ``[G, T]`` (the reference's ``encode``, full bandwidth)."""
        if not self.has_encoder:
            raise ValueError("this codec was loaded without its encoder")
        cfg = self.config
        x = wave.float().reshape(1, 1, -1)
        rate, semantic_rate = int(cfg.sample_rate), int(cfg.semantic_sample_rate)
        semantic_in = sinc_resample(wave.float(), rate, semantic_rate)[None]
        hidden = self.semantic_model(F.pad(semantic_in, (160, 160)), output_hidden_states=True).hidden_states
        features = torch.stack(list(hidden), dim=1).mean(dim=1)
        if cfg.semantic_downsample_factor > 1:
            features = features[:, ::cfg.semantic_downsample_factor]
        semantic = self.encoder_semantic(features.transpose(1, 2))
        acoustic = self.acoustic_encoder(x)
        if acoustic.shape[2] != semantic.shape[2]:
            acoustic = self.acoustic_encoder(F.pad(x, (self.hop // 2, self.hop // 2)))
        length = min(acoustic.shape[2], semantic.shape[2])
        embeddings = torch.cat([acoustic[..., :length], semantic[..., :length]], dim=1)
        embeddings = self.fc(embeddings.transpose(1, 2)).transpose(1, 2)
        return self.quantizer.encode(embeddings)[:, 0]
