"""GPT-Live clients, unchanged, against the real tiny Qwen3-Omni pipeline on ``WS /v1/live/sessions``: the
``openai`` SDK's ``client.live.connect()``, LiveKit's ``GPTLiveModel`` (livekit-plugins-openai 1.8.9, its
defaults: Responses delegation, voice marin) and pipecat's ``OpenAILiveLLMService`` each speak an espeak-ng question; server VAD ends the turn, the
reply's audio and transcript come back with the user's transcript, and the session closes cleanly
(``session.closed``), every stage idle after."""

from __future__ import annotations

import asyncio
import base64
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pipecat.frames.frames import LLMContextFrame, LLMFullResponseEndFrame, LLMTextFrame, SpeechOutputAudioRawFrame
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.services.openai.live.llm import OpenAILiveLLMService

from omnistage.audio.decode import resample
from omnistage.entrypoints.openai.api_server import build_app
from omnistage.entrypoints.openai.server_config import ServingOptions
from omnistage.pipeline.async_omni import AsyncOmni
from omnistage.pipeline.runtime import PipelineOptions
from tests.audio.test_smart_turn import spoken
from tests.entrypoints.live_client import live_problems, livekit_session, pcm_pieces, read_until, sdk_client
from tests.entrypoints.server_thread import ServerThread
from tests.entrypoints.test_pipecat import drive, errors, pcm_frames
from tests.pipeline.specs import small_dict, write_spec

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="real speech")]
RATE = 24000
TIMEOUT_S = 120.0  # a loaded 2-core host: the turn's transcript and reply share the tiny thinker


class _Server:
    def __init__(self, base_url: str, engine: AsyncOmni) -> None:
        self.base_url, self.engine = base_url, engine


@pytest.fixture(scope="module")
def live(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    data = small_dict()
    data["stages"][0]["sampling"]["max_tokens"] = 12  # a random thinker rarely stops: short replies
    config = write_spec(tmp_path_factory.mktemp("stages"), data)
    engine = AsyncOmni(tiny_dir, config, PipelineOptions(in_process=True), "tiny")
    # The energy detector: no model to load, and espeak's voice is loud and clean.
    thread = ServerThread(build_app(engine, serving=ServingOptions(vad="energy")))
    try:
        yield _Server(thread.start(), engine)
    finally:
        thread.stop()
        asyncio.run(engine.shutdown())


def question() -> np.ndarray:
    """Half a second of quiet, an espeak-ng question, then 1.5 s of quiet (server VAD's turn end), at 24 kHz."""
    speech = resample(spoken("How are you today?", tail_s=0.0), 16000, RATE).astype(np.float32)
    return np.concatenate([np.zeros(RATE // 2, np.float32), speech, np.zeros(3 * RATE // 2, np.float32)])


def _idle(engine: AsyncOmni, timeout_s: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not any(r.kv_blocks_used + r.running + r.queue_depth for r in engine.stats().replicas):
            return True
        time.sleep(0.05)
    return False


def test_openai_sdk_live_session_on_tiny_qwen3_omni(live: _Server) -> None:
    seen: list[dict[str, Any]] = []
    kinds = ("session.output_audio.delta", "session.output_transcript.delta", "session.input_transcript.delta")

    async def scenario() -> None:
        async with sdk_client(live.base_url).live.connect() as conn:
            await conn.session.start(session={"model": "tiny", "instructions": "Answer briefly."})
            await read_until(conn, lambda e: e["type"] == "session.started", seen, TIMEOUT_S)
            for piece in pcm_pieces(question(), RATE):
                await conn.session.input_audio.append(audio=piece)
            # The reply is done when usage follows it; the user's transcript may come on either side of it.
            await read_until(conn, lambda e: e["type"] == "session.usage.updated"
                             and all(any(s["type"] == k for s in seen) for k in kinds), seen, TIMEOUT_S)
            await conn.session.close()
            await read_until(conn, lambda e: e["type"] == "session.closed", seen, TIMEOUT_S)
    asyncio.run(scenario())
    assert live_problems(seen) == [] and not [e for e in seen if e["type"] == "error"]
    pcm = b"".join(base64.b64decode(e["delta"]) for e in seen if e["type"] == "session.output_audio.delta")
    assert len(pcm) > RATE // 10 and len(pcm) % 2 == 0  # over 50 ms of reply
    assert seen[-1]["reason"] == "close_requested"
    assert _idle(live.engine)


def test_livekit_gpt_live_model_on_tiny_qwen3_omni(live: _Server) -> None:
    run = asyncio.run(livekit_session(live.base_url, "tiny", question(), RATE, lambda r: bool(
        r.said and r.samples and any(e["type"] == "session.usage.updated" for e in r.events)), TIMEOUT_S))
    assert run.errors == [] and live_problems(run.events) == []
    assert "".join(run.said) and run.samples > RATE // 20
    assert any(e["type"] == "info" and e["code"] == "delegation_unavailable" for e in run.events)  # its default
    assert run.events[-1]["type"] == "session.closed" and run.events[-1]["reason"] == "close_requested"
    assert _idle(live.engine)


def test_pipecat_live_service_on_tiny_qwen3_omni(live: _Server) -> None:
    url = live.base_url.replace("http://", "ws://") + "/v1/live/sessions"
    service = OpenAILiveLLMService(api_key="unused", base_url=url, settings=OpenAILiveLLMService.Settings(
        model="tiny", system_instruction="Answer briefly."))
    down, up = asyncio.run(drive([service], [LLMContextFrame(LLMContext()), *pcm_frames(question())],
                                 LLMFullResponseEndFrame))
    assert errors(up) == []
    assert sum(len(f.audio) for f in down if isinstance(f, SpeechOutputAudioRawFrame)) > RATE // 10
    assert "".join(f.text for f in down if isinstance(f, LLMTextFrame))
    assert _idle(live.engine)
