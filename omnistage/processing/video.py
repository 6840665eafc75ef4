"""A video as a request carries it, before any model sees it: RGB frames sampled at a known rate, and
optionally its sound track. The front end decodes a clip into this (``entrypoints/openai/media``); a family's
processor turns it into its encoder's inputs (Qwen3-Omni: ``families/qwen3_omni/video_processor.py``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from PIL import Image

Frame = Image.Image | np.ndarray  # an RGB PIL image or a uint8 ``[H, W, 3]`` array


@dataclass(frozen=True)
class Video:
    """A clip as RGB frames sampled ``fps`` times per second of the clip's time, and optionally its sound
    track (16 kHz mono float32; used only with ``use_audio_in_video``)."""

    frames: Sequence[Frame]
    fps: float
    audio: np.ndarray | None = None

    def __post_init__(self) -> None:
        if not self.frames:
            raise ValueError("a video needs at least one frame")
        if not self.fps > 0:
            raise ValueError(f"a video's fps must be positive, got {self.fps}")
