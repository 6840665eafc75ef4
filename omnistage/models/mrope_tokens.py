"""What every omni family's M-RoPE layout reads of its config: the media placeholder ids, the vision and audio
start markers, the vision encoder's spatial merge and the temporal positions per second.

Qwen3-Omni's layout (:class:`omnistage.models.qwen3_omni.mrope.MRopeTokens`) adds its audio encoder's windows,
Qwen2.5-Omni's TMRoPE (:class:`omnistage.models.qwen2_5_omni.tmrope.TMRopeTokens`) the seconds per interleaved
chunk; the layouts themselves differ (ported from each family's ``get_rope_index``).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MediaTokens:
    image_token_id: int
    video_token_id: int
    audio_token_id: int
    vision_start_token_id: int
    audio_start_token_id: int
    spatial_merge_size: int
    position_id_per_seconds: float
