"""A Qwen2.5-Omni prompt's encoder inputs, as its processor makes them and the thinker encodes them.

A msgspec struct, so the same object crosses the process boundary (its tensors travel out of band); a distinct
type from Qwen3-Omni's, so neither family imports the other.
"""

from __future__ import annotations

import msgspec
import torch

from omnistage.models.qwen2_5_omni.tmrope import MediaGrids


class OmniInputs(msgspec.Struct, frozen=True):
    """One prompt's encoder inputs in placeholder order: input_features ``[A, mel, frames]`` with
    feature_attention_mask ``[A, frames]``; pixel_values ``[patches, C*T*P*P]`` with image_grid_thw ``[I, 3]``; the
    same for videos plus video_second_per_grid ``[V]``; ``use_audio_in_video``: each video's sound track is one of
    the audios, interleaved with it in the prompt."""

    input_features: torch.Tensor | None = None
    feature_attention_mask: torch.Tensor | None = None
    pixel_values: torch.Tensor | None = None
    image_grid_thw: torch.Tensor | None = None
    pixel_values_videos: torch.Tensor | None = None
    video_grid_thw: torch.Tensor | None = None
    video_second_per_grid: torch.Tensor | None = None
    use_audio_in_video: bool = False

    @property
    def has_media(self) -> bool:
        return any(x is not None for x in (self.input_features, self.pixel_values, self.pixel_values_videos))

    def grids(self) -> MediaGrids:
        frames = () if self.feature_attention_mask is None else tuple(self.feature_attention_mask.sum(-1).tolist())
        return MediaGrids(frames, self.image_grid_thw, self.video_grid_thw, self.video_second_per_grid)
