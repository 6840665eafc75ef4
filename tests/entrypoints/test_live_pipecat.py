"""pipecat's ``OpenAILiveLLMService`` (GPT-Live) against ``WS /v1/live/sessions`` on a fake engine: PCM frames of
a spoken turn reach the server's VAD, the answer's speech audio and text reach the pipeline, the user's turn comes
back written down, and the end of the pipeline closes the session (``session.closed``)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from pipecat.frames.frames import LLMContextFrame, LLMFullResponseEndFrame, LLMTextFrame, SpeechOutputAudioRawFrame
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.services.openai.live.llm import OpenAILiveLLMService

from tests.audio.signals import peak_hz
from tests.entrypoints.conftest import LiveServer
from tests.entrypoints.fake_engine import SINE_HZ
from tests.entrypoints.test_live import turn
from tests.entrypoints.test_pipecat import RATE, drive, errors, pcm_frames

pytestmark = pytest.mark.e2e


def test_live_service_hears_the_turn_and_plays_the_answer(server: LiveServer) -> None:
    url = server.base_url.replace("http://", "ws://") + "/v1/live/sessions"
    service = OpenAILiveLLMService(api_key="unused", base_url=url, settings=OpenAILiveLLMService.Settings(
        model=server.engine.model_name, system_instruction="You are a helpful assistant."))
    down, up = asyncio.run(drive([service], [LLMContextFrame(LLMContext()), *pcm_frames(turn())],
                                 LLMFullResponseEndFrame))
    assert errors(up) == []
    audio = b"".join(f.audio for f in down if isinstance(f, SpeechOutputAudioRawFrame))
    samples = np.frombuffer(audio, "<i2").astype(np.float32) / 32767
    assert len(samples) > 0 and abs(peak_hz(samples, RATE) - SINE_HZ) < 5  # the fake engine's voice
    assert "".join(f.text for f in down if isinstance(f, LLMTextFrame)) == "Hello from the fake engine."
    request = next(r for r in server.engine.requests if r.wants_audio)
    rendered = server.engine.front_end.processor.tokenizer.decode(request.prompt.token_ids)
    assert "You are a helpful assistant." in rendered
