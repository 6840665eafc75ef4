"""The tiny Qwen2.5-Omni checkpoint (made once per session) and its prompts, for the family's tests."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from omnistage.models.qwen2_5_omni.inputs import OmniInputs
from omnistage.models.qwen2_5_omni.tmrope import audio_output_length

TEXT = [563, 273, 198, 505, 11, 517, 332, 331, 30]  # "<|im_start|>user\nHello, how are you?"
TAIL = [564, 198, 563, 275, 198]  # "<|im_end|>\n<|im_start|>assistant\n"
AUDIO_FRAMES = 230


@pytest.fixture(scope="session")
def omni25_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from omnistage.families.qwen2_5_omni.make_tiny import make_tiny

    return make_tiny(tmp_path_factory.mktemp("omni25-tiny"))


@pytest.fixture(scope="session")
def reference(omni25_dir: Path) -> torch.nn.Module:
    from transformers import Qwen2_5OmniForConditionalGeneration

    return Qwen2_5OmniForConditionalGeneration.from_pretrained(omni25_dir, dtype=torch.float32).eval()


@dataclass(frozen=True)
class Case:
    ids: list[int]
    mm: OmniInputs

    def hf_kwargs(self) -> dict[str, object]:
        names = ("input_features", "feature_attention_mask", "pixel_values", "image_grid_thw", "pixel_values_videos",
                 "video_grid_thw", "video_second_per_grid")
        kwargs: dict[str, object] = {n: getattr(self.mm, n) for n in names if getattr(self.mm, n) is not None}
        if self.mm.use_audio_in_video:
            kwargs["use_audio_in_video"] = True
        return kwargs


def prompt_cases(config: object) -> dict[str, Case]:
    """Text, audio, image, video and a video with its sound track (``use_audio_in_video``), random inputs."""
    c = config.thinker_config
    audio, image, video = c.audio_token_index, c.image_token_index, c.video_token_index
    vs, ve, a_s, a_e = c.vision_start_token_id, c.vision_end_token_id, c.audio_start_token_id, c.audio_end_token_id
    g = torch.Generator().manual_seed(0)
    features = torch.randn(1, 128, 300, generator=g)
    mask = torch.zeros(1, 300, dtype=torch.long)
    mask[0, :AUDIO_FRAMES] = 1
    rows = audio_output_length(AUDIO_FRAMES)
    sound = OmniInputs(input_features=features, feature_attention_mask=mask)
    image_grid, pixels = torch.tensor([[1, 4, 6]]), torch.randn(24, 3 * 2 * 14 * 14, generator=g)
    video_grid, frames = torch.tensor([[3, 4, 4]]), torch.randn(48, 3 * 2 * 14 * 14, generator=g)
    seconds = torch.tensor([2.0])
    movie = dict(pixel_values_videos=frames, video_grid_thw=video_grid, video_second_per_grid=seconds)
    # Sound track interleaved in 2-second chunks (50 positions): video t=0 (4 rows), audio 0..49, video t=50,
    # audio 50..56, video t=100.
    interleaved = [video] * 4 + [audio] * 50 + [video] * 4 + [audio] * (rows - 50) + [video] * 4
    return {
        "text": Case(TEXT + TAIL, OmniInputs()),
        "audio": Case(TEXT + [a_s] + [audio] * rows + [a_e] + TAIL, sound),
        "image": Case(TEXT + [vs] + [image] * 6 + [ve] + TAIL,
                      OmniInputs(pixel_values=pixels, image_grid_thw=image_grid)),
        "video": Case(TEXT + [vs] + [video] * 12 + [ve] + TAIL, OmniInputs(**movie)),
        "audio_in_video": Case(TEXT + [vs, a_s] + interleaved + [a_e, ve] + TAIL,
                               OmniInputs(input_features=features, feature_attention_mask=mask,
                                          use_audio_in_video=True, **movie)),
    }
