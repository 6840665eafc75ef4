"""Qwen2.5-Omni's talker: one codec id per step from a Qwen2 decoder fed the thinker's states.

Its inputs live in the thinker's width (``embedding_size``): the thinker's hidden states plus token embeddings,
plus this model's codec embeddings (``model.embed_tokens``, also ``embedding_size`` wide), projected to its own
width by ``thinker_to_talker_proj`` inside :meth:`Talker.forward`, so the engine's prompt and fed-back rows are
the un-projected sums (as transformers' ``inputs_embeds`` are). The runner's talker hook sees a frame of one
codebook (``num_code_groups = 1``): no residual codes, the frame embedding is the codec embedding.
Module names mirror the checkpoint under ``talker.``.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from omnistage.models.build import build_on
from omnistage.models.decoder import KVCacheSpec
from omnistage.models.decoder_checkpoint import load_checkpoint
from omnistage.models.qwen2_5_omni.config import Qwen25OmniConfig
from omnistage.models.qwen2_5_omni.text_decoder import Qwen2Decoder, Qwen2Widths
from omnistage.models.qwen2_5_omni.tmrope import TMRopeTokens

CHECKPOINT_PREFIX = "talker."


class Talker(nn.Module):
    uses_mrope = True
    num_code_groups = 1
    residual_vocab_size = 1  # no residual codebooks (the sampler is asked for none)

    def __init__(self, config: object) -> None:
        """config: transformers' ``Qwen2_5OmniTalkerConfig``."""
        super().__init__()
        self.config = config
        self.thinker_to_talker_proj = nn.Linear(config.embedding_size, config.hidden_size)
        self.model = Qwen2Decoder(Qwen2Widths.from_hf(config), config.vocab_size)
        self.model.embed_tokens = nn.Embedding(config.vocab_size, config.embedding_size)
        self.codec_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.rope_tokens = TMRopeTokens.from_config(config, config.spatial_merge_size)

    @classmethod
    def from_checkpoint(cls, folder: str | Path, device: torch.device | str = "cpu",
                        dtype: torch.dtype = torch.float32, *, config: Qwen25OmniConfig | None = None) -> Talker:
        hf = (config or Qwen25OmniConfig.from_folder(folder)).hf
        with build_on(device, dtype):
            model = cls(hf.talker_config)
        load_checkpoint(model, folder, CHECKPOINT_PREFIX, dtype, {})
        return model.eval().requires_grad_(False)

    def kv_cache_spec(self) -> KVCacheSpec:
        return self.model.kv_cache_spec()

    def embed_tokens(self, codes: torch.Tensor) -> torch.Tensor:
        """Codec embeddings ``[T, embedding_size]`` (before the projection)."""
        return self.model.embed_tokens(codes)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                inputs_embeds: torch.Tensor | None = None) -> torch.Tensor:
        if inputs_embeds is None:
            inputs_embeds = self.embed_tokens(input_ids)
        return self.model(self.thinker_to_talker_proj(inputs_embeds), positions)[0]

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.codec_head(hidden).float()

    def predict_residual_codes(self, hidden_last: torch.Tensor, code0: torch.Tensor, sampler: object) -> torch.Tensor:
        return code0.view(-1, 1)

    def frame_embedding(self, codes: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(codes[:, 0])
