"""The ``use_audio_in_video`` layout against transformers' own ``replace_video_with_audio_token``, and the
processor's handling of a video's sound track (order among audios, a video without one)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from omnistage.models.qwen3_omni.mrope import audio_output_length
from omnistage.families.qwen3_omni.audio_in_video import AudioInVideoTokens, audio_order, interleaved_placeholder
from omnistage.families.qwen3_omni.prompt import Qwen3OmniPromptProcessor
from omnistage.processing.video import Video

V, A, START, END = 7, 5, 1, 2
TOKENS = AudioInVideoTokens(video_token_id=V, audio_token_id=A, audio_start_token_id=START, audio_end_token_id=END)


def _transformers_layout(grid: list[int], second_per_grid: float, audio_tokens: int, pps: float) -> list[int]:
    from transformers.models.qwen3_omni_moe.processing_qwen3_omni_moe import Qwen3OmniMoeProcessor

    names = SimpleNamespace(audio_bos_token="S", audio_eos_token="E", video_token="V", audio_token="A",
                            video_processor=SimpleNamespace(merge_size=2))
    text = Qwen3OmniMoeProcessor.replace_video_with_audio_token(
        names, {"video_grid_thw": [grid], "video_second_per_grid": [second_per_grid]}, 0,
        {"num_audio_tokens": [audio_tokens]}, 0, position_id_per_seconds=pps)
    return [{"S": START, "E": END, "V": V, "A": A}[c] for c in text]


@pytest.mark.parametrize(("grid", "second_per_grid", "audio_tokens", "pps"), [
    ([2, 4, 4], 1.0, 26, 13.0),  # ties at 0 and 13: the video goes first
    ([3, 2, 4], 0.7, 40, 13.0),  # fractional step times (9.1, 18.2)
    ([4, 2, 2], 2.0, 5, 25.0),  # the audio ends before the second step: the video's rest at the end
    ([1, 2, 2], 0.5, 0, 13.0),  # no audio tokens at all
])
def test_layout_equals_transformers(grid: list[int], second_per_grid: float, audio_tokens: int,
                                    pps: float) -> None:
    ours = interleaved_placeholder(grid, second_per_grid, audio_tokens, 2, pps, TOKENS)
    assert ours == _transformers_layout(grid, second_per_grid, audio_tokens, pps)
    assert ours.count(V) == grid[0] * grid[1] * grid[2] // 4 and ours.count(A) == audio_tokens


def test_audio_order_follows_the_tokens() -> None:
    ids = [0, A, 3, V, A, V, 9]
    assert audio_order(ids, A, V, audios=2, videos=2) == [("audio", 0), ("video", 0), ("audio", 1), ("video", 1)]
    with pytest.raises(ValueError, match="placeholders"):
        audio_order(ids, A, V, audios=1, videos=2)


@pytest.fixture(scope="module")
def processor(tiny_dir: Path) -> Qwen3OmniPromptProcessor:
    return Qwen3OmniPromptProcessor.from_folder(tiny_dir)


def _frames(n: int) -> list[np.ndarray]:
    rng = np.random.default_rng(1)
    return [(rng.random((32, 32, 3)) * 255).astype(np.uint8) for _ in range(n)]


def test_track_takes_its_place_among_the_audios(processor: Qwen3OmniPromptProcessor) -> None:
    parts = [{"type": "video"}, {"type": "audio"}, {"type": "text", "text": "?"}]
    ids = processor.apply_chat_template([{"role": "user", "content": parts}])
    track, spoken = np.full(16000, 0.1, np.float32), np.full(8000, 0.2, np.float32)
    out = processor.process(ids, audios=[spoken], videos=[Video(_frames(2), 2.0, audio=track)],
                            use_audio_in_video=True)
    assert out.mm.feature_attention_mask.sum(-1).tolist() == [100, 50]  # the video's track first, as in the prompt
    # Without the flag the track is ignored and the prompt is the plain video one.
    plain = processor.process(ids, audios=[spoken], videos=[Video(_frames(2), 2.0, audio=track)])
    assert plain.mm.feature_attention_mask.sum(-1).tolist() == [50]
    assert plain.token_ids.count(processor.audio_token_id) == audio_output_length(50, processor.n_window)


def test_video_without_a_track_is_refused(processor: Qwen3OmniPromptProcessor) -> None:
    ids = processor.apply_chat_template([{"role": "user", "content": [{"type": "video"}]}])
    with pytest.raises(ValueError, match="no audio track"):
        processor.process(ids, videos=[Video(_frames(2), 2.0)], use_audio_in_video=True)
