"""Qwen2.5-Omni's ``use_audio_in_video`` placeholder layout, as transformers' processor lays it out: a video's
``<|video_pad|>`` becomes ``<|audio_bos|>``, then per chunk of ``seconds_per_chunk`` seconds the video rows whose
temporal position falls in it followed by the audio rows in it, then ``<|audio_eos|>`` (TMRoPE's positions,
:mod:`omnistage.models.qwen2_5_omni.tmrope`, walk the same chunks)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class AudioInVideoLayout:
    video_id: int
    audio_id: int
    audio_start_id: int
    audio_end_id: int
    position_id_per_seconds: float
    seconds_per_chunk: float
    merge_size: int

    @classmethod
    def from_config(cls, config: object) -> AudioInVideoLayout:
        """config: transformers' thinker config."""
        return cls(config.video_token_index, config.audio_token_index, config.audio_start_token_id,
                   config.audio_end_token_id, config.position_id_per_seconds, config.seconds_per_chunk,
                   config.vision_config.spatial_merge_size)

    def tokens(self, grid_thw: list[int], second_per_grid: float, audio_rows: int) -> list[int]:
        """What one video's placeholder becomes, its ``audio_rows`` sound-track rows interleaved."""
        t, h, w = grid_thw
        per_t = h * w // self.merge_size ** 2
        video_at = [int(i * second_per_grid * self.position_id_per_seconds) for i in range(t)]
        chunk = int(self.position_id_per_seconds * self.seconds_per_chunk)
        chunks = max(video_at[-1] // chunk, (audio_rows - 1) // chunk if audio_rows else 0) + 1
        out = [self.audio_start_id]
        for j in range(chunks):
            out += [self.video_id] * per_t * sum(j * chunk <= p < (j + 1) * chunk for p in video_at)
            out += [self.audio_id] * max(0, min((j + 1) * chunk, audio_rows) - j * chunk)
        return out + [self.audio_end_id]
