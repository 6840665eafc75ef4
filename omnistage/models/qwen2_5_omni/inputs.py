"""A Qwen2.5-Omni prompt's encoder inputs, as its processor makes them and the thinker encodes them.

The omni families' one :class:`MultimodalInputs` with Qwen2.5-Omni's ``use_audio_in_video`` flag (its processor
interleaves a video's sound track into the inputs, so the flag travels with them); a msgspec struct, sent as is.
"""

from __future__ import annotations

from omnistage.models.omni_inputs import MultimodalInputs
from omnistage.models.qwen2_5_omni.tmrope import MediaGrids


class OmniInputs(MultimodalInputs, frozen=True):
    """``use_audio_in_video``: each video's sound track is one of the audios, interleaved with it in the prompt."""

    use_audio_in_video: bool = False

    def grids(self) -> MediaGrids:
        lengths = self.audio_lengths()
        frames = () if lengths is None else tuple(lengths.tolist())
        return MediaGrids(frames, self.image_grid_thw, self.video_grid_thw, self.video_second_per_grid)
