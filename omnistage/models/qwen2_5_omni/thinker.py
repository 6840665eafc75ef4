"""Qwen2.5-Omni's thinker: transformers' audio and vision encoders feeding our Qwen2 text decoder.

The encoders are transformers' own ``Qwen2_5OmniAudioEncoder`` and ``Qwen2_5OmniVisionEncoder`` used as
sub-modules (filled by our checkpoint reader): they run on whole items, never on chunks, so they need no paged
attention. :meth:`Thinker.embed` merges their features at the placeholder rows; the decoder
(:mod:`text_decoder`) reads attention from the forward context, so the engine pages its KV cache.

Module names mirror the checkpoint under ``thinker.``: ``model.language_model.*``, ``model.audio_tower.*``,
``model.visual.*``, ``lm_head`` (transformers' runtime layout; the hub layout's ``model.*``, ``audio_tower.*``,
``visual.*`` read through ``HUB_NAMES``).
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from omnistage.models.build import build_on
from omnistage.models.decoder import KVCacheSpec
from omnistage.models.decoder_checkpoint import load_checkpoint
from omnistage.models.qwen2_5_omni.config import Qwen25OmniConfig
from omnistage.models.qwen2_5_omni.inputs import OmniInputs
from omnistage.models.qwen2_5_omni.text_decoder import Qwen2Decoder, Qwen2Widths
from omnistage.models.qwen2_5_omni.tmrope import TMRopeTokens, audio_output_length, tmrope_positions

CHECKPOINT_PREFIX = "thinker."
HUB_NAMES = {"model.language_model.": "model.", "model.audio_tower.": "audio_tower.", "model.visual.": "visual."}


class ThinkerModel(nn.Module):
    def __init__(self, config: object) -> None:
        super().__init__()
        from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import (Qwen2_5OmniAudioEncoder,
                                                                            Qwen2_5OmniVisionEncoder)

        dtype = torch.get_default_dtype()
        self.audio_tower = Qwen2_5OmniAudioEncoder._from_config(config.audio_config, dtype=dtype)
        self.visual = Qwen2_5OmniVisionEncoder._from_config(config.vision_config, dtype=dtype)
        text = config.text_config
        self.language_model = Qwen2Decoder(Qwen2Widths.from_hf(text), text.vocab_size)


class Thinker(nn.Module):
    uses_mrope = True  # positions are [3, T]

    def __init__(self, config: object) -> None:
        """config: transformers' ``Qwen2_5OmniThinkerConfig``."""
        super().__init__()
        self.config = config
        text = config.text_config
        self.model = ThinkerModel(config)
        self.lm_head = nn.Linear(text.hidden_size, text.vocab_size, bias=False)
        self.rope_tokens = TMRopeTokens.from_config(config, config.vision_config.spatial_merge_size)
        self.media_tokens = (config.audio_token_index, config.image_token_index, config.video_token_index)

    @classmethod
    def from_checkpoint(cls, folder: str | Path, device: torch.device | str = "cpu",
                        dtype: torch.dtype = torch.float32, *, config: Qwen25OmniConfig | None = None) -> Thinker:
        hf = (config or Qwen25OmniConfig.from_folder(folder)).hf
        with build_on(device, dtype):
            model = cls(hf.thinker_config)
        load_checkpoint(model, folder, CHECKPOINT_PREFIX, dtype, HUB_NAMES)
        return model.eval().requires_grad_(False)

    @property
    def decoder(self) -> Qwen2Decoder:
        return self.model.language_model

    def kv_cache_spec(self) -> KVCacheSpec:
        return self.decoder.kv_cache_spec()

    def embed_tokens(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.decoder.embed_tokens(input_ids)

    def positions(self, input_ids: torch.Tensor, mm: OmniInputs | None = None) -> tuple[torch.Tensor, int]:
        """TMRoPE positions ``[3, L]`` of a prompt and the delta of its decode positions."""
        mm = mm or OmniInputs()
        return tmrope_positions(input_ids, self.rope_tokens, mm.grids(), mm.use_audio_in_video)

    @torch.no_grad()
    def embed(self, input_ids: torch.Tensor, mm: OmniInputs | None = None) -> torch.Tensor:
        """Embeddings ``[L, H]`` of one prompt with audio/image/video features at their placeholder rows."""
        embeds = self.embed_tokens(input_ids)
        if mm is None or not mm.has_media:
            return embeds
        audio, image, video = self.media_tokens
        if mm.input_features is not None:
            embeds = _merge(embeds, input_ids, audio, self._audio_features(mm))
        if mm.pixel_values is not None:
            embeds = _merge(embeds, input_ids, image, self._visual_features(mm.pixel_values, mm.image_grid_thw))
        if mm.pixel_values_videos is not None:
            features = self._visual_features(mm.pixel_values_videos, mm.video_grid_thw)
            embeds = _merge(embeds, input_ids, video, features)
        return embeds

    def _visual_features(self, pixels: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
        tower = self.model.visual
        return tower(pixels.to(tower.device, tower.dtype), grid_thw=grid.to(tower.device)).pooler_output

    def _audio_features(self, mm: OmniInputs) -> torch.Tensor:
        """All audios in one encoder call, in transformers' packed layout ``[mel, valid frames of all]``."""
        tower = self.model.audio_tower
        mask = mm.feature_attention_mask.to(tower.device).bool()
        features = mm.input_features.to(tower.device, tower.dtype).permute(0, 2, 1)[mask].permute(1, 0)
        lens = mask.sum(-1)
        after_cnn, _ = tower._get_feat_extract_output_lengths(lens)
        out = tower(features, feature_lens=lens, aftercnn_lens=after_cnn).last_hidden_state
        expected = sum(audio_output_length(int(n)) for n in lens)
        if out.shape[0] != expected:
            raise ValueError(f"the audio encoder gave {out.shape[0]} rows for {expected} placeholders")
        return out

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                inputs_embeds: torch.Tensor | None = None) -> torch.Tensor:
        """Flattened batch: ids ``[T]``, positions ``[3, T]`` (or ``[T]``, text only) -> final hidden ``[T, H]``."""
        if inputs_embeds is None:
            inputs_embeds = self.embed_tokens(input_ids)
        return self.decoder(inputs_embeds, positions)[0]

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)


def _merge(embeds: torch.Tensor, input_ids: torch.Tensor, token: int, features: torch.Tensor) -> torch.Tensor:
    rows = (input_ids == token).nonzero().squeeze(1)
    if rows.numel() != features.shape[0]:
        raise ValueError(f"prompt has {rows.numel()} placeholder tokens {token} but {features.shape[0]} features")
    embeds = embeds.clone()
    embeds[rows] = features.to(embeds.dtype)
    return embeds
