"""A Qwen2.5-Omni checkpoint served through the generic pipeline (its preset, front end, entry input, worker):
chat text and an image prompt, greedy, equal to the thinker's engine run alone."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from omnistage.pipeline.omni import Omni
from omnistage.pipeline.options import PipelineOptions


@pytest.fixture(scope="module")
def omni(omni25_dir: Path):
    with Omni(omni25_dir, options=PipelineOptions(in_process=True)) as omni:
        yield omni


def test_chat_text_through_the_pipeline(omni: Omni, omni25_dir: Path) -> None:
    from omnistage.families.qwen2_5_omni.verify import greedy_tokens
    from omnistage.models.qwen2_5_omni.thinker import Thinker

    out = list(omni.generate("Hello, how are you?", max_tokens=6, ignore_eos=True))[-1]
    assert out.finished and out.usage.completion_tokens == 6
    prompt = omni.prompt("Hello, how are you?")
    expected = greedy_tokens(Thinker.from_checkpoint(omni25_dir), list(prompt.token_ids), None, 6)
    assert omni.pipeline.processor.tokenizer.decode(expected, skip_special_tokens=True) == out.text


def test_image_prompt_through_the_pipeline(omni: Omni) -> None:
    image = Image.fromarray((np.random.default_rng(0).random((56, 84, 3)) * 255).astype(np.uint8))
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is this?"}]}]
    prompt = omni.prompt(messages, images=[image])
    assert prompt.mm.image_grid_thw is not None
    out = list(omni.generate(messages, images=[image], max_tokens=4, ignore_eos=True))[-1]
    assert out.finished and out.error is None and out.usage.completion_tokens == 4
