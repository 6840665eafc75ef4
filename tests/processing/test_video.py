"""The video path of the prompt processor makes what transformers' Qwen3-Omni processor makes for frames at a
known rate: one frame size, frames padded to whole temporal patches, the video processor's patch layout, and
``t·h·w / merge²`` placeholders."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from omnistage.families.qwen3_omni.prompt import Qwen3OmniPromptProcessor
from omnistage.models.qwen3_omni.config import ProcessorSettings
from omnistage.families.qwen3_omni.video_processor import QWEN3_OMNI_VIDEO_SIZE, VideoProcessor
from omnistage.processing.video import Video

PATCH, MERGE, TEMPORAL = 16, 2, 2


@pytest.fixture(scope="module")
def videos() -> VideoProcessor:
    settings = ProcessorSettings(audio_token_id=0, image_token_id=1, video_token_id=2, n_window=50, num_mel_bins=128,
                                 patch_size=PATCH, temporal_patch_size=TEMPORAL, merge_size=MERGE)
    return VideoProcessor.from_folder(Path("/nonexistent"), settings)


def _frame(seed: int, height: int = 70, width: int = 100) -> Image.Image:
    return Image.fromarray((np.random.default_rng(seed).random((height, width, 3)) * 255).astype(np.uint8))


def _reference_patchify(frames: list[np.ndarray]) -> tuple[torch.Tensor, list[int]]:
    """transformers' ``Qwen2VLVideoProcessor.patchify`` (which needs torchvision to import), on frames already
    at a valid size: rescale + normalize with mean = std = 0.5, pad by the last frame, then its view/permute."""
    video = torch.from_numpy(np.stack(frames)).permute(0, 3, 1, 2).float()[None] / 255.0
    video = (video - 0.5) / 0.5
    if pad := -video.shape[1] % TEMPORAL:
        video = torch.cat((video, video[:, -1:].expand(-1, pad, -1, -1, -1)), dim=1)
    b, t, c, h, w = video.shape
    gt, gh, gw = t // TEMPORAL, h // PATCH, w // PATCH
    patches = video.view(b, gt, TEMPORAL, c, gh // MERGE, MERGE, PATCH, gw // MERGE, MERGE, PATCH)
    patches = patches.permute(0, 1, 4, 7, 5, 8, 3, 2, 6, 9)
    return patches.reshape(gt * gh * gw, c * TEMPORAL * PATCH * PATCH), [gt, gh, gw]


def test_two_frames_of_one_image_equal_the_image(videos: VideoProcessor) -> None:
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    image = _frame(0)
    # The image processor with the video's pixel bounds: it repeats an image over the temporal patch.
    reference = Qwen2VLImageProcessorPil(patch_size=PATCH, temporal_patch_size=TEMPORAL, merge_size=MERGE,
                                         size=dict(QWEN3_OMNI_VIDEO_SIZE), image_mean=[0.5] * 3,
                                         image_std=[0.5] * 3)(images=[image], return_tensors="pt")
    for frames in ([image, image], [image]):  # one frame is padded to two by repeating it
        out = videos([Video(frames, fps=2.0)])
        assert torch.equal(out.grid_thw, reference["image_grid_thw"])
        assert out.grid_thw[0, 0] == 1
        torch.testing.assert_close(out.pixel_values, reference["pixel_values"], rtol=0, atol=0)


@pytest.mark.parametrize("count", [3, 4])
def test_distinct_frames_follow_the_video_processor_layout(videos: VideoProcessor, count: int) -> None:
    # 384 x 352 is a multiple of 32 inside the video pixel bounds: resizing keeps it, so the reference is exact.
    frames = [np.asarray(_frame(seed, 352, 384)) for seed in range(count)]
    expected, grid = _reference_patchify(frames)
    out = videos([Video(frames, fps=4.0)])
    assert out.grid_thw.tolist() == [grid] and grid[0] == 2  # an odd count is padded with its last frame
    torch.testing.assert_close(out.pixel_values, expected, rtol=0, atol=1e-6)
    assert out.second_per_grid.tolist() == [TEMPORAL / 4.0]


def test_frames_share_one_size(videos: VideoProcessor) -> None:
    """A frame at another resolution takes the first frame's size, so the clip has one grid."""
    first, small = _frame(0), _frame(1, 35, 50)
    out = videos([Video([first, small], fps=1.0)])
    expected = videos([Video([first, small.resize(first.size, Image.Resampling.BICUBIC)], fps=1.0)])
    assert out.grid_thw.tolist() == expected.grid_thw.tolist() == [[1, 20, 28]]
    torch.testing.assert_close(out.pixel_values, expected.pixel_values, rtol=0, atol=0)


def test_bad_videos_are_refused() -> None:
    with pytest.raises(ValueError, match="at least one frame"):
        Video([], fps=1.0)
    with pytest.raises(ValueError, match="fps"):
        Video([_frame(0)], fps=0.0)


def test_prompt_gets_one_placeholder_per_merged_patch(tiny_dir: Path) -> None:
    proc = Qwen3OmniPromptProcessor.from_folder(tiny_dir)
    ids = proc.apply_chat_template([{"role": "user", "content": [
        {"type": "video"}, {"type": "text", "text": "and"}, {"type": "image"}, {"type": "video"}]}])
    tokens = proc.tokenizer.convert_tokens_to_ids
    assert ids.count(proc.video_token_id) == 2 and ids.count(tokens("<|vision_start|>")) == 3
    clips = [Video([_frame(i) for i in range(3)], fps=2.0), Video([_frame(9, 64, 64)], fps=0.5)]
    prompt = proc.process(ids, images=[_frame(5)], videos=clips)
    mm = prompt.mm
    assert mm.video_grid_thw.tolist() == [[2, 20, 28], [1, 24, 24]]
    assert mm.video_second_per_grid.tolist() == [1.0, 4.0]
    assert mm.pixel_values_videos.shape == (2 * 20 * 28 + 24 * 24, 3 * TEMPORAL * PATCH * PATCH)
    expanded = prompt.token_ids
    assert expanded.count(proc.video_token_id) == (2 * 20 * 28 + 24 * 24) // MERGE**2
    # Each video's run sits between its own vision start/end, in order.
    start = expanded.index(proc.video_token_id)
    assert expanded[start - 1] == tokens("<|vision_start|>")
    assert expanded[start + 2 * 20 * 28 // 4] == tokens("<|vision_end|>")
    with pytest.raises(ValueError, match="more placeholders"):
        proc.process(ids, images=[_frame(5)], videos=clips[:1])
