"""Qwen3-ASR on omnistage's layers: Qwen3-Omni's audio encoder feeding a dense Qwen3 decoder with 1-D RoPE.

The encoder is transformers' ``Qwen3OmniMoeAudioEncoder`` (:mod:`omnistage.models.qwen3_audio_encoder`, shared
with Qwen3-Omni's thinker), its ``proj1``/``proj2`` being transformers' ``multi_modal_projector.linear_{1,2}``;
it runs on whole audios when a request is built. The text decoder is ours (:mod:`omnistage.models.decoder`) and
reads paged attention from the forward context, so the AR engine batches requests continuously.

The same body with a token-classification head (``score``) instead of ``lm_head`` is the forced aligner: one
forward over the whole prompt, a timestamp class per row.

Module names mirror transformers' runtime layout (``model.audio_tower.*``, ``model.language_model.*``,
``lm_head``/``score``); the two stored layouts read through a rename table each (:mod:`.config`).
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from omnistage.layers.quant.apply import apply_quantization
from omnistage.models.build import build_on
from omnistage.models.decoder import Decoder, KVCacheSpec, decoder_config
from omnistage.models.decoder_checkpoint import load_checkpoint
from omnistage.models.qwen3_audio_encoder import build_audio_encoder, encode_audios
from omnistage.families.qwen3_asr.config import Qwen3ASRCheckpoint

# Our name fragment -> the stored one, per layout (plain substring replacement, in order).
HF_NAMES = {"model.audio_tower.proj1.": "model.multi_modal_projector.linear_1.",
            "model.audio_tower.proj2.": "model.multi_modal_projector.linear_2."}
PUBLISHED_NAMES = {"model.audio_tower.": "audio_tower.", "model.language_model.": "model.", "score.": "lm_head."}
PUBLISHED_PREFIX = "thinker."
OMNI_ENCODER_DEFAULTS = {"max_source_positions": 1500, "conv_chunksize": 500}  # fields the ASR config omits


class TextModel(Decoder):
    def __init__(self, ckpt: Qwen3ASRCheckpoint) -> None:
        super().__init__(decoder_config(ckpt.text, mrope=False))
        self.embed_tokens = nn.Embedding(ckpt.text.vocab_size, ckpt.text.hidden_size)


class Body(nn.Module):
    def __init__(self, ckpt: Qwen3ASRCheckpoint) -> None:
        super().__init__()
        self.audio_tower = build_audio_encoder(omni_encoder_config(ckpt))
        self.language_model = TextModel(ckpt)


def omni_encoder_config(ckpt: Qwen3ASRCheckpoint) -> object:
    """Qwen3-Omni's encoder config carrying this checkpoint's encoder fields (the encoders are one module)."""
    from transformers.models.qwen3_omni_moe.configuration_qwen3_omni_moe import Qwen3OmniMoeAudioEncoderConfig

    audio = ckpt.audio
    fields = {k: getattr(audio, k) for k in ("num_mel_bins", "encoder_layers", "encoder_attention_heads",
                                             "encoder_ffn_dim", "d_model", "activation_function", "n_window",
                                             "output_dim", "n_window_infer", "downsample_hidden_size")}
    return Qwen3OmniMoeAudioEncoderConfig(**fields, **OMNI_ENCODER_DEFAULTS)


class Qwen3ASR(nn.Module):
    """Meets the AR runner's ``ARModel`` (the recogniser); the aligner is driven by :meth:`classify`."""

    uses_mrope = False  # audio and text rows share one position per row: 1-D RoPE

    def __init__(self, ckpt: Qwen3ASRCheckpoint) -> None:
        super().__init__()
        self.ckpt = ckpt
        text = ckpt.text
        self.model = Body(ckpt)
        self.n_window = int(ckpt.audio.n_window)
        if ckpt.aligner:
            self.score = nn.Linear(text.hidden_size, ckpt.num_labels, bias=bool(ckpt.hf.token_classification_bias))
        else:
            self.lm_head = nn.Linear(text.hidden_size, text.vocab_size, bias=False)
            if ckpt.hf.tie_word_embeddings:
                self.lm_head.weight = self.model.language_model.embed_tokens.weight

    @classmethod
    def from_checkpoint(cls, folder: str | Path, device: torch.device | str = "cpu",
                        dtype: torch.dtype = torch.float32, *, ckpt: Qwen3ASRCheckpoint | None = None,
                        quantization: str = "none") -> Qwen3ASR:
        ckpt = ckpt or Qwen3ASRCheckpoint.from_folder(folder)
        with build_on(device, dtype):
            model = cls(ckpt)
        prefix, names = (PUBLISHED_PREFIX, PUBLISHED_NAMES) if ckpt.published else ("", HF_NAMES)
        load_checkpoint(model, folder, prefix, dtype, names, quantization, device)  # int8 quantized as read
        apply_quantization(model, quantization)  # checks the name; every weight it would quantize already is
        return model.eval().requires_grad_(False)

    @property
    def decoder(self) -> TextModel:
        return self.model.language_model

    def kv_cache_spec(self) -> KVCacheSpec:
        return self.decoder.kv_cache_spec()

    def embed_tokens(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.decoder.embed_tokens(input_ids)

    @torch.no_grad()
    def embed(self, input_ids: torch.Tensor, mels: list[torch.Tensor]) -> torch.Tensor:
        """Embeddings ``[L, H]`` of one prompt with each audio's features (its valid mel frames ``[mel, n]``)
        at its placeholder rows, audios in order."""
        embeds = self.embed_tokens(input_ids)
        if not mels:
            return embeds
        features = torch.cat(encode_audios(self.model.audio_tower, mels, self.n_window))
        rows = (input_ids == self.ckpt.hf.audio_token_id).nonzero().squeeze(1)
        if rows.numel() != features.shape[0]:
            raise ValueError(f"prompt has {rows.numel()} audio placeholders but {features.shape[0]} audio features")
        embeds = embeds.clone()
        embeds[rows] = features.to(embeds.dtype)
        return embeds

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                inputs_embeds: torch.Tensor | None = None) -> torch.Tensor:
        """Flattened batch: ids ``[T]``, positions ``[T]`` -> final hidden ``[T, H]``."""
        if inputs_embeds is None:
            inputs_embeds = self.embed_tokens(input_ids)
        return self.decoder(inputs_embeds, positions)[0]

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)
