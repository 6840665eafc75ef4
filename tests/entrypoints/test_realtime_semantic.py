"""``semantic_vad`` on ``WS /v1/realtime`` with real (espeak-ng) speech: the Smart Turn classifier ends a finished
turn at its first pause, waits through a pause inside a sentence, and a server without it says so."""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import Iterator

import httpx
import numpy as np
import pytest
from fastapi import FastAPI

from omnistage.audio.vad_backend import VadBackend
from omnistage.entrypoints.openai.realtime.route import install_realtime
from tests.audio.test_smart_turn import spoken
from tests.entrypoints.conftest import TEST_LIMITS, LiveServer
from tests.entrypoints.fake_engine import FakeEngine, RecordingProcessor, fake_front_end
from tests.entrypoints.server_thread import ServerThread
from tests.entrypoints.test_realtime import open_session, recv, send, stream_audio, until
from tests.entrypoints.test_webrtc import Client, Server, _serve

pytest.importorskip("onnxruntime")
pytestmark = pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="needs espeak-ng for real speech")
RATE = 24000


def at_24k(*pieces: np.ndarray) -> np.ndarray:
    from omnistage.audio.decode import resample

    return resample(np.concatenate(pieces), 16000, RATE).astype(np.float32)


def silence(seconds: float) -> np.ndarray:
    return np.zeros(int(seconds * 16000), np.float32)


async def turn_events(ws) -> list[dict]:  # noqa: ANN001
    """The turn edges and the response's end, in order, up to ``response.done``."""
    seen: list[dict] = []
    while not seen or seen[-1]["type"] != "response.done":
        event = await recv(ws)
        if event["type"] in ("input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped",
                             "response.done", "error"):
            seen.append(event)
    return seen


def test_a_finished_sentence_ends_the_turn_at_its_first_pause(server: LiveServer) -> None:
    """Eagerness low waits up to 8 s on an incomplete turn; 1.5 s of silence follow a finished question, and its
    turn ends where the speech did (the classifier's "complete" at a pause of 100-400 ms), then it is answered."""
    sentence = spoken("What is the weather like tomorrow?", tail_s=0.0)
    end_ms = (0.5 + len(sentence) / 16000) * 1000

    async def scenario() -> None:
        async with await open_session(server, output_modalities=["text"], audio={"input": {
                "turn_detection": {"type": "semantic_vad", "eagerness": "low"}}}) as ws:
            await stream_audio(ws, at_24k(silence(0.5), sentence, silence(1.5)), RATE)
            events = await turn_events(ws)
            assert [e["type"] for e in events] == ["input_audio_buffer.speech_started",
                                                   "input_audio_buffer.speech_stopped", "response.done"]
            assert end_ms - 150 <= events[1]["audio_end_ms"] <= end_ms + 150, (events[1], end_ms)
            assert events[2]["response"]["status"] == "completed"
    asyncio.run(scenario())
    # The reply is the speculative one started at the pause's first 64 ms, before the verdict: no second request.
    replies = [r for r in server.engine.requests if r.request_id.startswith("resp")]
    assert len(replies) == 1 and replies[0].plays_at is not None


@pytest.mark.parametrize("streaming", [True, False])
def test_a_pause_inside_a_sentence_does_not_end_the_turn(server: LiveServer, streaming: bool) -> None:
    """Beta's session shape, eagerness high (2 s at most): a 600 ms pause after "...know what the" is judged
    incomplete, so the one turn ends after the rest of the sentence. A speculative reply started at that pause
    (before the verdict) is aborted once the voice comes back; the client hears only the turn's own reply. Without
    streaming input nothing speculates: the one reply is the turn's."""
    head = spoken("I would like to know what the", tail_s=0.0)
    rest = spoken("weather will be like tomorrow.", tail_s=0.0)
    pause_ms = (0.5 + len(head) / 16000) * 1000
    end_ms = pause_ms + 600 + len(rest) / 16

    async def scenario() -> None:
        async with await open_session(server, modalities=["text"], speculative_reply_ms=100, turn_detection={
                "type": "semantic_vad", "eagerness": "high"}, streaming_input=streaming) as ws:
            await stream_audio(ws, at_24k(silence(0.5), head, silence(0.6), rest, silence(1.5)), RATE)
            events = await turn_events(ws)
            assert [e["type"] for e in events] == ["input_audio_buffer.speech_started",
                                                   "input_audio_buffer.speech_stopped", "response.done"]
            assert end_ms - 150 <= events[1]["audio_end_ms"] <= end_ms + 150, (events[1], end_ms)
    asyncio.run(scenario())
    replies = [r for r in server.engine.requests if r.request_id.startswith("resp")]
    # One started at the pause and was dropped (aborted, unless the fake engine had already finished it): the
    # events above show the client one response.
    assert len(replies) >= 2 if streaming else len(replies) == 1
    assert replies[-1].request_id not in server.engine.aborted


def test_without_the_classifier_semantic_vad_is_an_error_and_server_vad_stays(
        processor: RecordingProcessor) -> None:
    app = FastAPI()
    install_realtime(app, FakeEngine(fake_front_end(processor)), TEST_LIMITS, vad=VadBackend("energy"))
    thread = ServerThread(app)
    server = LiveServer(thread.start(), None, None)  # type: ignore[arg-type] - only its URL is used

    async def scenario() -> None:
        async with await open_session(server) as ws:
            await send(ws, {"type": "session.update", "session": {"type": "realtime", "audio": {"input": {
                "turn_detection": {"type": "semantic_vad"}}}}})
            error, _ = await until(ws, "error")
            assert error["error"]["code"] == "semantic_vad_unavailable"
            assert "omnistage[turn]" in error["error"]["message"]
            updated, _ = await until(ws, "session.updated")
            assert updated["session"]["audio"]["input"]["turn_detection"]["type"] == "server_vad"
    try:
        asyncio.run(scenario())
    finally:
        thread.stop()


@pytest.fixture(scope="module")
def webrtc_server(processor: RecordingProcessor) -> Iterator[Server]:
    yield from _serve(processor)  # the energy detector: its frames judged by the same classifier


def test_a_webrtc_call_with_semantic_vad_answers_a_finished_question_at_once(webrtc_server: Server) -> None:
    """The call's form asks for semantic_vad, eagerness low (8 s at most): a question spoken into the microphone
    (paced 20 ms frames) is committed well before 8 s of silence could have ended it."""
    question = at_24k(spoken("What is the weather like tomorrow?", tail_s=0.0))  # the microphone track's rate

    async def scenario() -> None:
        client = Client()
        async with httpx.AsyncClient(base_url=webrtc_server.base_url, timeout=20) as http:
            r = await client.connect(http, session={"type": "realtime", "output_modalities": ["text"], "audio": {
                "input": {"turn_detection": {"type": "semantic_vad", "eagerness": "low"}}}})
            assert r.status_code == 201, r.text
            created = await client.event("session.created")
            assert created["session"]["audio"]["input"]["turn_detection"]["type"] == "semantic_vad"
            client.mic.push(question)
            spoken_until = time.monotonic() + len(question) / RATE
            await client.event("input_audio_buffer.speech_started")
            await client.event("input_audio_buffer.speech_stopped", timeout=20)
            assert time.monotonic() - spoken_until < 4.0  # the classifier's "complete", not the 8 s wait
            await client.event("response.done", response__status="completed")
            await client.pc.close()

    asyncio.run(scenario())
