"""Clients unchanged against a Qwen3-ASR server: LiteLLM's ``transcription`` and openai-agents' STT model (what a
``VoicePipeline`` hears through) get the recogniser's transcript, the same as the OpenAI SDK's."""

from __future__ import annotations

import asyncio
import io
import os
from pathlib import Path

import numpy as np
import openai
import pytest
import soundfile as sf

from tests.entrypoints.speech_sample import speech

pytestmark = pytest.mark.e2e
RATE = 16000


@pytest.fixture(scope="module")
def wav_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    samples, _ = speech("Hello world, this is a test.", RATE)
    path = tmp_path_factory.mktemp("clients") / "hello.wav"
    sf.write(path, samples, RATE, subtype="PCM_16")
    return path


def _sdk_text(url: str, path: Path) -> str:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=120)
    return client.audio.transcriptions.create(model="asr", file=("a.wav", path.read_bytes())).text


def test_litellm_transcription(asr_url: str, wav_file: Path) -> None:
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no fetch of the price list
    import litellm

    with wav_file.open("rb") as f:
        result = litellm.transcription(model="openai/asr", file=f, api_base=f"{asr_url}/v1", api_key="none")
    assert result.text == _sdk_text(asr_url, wav_file)


def test_openai_agents_stt_model(asr_url: str, wav_file: Path) -> None:
    """openai-agents' ``OpenAISTTModel.transcribe`` (a ``VoicePipeline``'s STT on a whole ``AudioInput``)."""
    from agents.voice import AudioInput, OpenAIVoiceModelProvider, STTModelSettings

    samples, rate = sf.read(io.BytesIO(wav_file.read_bytes()), dtype="int16")

    async def run() -> str:
        client = openai.AsyncOpenAI(base_url=f"{asr_url}/v1", api_key="none", max_retries=0)
        model = OpenAIVoiceModelProvider(openai_client=client).get_stt_model("asr")
        return await model.transcribe(AudioInput(buffer=np.asarray(samples), frame_rate=rate), STTModelSettings(),
                                      False, False)

    # The agents' client posts its own WAV of the same 16-bit samples: the texts agree.
    assert asyncio.run(run()) == _sdk_text(asr_url, wav_file)
