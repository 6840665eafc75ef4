"""The verify prompts: text-only, text+audio, text+image, text+video, built with or without a tokenizer."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from PIL import Image

from omnistage.models.qwen3_omni.config import Qwen3OmniConfig
from omnistage.families.qwen3_omni.prompt import Qwen3OmniPrompt, Qwen3OmniPromptProcessor
from omnistage.processing.video import Video


@dataclass(frozen=True)
class VerifyCase:
    name: str
    prompt: Qwen3OmniPrompt
    audios: list[np.ndarray] = field(default_factory=list)


def _synthetic_audio(seconds: float = 1.0, seed: int = 0) -> np.ndarray:
    """A speech-like test signal: a gliding tone with noise, 16 kHz."""
    rng = np.random.RandomState(seed)
    t = np.arange(int(16000 * seconds)) / 16000
    tone = 0.3 * np.sin(2 * np.pi * (180 + 60 * t) * t)
    return (tone + 0.02 * rng.randn(t.size)).astype(np.float32)


def _synthetic_image(seed: int = 0) -> Image.Image:
    pixels = (np.random.RandomState(seed).rand(64, 64, 3) * 255).astype(np.uint8)
    return Image.fromarray(pixels)


def _synthetic_video(frames: int = 3) -> Video:
    """Distinct frames (an odd count, so the temporal padding is exercised) at 2 fps: one temporal patch spans a
    whole second, so M-RoPE time positions are integers and transformers' fractional ones agree."""
    return Video([_synthetic_image(seed) for seed in range(1, frames + 1)], fps=2.0)


def _ids_without_tokenizer(config: Qwen3OmniConfig, part: str) -> list[int]:
    """ChatML by id: the config names every special id the model needs; filler ids stand in for words."""
    thinker, talker, ids = config.hf.thinker_config, config.hf.talker_config, config.talker_ids
    if ids is None:
        raise ValueError("verify needs a checkpoint with a talker")
    vocab = int(thinker.text_config.vocab_size)
    newline, words = 198 % vocab, [(100 + 7 * i) % vocab for i in range(5)]
    placeholder = {
        "text": [],
        "audio": [thinker.audio_start_token_id, thinker.audio_token_id, thinker.audio_start_token_id + 1],
        "image": [talker.vision_start_token_id, thinker.image_token_id, talker.vision_start_token_id + 1],
        "video": [talker.vision_start_token_id, thinker.video_token_id, talker.vision_start_token_id + 1],
    }[part]
    return ([ids.im_start, ids.user, newline, *placeholder, *words, config.im_end_token_id, newline,
             ids.im_start, ids.assistant, newline])


def build_cases(proc: Qwen3OmniPromptProcessor, config: Qwen3OmniConfig) -> list[VerifyCase]:
    audio, image = _synthetic_audio(), _synthetic_image()
    parts = {
        "text": ([{"type": "text", "text": "Tell me a short story."}], {}),
        "text+audio": ([{"type": "audio"}, {"type": "text", "text": "What do you hear?"}], {"audios": [audio]}),
        "text+image": ([{"type": "image"}, {"type": "text", "text": "What is in the picture?"}], {"images": [image]}),
        "text+video": ([{"type": "video"}, {"type": "text", "text": "What happens?"}],
                       {"videos": [_synthetic_video()]}),
    }
    cases = []
    for name, (content, items) in parts.items():
        if proc.tokenizer is not None:
            ids = proc.apply_chat_template([{"role": "user", "content": content}])
        else:
            ids = _ids_without_tokenizer(config, name.split("+")[-1])
        cases.append(VerifyCase(name=name, prompt=proc.process(ids, **items), audios=items.get("audios", [])))
    return cases
