"""Video frames → the vision encoder's ``pixel_values_videos`` rows, as transformers' Qwen3-Omni processor makes them:
the shared patching (:mod:`omnistage.processing.video_patches`) with Qwen3-Omni's sizes.

A video may carry its sound track (``Video.audio``, 16 kHz mono float32 from the
first frame's time on); ``Qwen3OmniPromptProcessor.process(use_audio_in_video=True)``
interleaves it with the frames, as transformers' ``use_audio_in_video`` does.
"""

from __future__ import annotations

import json
from pathlib import Path

from omnistage.models.qwen3_omni.config import ProcessorSettings
from omnistage.processing.video_patches import ProcessedVideos, VideoPatches

__all__ = ["QWEN3_OMNI_VIDEO_SIZE", "ProcessedVideos", "VideoProcessor"]

# transformers' Qwen3OmniMoeProcessor passes this size to its video processor on every call (its
# ``videos_kwargs`` class default), so it wins over the size in video_preprocessor_config.json.
QWEN3_OMNI_VIDEO_SIZE = {"shortest_edge": 128 * 32 * 32, "longest_edge": 768 * 32 * 32}


class VideoProcessor(VideoPatches):
    @classmethod
    def from_folder(cls, folder: Path, settings: ProcessorSettings) -> VideoProcessor:
        """Patch sizes and normalisation from video_preprocessor_config.json, else preprocessor_config.json
        (where transformers' AutoVideoProcessor looks), else the model's vision config."""
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

        cfg = {"patch_size": settings.patch_size, "temporal_patch_size": settings.temporal_patch_size,
               "merge_size": settings.merge_size, "image_mean": [0.5] * 3, "image_std": [0.5] * 3}
        for name in ("video_preprocessor_config.json", "preprocessor_config.json"):
            path = folder / name
            if path.exists() and "patch_size" in (found := json.loads(path.read_text())):
                cfg.update({k: found[k] for k in cfg if k in found})
                break
        frames = Qwen2VLImageProcessorPil(
            patch_size=int(cfg["patch_size"]), temporal_patch_size=1, merge_size=int(cfg["merge_size"]),
            size=dict(QWEN3_OMNI_VIDEO_SIZE), image_mean=cfg["image_mean"], image_std=cfg["image_std"],
        )
        return cls(frames, int(cfg["temporal_patch_size"]))
