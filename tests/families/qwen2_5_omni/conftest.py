"""The tiny Qwen2.5-Omni checkpoint (made once per session), a live server on it (started once per session, for
the server test files), and its prompts, for the family's tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from omnistage.families.qwen2_5_omni import verify_cases
from omnistage.families.qwen2_5_omni.verify_cases import Case

TEXT = [563, 273, 198, 505, 11, 517, 332, 331, 30]  # "<|im_start|>user\nHello, how are you?"
TAIL = [564, 198, 563, 275, 198]  # "<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="session")
def omni25_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from omnistage.families.qwen2_5_omni.make_tiny import make_tiny

    return make_tiny(tmp_path_factory.mktemp("omni25-tiny"))


@pytest.fixture(scope="session")
def base_url(omni25_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The OpenAI server on the tiny checkpoint's pipeline (in process, the preset shrunk: ``specs.small_spec``),
    served as ``omni25``."""
    from omnistage.pipeline.async_omni import AsyncOmni
    from omnistage.pipeline.runtime import PipelineOptions
    from tests.entrypoints.server_thread import serving
    from tests.families.qwen2_5_omni.specs import small_spec

    engine = AsyncOmni(omni25_dir, small_spec(tmp_path_factory.mktemp("stages")), PipelineOptions(in_process=True),
                       "omni25")
    with serving(engine) as url:
        yield url


@pytest.fixture(scope="session")
def reference(omni25_dir: Path) -> torch.nn.Module:
    from transformers import Qwen2_5OmniForConditionalGeneration

    return Qwen2_5OmniForConditionalGeneration.from_pretrained(omni25_dir, dtype=torch.float32).eval()


def prompt_cases(config: object) -> dict[str, Case]:
    """Text, audio, image, video and a video with its sound track (``use_audio_in_video``), random inputs."""
    return verify_cases.prompt_cases(config, TEXT + TAIL)
