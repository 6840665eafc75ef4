"""A Qwen3-Omni prompt's encoder inputs (the omni families' one :class:`MultimodalInputs`) and its layout as the
talker reads it (:class:`PromptLayout`).
"""

from __future__ import annotations

import msgspec
import torch

from omnistage.models.omni_inputs import MultimodalInputs


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
