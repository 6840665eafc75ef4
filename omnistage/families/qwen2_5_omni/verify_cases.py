"""The prompts ``omnistage verify`` (and the family's parity tests) hold omnistage against transformers with: a chat
prompt alone and with an audio, an image, a video and a video with its sound track (``use_audio_in_video``), the
media drawn from a fixed generator and laid out as transformers' processor lays out their placeholders (the
encoder inputs given as tensors: transformers' video processor needs torchvision)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from omnistage.models.qwen2_5_omni.inputs import OmniInputs
from omnistage.models.qwen2_5_omni.tmrope import audio_output_length

AUDIO_FRAMES = 230  # mel frames of the audio (of 300 given)
TAIL_TOKENS = 5  # "<|im_end|>\n<|im_start|>assistant\n": the media block goes before it, ending the user's turn
CASE_NAMES = ("text", "audio", "image", "video", "audio_in_video")


@dataclass(frozen=True)
class Case:
    ids: list[int]
    mm: OmniInputs

    def hf_kwargs(self) -> dict[str, object]:
        """The encoder inputs as transformers' ``generate`` takes them."""
        names = ("input_features", "feature_attention_mask", "pixel_values", "image_grid_thw", "pixel_values_videos",
                 "video_grid_thw", "video_second_per_grid")
        kwargs: dict[str, object] = {n: getattr(self.mm, n) for n in names if getattr(self.mm, n) is not None}
        if self.mm.use_audio_in_video:
            kwargs["use_audio_in_video"] = True
        return kwargs

    def hf_spoken_kwargs(self) -> dict[str, object]:
        """The same for the whole model's ``generate``, which hands unprefixed inputs to its talker too: pixels
        go to the thinker alone (``thinker_`` prefix; the talker's ``generate`` refuses them), grids to both."""
        pixels = ("pixel_values", "pixel_values_videos")
        return {f"thinker_{k}" if k in pixels else k: v for k, v in self.hf_kwargs().items()}


def _media(config: object) -> dict[str, tuple[list[int], OmniInputs]]:
    c = config.thinker_config
    audio, image, video = c.audio_token_index, c.image_token_index, c.video_token_index
    vs, ve, a_s, a_e = c.vision_start_token_id, c.vision_end_token_id, c.audio_start_token_id, c.audio_end_token_id
    g = torch.Generator().manual_seed(0)
    features = torch.randn(1, c.audio_config.num_mel_bins, 300, generator=g)
    mask = torch.zeros(1, 300, dtype=torch.long)
    mask[0, :AUDIO_FRAMES] = 1
    rows = audio_output_length(AUDIO_FRAMES)
    patch = c.vision_config.in_channels * c.vision_config.temporal_patch_size * c.vision_config.patch_size ** 2
    merge = c.vision_config.spatial_merge_size
    image_grid, pixels = torch.tensor([[1, 2 * merge, 3 * merge]]), torch.randn(6 * merge ** 2, patch, generator=g)
    video_grid, frames = torch.tensor([[3, 2 * merge, 2 * merge]]), torch.randn(12 * merge ** 2, patch, generator=g)
    movie = dict(pixel_values_videos=frames, video_grid_thw=video_grid, video_second_per_grid=torch.tensor([2.0]))
    # The sound track interleaved in 2-second chunks (50 positions at 25 per second): video t=0 (4 rows), audio
    # 0..49, video t=50, audio 50.., video t=100.
    interleaved = [video] * 4 + [audio] * 50 + [video] * 4 + [audio] * (rows - 50) + [video] * 4
    return {
        "text": ([], OmniInputs()),
        "audio": ([a_s] + [audio] * rows + [a_e], OmniInputs(input_features=features, feature_attention_mask=mask)),
        "image": ([vs] + [image] * 6 + [ve], OmniInputs(pixel_values=pixels, image_grid_thw=image_grid)),
        "video": ([vs] + [video] * 12 + [ve], OmniInputs(**movie)),
        "audio_in_video": ([vs, a_s] + interleaved + [a_e, ve],
                           OmniInputs(input_features=features, feature_attention_mask=mask, use_audio_in_video=True,
                                      **movie)),
    }


def prompt_cases(config: object, chat_ids: list[int]) -> dict[str, Case]:
    """Each case: ``chat_ids`` (a one-turn chat, assistant turn opened) with its media block ending the user's turn.
    config: transformers' ``Qwen2_5OmniConfig``."""
    head, tail = chat_ids[:-TAIL_TOKENS], chat_ids[-TAIL_TOKENS:]
    return {name: Case(head + block + tail, mm) for name, (block, mm) in _media(config).items()}
