"""A Qwen3-Omni prompt's encoder inputs: what the processor makes and the thinker encodes.

A msgspec struct, so the same object crosses the process boundary (its tensors travel out of band).
"""

from __future__ import annotations

import msgspec
import torch


class MultimodalInputs(msgspec.Struct, frozen=True):
    """One prompt's encoder inputs, in placeholder order, as the Qwen3-Omni processor returns them.

    input_features ``[A, mel, frames]`` with feature_attention_mask ``[A, frames]``;
    pixel_values ``[patches, C*T*P*P]`` with image_grid_thw ``[I, 3]``; the same
    for videos, plus video_second_per_grid ``[V]`` (positions only).
    """

    input_features: torch.Tensor | None = None
    feature_attention_mask: torch.Tensor | None = None
    pixel_values: torch.Tensor | None = None
    image_grid_thw: torch.Tensor | None = None
    pixel_values_videos: torch.Tensor | None = None
    video_grid_thw: torch.Tensor | None = None
    video_second_per_grid: torch.Tensor | None = None

    def audio_lengths(self) -> torch.Tensor | None:
        """Mel frames per audio."""
        return None if self.feature_attention_mask is None else self.feature_attention_mask.sum(-1)

    @property
    def has_media(self) -> bool:
        return any(x is not None for x in (self.input_features, self.pixel_values, self.pixel_values_videos))


class PromptLayout(msgspec.Struct, frozen=True):
    """The thinker prompt as the talker lays out its positions: ids plus the shapes of M-RoPE (no pixels)."""

    token_ids: list[int]
    image_grid_thw: torch.Tensor | None = None
    video_grid_thw: torch.Tensor | None = None
    audio_lengths: torch.Tensor | None = None
    video_second_per_grid: torch.Tensor | None = None

    @classmethod
    def of(cls, token_ids: list[int], mm: MultimodalInputs) -> PromptLayout:
        return cls(list(token_ids), mm.image_grid_thw, mm.video_grid_thw, mm.audio_lengths(),
                   mm.video_second_per_grid)
