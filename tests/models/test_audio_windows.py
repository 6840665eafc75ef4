"""An audio is keyed per audio-encoder attention window: a growing audio keeps its completed windows' keys."""

from __future__ import annotations

from dataclasses import replace

import torch

from omnistage.families.qwen3_omni.mm_spans import multimodal_spans
from omnistage.models.qwen3_omni.inputs import MultimodalInputs
from omnistage.models.qwen3_omni.mm_spans import audio_window_frames, placed_items
from omnistage.models.qwen3_omni.mrope import MRopeTokens, audio_output_length

TOKENS = MRopeTokens(image_token_id=50, video_token_id=51, audio_token_id=52, vision_start_token_id=53,
                     audio_start_token_id=54, spatial_merge_size=2, position_id_per_seconds=25.0, audio_n_window=50,
                     audio_n_window_infer=800)


def _prompt(frames: torch.Tensor) -> tuple[list[int], MultimodalInputs]:
    n = frames.shape[1]
    mm = MultimodalInputs(input_features=frames[None], feature_attention_mask=torch.ones(1, n, dtype=torch.int32))
    return [1, 54] + [52] * audio_output_length(n, 50) + [2], mm


def test_an_audio_is_one_item_per_window_and_its_rows_add_up() -> None:
    frames = torch.randn(8, 1900, generator=torch.Generator().manual_seed(0))
    ids, mm = _prompt(frames)
    placed = placed_items(ids, mm, TOKENS)
    assert placed is not None and [len(rows) for _, rows, _ in placed] == [104, 104, audio_output_length(300, 50)]
    for k, (_, _, content) in enumerate(placed):
        assert torch.equal(content[0], frames[:, 800 * k:800 * (k + 1)])
    whole = placed_items(ids, mm, replace(TOKENS, audio_n_window_infer=0))
    assert whole is not None and len(whole) == 1 and len(whole[0][1]) == len(ids) - 3


def test_a_longer_audio_keeps_the_keys_of_its_completed_windows() -> None:
    frames = torch.randn(8, 1900, generator=torch.Generator().manual_seed(1))
    short, long = (multimodal_spans(*_prompt(frames[:, :n]), TOKENS) for n in (1600, 1900))
    assert short is not None and long is not None
    assert long[:2] == short  # the two completed windows: same rows, same digests
    changed = frames.clone()
    changed[0, 10] += 1.0  # one value of the first window
    other = multimodal_spans(*_prompt(changed), TOKENS)
    assert other is not None and other[0] != long[0] and other[1:] == long[1:]


def test_windows_must_be_whole_conv_chunks() -> None:
    assert audio_window_frames(TOKENS) == 800
    assert audio_window_frames(replace(TOKENS, audio_n_window_infer=850)) == 0  # not a multiple of 2·n_window
