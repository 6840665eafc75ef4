"""An omni prompt's encoder inputs: what both omni families' processors make and their thinkers encode.

A msgspec struct, so the same object crosses the process boundary (its tensors travel out of band). Qwen3-Omni
sends it as is; Qwen2.5-Omni's adds its ``use_audio_in_video`` flag
(:class:`omnistage.models.qwen2_5_omni.inputs.OmniInputs`).
"""

from __future__ import annotations

import msgspec
import torch


class MultimodalInputs(msgspec.Struct, frozen=True):
    """One prompt's encoder inputs, in placeholder order, as the processor returns them.

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
