"""A video's sound track interleaved with its frames: the placeholder layout of ``use_audio_in_video``.

As transformers' Qwen3-Omni processor lays it out, the video's one
``<|video_pad|>`` (between the template's ``<|vision_start|>`` and
``<|vision_end|>``) becomes ``<|audio_start|>``, the video's and its audio's
placeholder tokens in time order, then ``<|audio_end|>``. Time is counted in
M-RoPE position ids: the merged patches of temporal step ``t`` sit at
``t * second_per_grid * position_id_per_seconds``, audio token ``i`` at ``i``
(one per encoder output, 80 ms); on a tie the video token comes first.
``models/qwen3_omni/mrope.py`` merges the positions in the same order, so each
token gets the position of the item it stands for.

The audio features of a prompt are consumed in the order their tokens appear,
so a video's track takes its place among the standalone audios where the video
stands (``audio_order``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class AudioInVideoTokens:
    video_token_id: int
    audio_token_id: int
    audio_start_token_id: int
    audio_end_token_id: int


def interleaved_placeholder(grid_thw: Sequence[int], second_per_grid: float, audio_tokens: int, merge_size: int,
                            position_id_per_seconds: float, tokens: AudioInVideoTokens) -> list[int]:
    """The tokens that replace one video's ``<|video_pad|>`` when its audio (``audio_tokens`` encoder outputs)
    is interleaved: ``second_per_grid`` seconds per temporal step of ``grid_thw`` (t, h, w patches)."""
    t, h, w = (int(x) for x in grid_thw)
    per_step = (h // merge_size) * (w // merge_size)
    # float64 products, as the processor computes them from Python floats.
    video_times = np.repeat(np.arange(t) * second_per_grid * position_id_per_seconds, per_step)
    audio_times = np.arange(audio_tokens)
    # Stable merge with the video first on ties: a video token at time v precedes every audio token with i >= v.
    before = np.searchsorted(audio_times, video_times, side="left")  # audio tokens placed before each video token
    out = [tokens.audio_start_token_id]
    placed_audio = 0
    for count in before.tolist():
        out += [tokens.audio_token_id] * (count - placed_audio) + [tokens.video_token_id]
        placed_audio = count
    out += [tokens.audio_token_id] * (audio_tokens - placed_audio)
    out.append(tokens.audio_end_token_id)
    return out


def audio_order(token_ids: Sequence[int], audio_token_id: int, video_token_id: int,
                audios: int, videos: int) -> list[tuple[str, int]]:
    """The prompt's audio items in token order: ``("audio", i)`` for the i-th standalone audio (one
    ``<|audio_pad|>`` each), ``("video", j)`` for the track of the j-th video (its ``<|video_pad|>``)."""
    order: list[tuple[str, int]] = []
    seen = {"audio": 0, "video": 0}
    for tok in token_ids:
        kind = "audio" if tok == audio_token_id else "video" if tok == video_token_id else None
        if kind is not None:
            order.append((kind, seen[kind]))
            seen[kind] += 1
    if seen["audio"] != audios or seen["video"] != videos:
        raise ValueError(f"the prompt has {seen['audio']} audio and {seen['video']} video placeholders for "
                         f"{audios} audios and {videos} videos")
    return order
