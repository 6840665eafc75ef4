"""Qwen2.5-Omni's processor on a video with its sound track (``use_audio_in_video``): the placeholder becomes
transformers' interleaved layout (the one verify and the parity tests hold the thinker and talker to), the sound
track is the prompt's audio item."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from omnistage.families.qwen2_5_omni.family import FAMILY
from omnistage.families.qwen2_5_omni.verify_cases import AUDIO_FRAMES, prompt_cases
from omnistage.processing.video import Video
from tests.families.qwen2_5_omni.conftest import TAIL, TEXT


def test_audio_in_video_layout_is_transformers(omni25_dir: Path) -> None:
    from transformers import AutoConfig

    processor = FAMILY.front_end(omni25_dir, FAMILY.load_config(omni25_dir)).processor
    rng = np.random.default_rng(0)
    frames = [Image.fromarray((rng.random((56, 56, 3)) * 255).astype(np.uint8)) for _ in range(6)]
    track = (0.1 * rng.standard_normal(AUDIO_FRAMES * 160)).astype(np.float32)  # 160 samples per mel frame
    c = AutoConfig.from_pretrained(omni25_dir).thinker_config
    ids = TEXT + [c.vision_start_token_id, c.video_token_index, c.vision_end_token_id] + TAIL
    prompt = processor.process(ids, videos=[Video(frames, fps=1.0, audio=track)], use_audio_in_video=True)
    expected = prompt_cases(AutoConfig.from_pretrained(omni25_dir), TEXT + TAIL)["audio_in_video"]
    assert prompt.token_ids == expected.ids
    assert prompt.mm.use_audio_in_video and prompt.mm.video_grid_thw.tolist() == [[3, 4, 4]]
    assert int(prompt.mm.feature_attention_mask.sum()) == AUDIO_FRAMES
    with pytest.raises(ValueError, match="sound track"):
        processor.process(ids, videos=[Video(frames, fps=1.0)], use_audio_in_video=True)
