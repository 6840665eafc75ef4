"""The prefix-cache keys of a multimodal prompt: where each item sits and a digest of what fills it."""

from __future__ import annotations

import torch

from omnistage.families.qwen3_omni.mm_spans import multimodal_spans
from omnistage.models.qwen3_omni.mrope import MRopeTokens, audio_output_length
from omnistage.models.qwen3_omni.inputs import MultimodalInputs

TOKENS = MRopeTokens(image_token_id=50, video_token_id=51, audio_token_id=52, vision_start_token_id=53,
                     audio_start_token_id=54, spatial_merge_size=2, position_id_per_seconds=25.0, audio_n_window=50)
FRAMES = (100, 60)  # mel frames of two audios


def _audio(seed: int = 0, padding: float = 0.0) -> MultimodalInputs:
    g = torch.Generator().manual_seed(seed)
    features = torch.randn(2, 8, max(FRAMES), generator=g)
    mask = torch.zeros(2, max(FRAMES), dtype=torch.int32)
    for i, n in enumerate(FRAMES):
        mask[i, :n] = 1
        features[i, :, n:] = padding
    return MultimodalInputs(input_features=features, feature_attention_mask=mask)


def _audio_ids() -> list[int]:
    a, b = (audio_output_length(n, TOKENS.audio_n_window) for n in FRAMES)
    return [1, 54] + [52] * a + [2, 3, 54] + [52] * b + [4]


def test_each_audio_gets_its_run_and_a_digest_of_its_valid_frames() -> None:
    ids = _audio_ids()
    a, b = (audio_output_length(n, TOKENS.audio_n_window) for n in FRAMES)
    spans = multimodal_spans(ids, _audio(), TOKENS)
    assert spans is not None and [(s.start, s.end) for s in spans] == [(2, 2 + a), (5 + a, 5 + a + b)]
    assert multimodal_spans(ids, _audio(), TOKENS) == spans  # deterministic
    assert multimodal_spans(ids, _audio(padding=9.0), TOKENS) == spans  # frames past the mask do not count
    changed = _audio()
    changed.input_features[1, 0, 0] += 1e-3
    other = multimodal_spans(ids, changed, TOKENS)
    assert other[0] == spans[0] and other[1].content_hash != spans[1].content_hash


def test_images_differ_by_grid_even_with_the_same_pixels() -> None:
    pixels = torch.randn(16, 12, generator=torch.Generator().manual_seed(1))
    ids = [1, 53] + [50] * 4 + [2]
    square = multimodal_spans(ids, MultimodalInputs(pixel_values=pixels, image_grid_thw=torch.tensor([[1, 4, 4]])),
                              TOKENS)
    wide = multimodal_spans(ids, MultimodalInputs(pixel_values=pixels, image_grid_thw=torch.tensor([[1, 2, 8]])),
                            TOKENS)
    assert square[0].start == 2 and square[0].end == 6
    assert square[0].content_hash != wide[0].content_hash


def test_placeholders_without_their_items_are_never_keyed() -> None:
    ids = _audio_ids()
    assert multimodal_spans(ids + [52], _audio(), TOKENS) is None  # one placeholder too many
    assert multimodal_spans(ids, MultimodalInputs(), TOKENS) is None  # literal placeholders, no audio
    assert multimodal_spans([1, 2, 3], MultimodalInputs(), TOKENS) == ()  # text only: nothing to key
