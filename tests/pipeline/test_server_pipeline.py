"""The OpenAI server on the real pipeline (tiny checkpoint): streamed text + speech, a video prompt, health and
metrics."""

from __future__ import annotations

import base64
from pathlib import Path

import httpx
import openai
import pytest

from omnistage.pipeline.async_omni import AsyncOmni
from omnistage.pipeline.runtime import PipelineOptions
from tests.entrypoints.media_samples import data_url, mp4_bytes
from tests.entrypoints.server_thread import serving
from tests.pipeline.specs import small_dict, write_spec

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def base_url(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    config = write_spec(tmp_path_factory.mktemp("stages"), small_dict(talker_frames=16))
    engine = AsyncOmni(tiny_dir, config, PipelineOptions(in_process=True, talker_min_new_tokens=8), "tiny")
    with serving(engine) as url:
        yield url


def test_streamed_chat_with_speech(base_url: str) -> None:
    client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0, timeout=60)
    stream = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hi"}], modalities=["text", "audio"],
        audio={"voice": "Ethan", "format": "pcm16"}, stream=True, max_tokens=24, seed=1)
    text, pcm, reasons = "", b"", []
    for chunk in stream:
        for choice in chunk.choices:
            text += choice.delta.content or ""
            audio = getattr(choice.delta, "audio", None)
            pcm += base64.b64decode(getattr(audio, "data", None) or "")
            reasons.append(choice.finish_reason)
    assert text and len(pcm) > 0 and len(pcm) % 2 == 0
    assert reasons[-1] in ("stop", "length")


def test_chat_with_a_video_url(base_url: str) -> None:
    """A data: URL mp4 becomes one video (4 frames at 2 fps → 2 temporal patches of 12x12 merged patches), which
    the thinker encodes and the talker speaks about; the same video again is served from the prefix cache."""
    client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0, timeout=60)
    content = [{"type": "video_url", "video_url": {"url": data_url("video/mp4", mp4_bytes())}},
               {"type": "text", "text": "what happens?"}]
    answers = [client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": content}], modalities=["text", "audio"],
        audio={"voice": "Ethan", "format": "wav"}, max_tokens=8, seed=1) for _ in range(2)]
    first, again = answers
    assert first.choices[0].message.content and first.choices[0].message.audio.data
    assert first.usage.prompt_tokens > 2 * 12 * 12
    assert again.choices[0].message.content == first.choices[0].message.content
    assert again.usage.prompt_tokens_details.cached_tokens >= 2 * 12 * 12


def test_health_and_metrics_read_the_replicas(base_url: str) -> None:
    health = httpx.get(f"{base_url}/health").json()
    assert health["status"] == "ok" and [s["stage"] for s in health["stages"]] == ["thinker", "talker", "code2wav"]
    lines = httpx.get(f"{base_url}/metrics").text.splitlines()
    # The small stage config gives the thinker 64 KV blocks; the server reports what the replica said.
    assert any("kv_blocks_total" in line and 'stage="thinker"' in line and line.endswith(" 64.0") for line in lines)
