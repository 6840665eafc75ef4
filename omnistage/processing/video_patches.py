"""Video frames → a Qwen vision encoder's ``pixel_values_videos`` rows, as transformers' Qwen2-VL video processor
makes them (Qwen3-Omni and Qwen2.5-Omni alike; each family picks its sizes).

transformers' video processor (``Qwen2VLVideoProcessor``) needs torchvision, so
this reuses the PIL image processor for the per-frame work — ``smart_resize``,
rescale, normalize and the spatial patch order — with a temporal patch of one
frame, then joins ``temporal_patch_size`` consecutive frames into each patch row
in the video processor's layout (channel, then frame, then the pixels of the
patch). The frame count is padded to a multiple of ``temporal_patch_size`` by
repeating the last frame, and ``second_per_grid = temporal_patch_size / fps``.

Known difference: the video processor resizes with torchvision, this with PIL
(as the image path does), so a resized pixel can differ by a few 1/255.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image

from omnistage.processing.video import Frame, Video


@dataclass(frozen=True)
class ProcessedVideos:
    """``pixel_values`` ``[patches, C*T*P*P]`` of all videos in order, ``grid_thw`` ``[V, 3]``,
    ``second_per_grid`` ``[V]`` (seconds one temporal patch spans: M-RoPE time positions only)."""

    pixel_values: torch.Tensor
    grid_thw: torch.Tensor
    second_per_grid: torch.Tensor


class VideoPatches:
    """Frames of each video → patch rows and grid, one common frame size per video."""

    def __init__(self, frames, temporal_patch_size: int) -> None:  # noqa: ANN001 - transformers image processor
        self.frames = frames  # a Qwen2VLImageProcessorPil with a temporal patch of 1
        self.temporal_patch_size = temporal_patch_size
        self.merge_size = int(frames.merge_size)

    def __call__(self, videos: Sequence[Video]) -> ProcessedVideos:
        rows, grids = zip(*(self._one(v) for v in videos), strict=True)
        return ProcessedVideos(
            pixel_values=torch.cat(rows), grid_thw=torch.tensor(grids, dtype=torch.long),
            second_per_grid=torch.tensor([self.temporal_patch_size / v.fps for v in videos]),
        )

    def token_count(self, grid_thw: torch.Tensor) -> list[int]:
        """``<|video_pad|>`` tokens per video: one per merged patch."""
        return [int(n) for n in grid_thw.prod(-1) // self.merge_size**2]

    def _one(self, video: Video) -> tuple[torch.Tensor, list[int]]:
        frames = _common_size([_rgb(f) for f in video.frames])
        out = self.frames(images=frames, return_tensors="pt")
        _, grid_h, grid_w = (int(x) for x in out["image_grid_thw"][0])
        pixels = out["pixel_values"]  # [frames * h * w, C * P * P], each frame's rows in spatial patch order
        patch_area = self.frames.patch_size**2
        per_frame = pixels.view(len(frames), grid_h * grid_w, pixels.shape[1] // patch_area, patch_area)
        temporal = self.temporal_patch_size
        if pad := -len(frames) % temporal:
            per_frame = torch.cat([per_frame, per_frame[-1:].expand(pad, -1, -1, -1)])
        grid_t = per_frame.shape[0] // temporal
        # [t, T, h*w, C, P*P] → [t, h*w, C, T, P*P]: the video processor's row order and per-row layout.
        rows = per_frame.view(grid_t, temporal, *per_frame.shape[1:]).permute(0, 2, 3, 1, 4)
        return rows.reshape(grid_t * grid_h * grid_w, -1), [grid_t, grid_h, grid_w]


def _rgb(frame: Frame) -> Image.Image:
    if isinstance(frame, Image.Image):
        return frame.convert("RGB")
    array = np.asarray(frame)
    if array.dtype != np.uint8 or array.ndim != 3 or array.shape[-1] != 3:
        raise ValueError(f"a video frame array must be uint8 [H, W, 3], got {array.dtype} {array.shape}")
    return Image.fromarray(array)


def _common_size(frames: list[Image.Image]) -> list[Image.Image]:
    """Every frame at the first frame's size, so all get one resize target and one grid (a stream may
    change resolution mid-clip; transformers' video processor stacks frames and needs one shape)."""
    size = frames[0].size
    return [f if f.size == size else f.resize(size, Image.Resampling.BICUBIC) for f in frames]
