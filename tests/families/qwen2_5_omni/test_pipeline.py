"""A Qwen2.5-Omni checkpoint served through the generic pipeline (its preset, front end, entry input, workers,
edges; token2wav on the generic codec edge): chat text, an image and a video prompt, greedy, equal to the thinker's engine run alone; a spoken reply (greedy
talker) whose waveform equals the offline path's (thinker, talker, token2wav run one after the other)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from omnistage.models.qwen2_5_omni.inputs import OmniInputs
from omnistage.pipeline.omni import Omni
from omnistage.pipeline.options import PipelineOptions
from tests.families.qwen2_5_omni.specs import TALKER_TOKENS, small_spec


@pytest.fixture(scope="module")
def omni(omni25_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    spec = small_spec(tmp_path_factory.mktemp("stages"))
    with Omni(omni25_dir, spec, options=PipelineOptions(in_process=True)) as omni:
        yield omni


def test_chat_text_through_the_pipeline(omni: Omni, omni25_dir: Path) -> None:
    from omnistage.families.qwen2_5_omni.verify import greedy_tokens
    from omnistage.models.qwen2_5_omni.thinker import Thinker

    out = list(omni.generate("Hello, how are you?", max_tokens=6, ignore_eos=True))[-1]
    assert out.finished and out.usage.completion_tokens == 6
    prompt = omni.prompt("Hello, how are you?")
    expected = greedy_tokens(Thinker.from_checkpoint(omni25_dir), list(prompt.token_ids), None, 6)
    assert omni.pipeline.front_end.processor.tokenizer.decode(expected, skip_special_tokens=True) == out.text


def test_image_prompt_through_the_pipeline(omni: Omni) -> None:
    image = Image.fromarray((np.random.default_rng(0).random((56, 84, 3)) * 255).astype(np.uint8))
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is this?"}]}]
    prompt = omni.prompt(messages, images=[image])
    assert prompt.mm.image_grid_thw is not None
    out = list(omni.generate(messages, images=[image], max_tokens=4, ignore_eos=True))[-1]
    assert out.finished and out.error is None and out.usage.completion_tokens == 4


def test_video_prompt_through_the_pipeline(omni: Omni) -> None:
    from omnistage.processing.video import Video

    rng = np.random.default_rng(1)
    frames = [Image.fromarray((rng.random((56, 56, 3)) * 255).astype(np.uint8)) for _ in range(3)]
    messages = [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "What happens?"}]}]
    prompt = omni.prompt(messages, videos=[Video(frames, fps=2.0)])
    grid = prompt.mm.video_grid_thw
    assert grid.tolist() == [[2, 4, 4]]  # 3 frames padded to 2 temporal patches of 2; 56 px = 4 patches of 14
    video_id = omni.pipeline.front_end.processor.video_token_id
    assert prompt.token_ids.count(video_id) == 2 * 4 * 4 // 4 == prompt.mm.pixel_values_videos.shape[0] // 4
    assert prompt.mm.video_second_per_grid.tolist() == [1.0]  # temporal patch of 2 frames at 2 fps
    out = list(omni.generate(messages, videos=[Video(frames, fps=2.0)], max_tokens=4, ignore_eos=True))[-1]
    assert out.finished and out.error is None and out.usage.completion_tokens == 4


@pytest.mark.parametrize("voice", ("Ethan", ""))
def test_spoken_reply_equals_the_offline_path(voice: str, omni: Omni, omni25_dir: Path) -> None:
    from omnistage.families.qwen2_5_omni.offline import generate_spoken, load_talker_context
    from omnistage.families.qwen2_5_omni.voices import SYSTEM_PROMPT, load_speakers
    from omnistage.models.qwen2_5_omni.config import Qwen25OmniConfig
    from omnistage.models.qwen2_5_omni.thinker import Thinker
    from omnistage.models.qwen2_5_omni.token2wav import SAMPLES_PER_CODE, Token2Wav
    from omnistage.sampling_params import SamplingParams

    messages = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": "Hello, how are you?"}]
    out = list(omni.generate(messages, modalities=("text", "audio"), max_tokens=6, ignore_eos=True, seed=3,
                             voice=voice))[-1]
    assert out.error is None and out.finished and out.audio is not None
    assert omni.prompt(messages).speech_system_prompt
    config = Qwen25OmniConfig.from_folder(omni25_dir)
    thinker = Thinker.from_checkpoint(omni25_dir, config=config)
    speaker = load_speakers(omni25_dir)[voice or "Chelsie"]
    ctx = load_talker_context(omni25_dir, thinker, config)
    reply = generate_spoken(thinker, ctx, list(omni.prompt(messages).token_ids), OmniInputs(), speaker.bos_token,
                            SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True),
                            SamplingParams(temperature=0.0, max_tokens=TALKER_TOKENS, repetition_penalty=1.05),
                            None)
    codes = reply.audio_codes(ctx.stop_codes)
    wav = Token2Wav.from_checkpoint(omni25_dir, config=config)(torch.tensor(codes), speaker.cond, speaker.ref_mel, 3)
    audio = torch.from_numpy(out.audio).reshape(-1)
    assert audio.shape == wav.shape == (len(codes) * SAMPLES_PER_CODE,)
    assert (audio - wav).abs().max().item() < 1e-5
