"""Realtime transcription sessions as OpenAI runs them: opened with ``?intent=transcription`` or turned into one by
``session.update`` with ``type: "transcription"``; committed audio (by the client or the server VAD) is written down
as ``conversation.item.input_audio_transcription.delta/completed`` and never answered; the session object has the
shape of the SDK's ``RealtimeTranscriptionSessionCreateRequest``."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from openai.types.realtime import RealtimeTranscriptionSessionCreateRequest
from websockets.asyncio.client import connect

from tests.audio.signals import speech_like
from tests.entrypoints.conftest import LiveServer
from tests.entrypoints.realtime_validators import agents_problems, sdk_problems
from tests.entrypoints.test_realtime import pcm16_pieces, ws_url
from tests.entrypoints.test_realtime_schemas import Recorder

RATE = 24000
TRANSCRIBED = "conversation.item.input_audio_transcription.completed"
ALLOWED = {"session.created", "session.updated", "input_audio_buffer.speech_started",
           "input_audio_buffer.speech_stopped", "input_audio_buffer.committed", "input_audio_buffer.cleared",
           "conversation.item.input_audio_transcription.delta", TRANSCRIBED, "error"}


async def transcription_session(server: LiveServer, via_intent: bool) -> list[dict]:
    url = ws_url(server) + ("?intent=transcription" if via_intent else "")
    async with connect(url) as ws:
        s = Recorder(ws)
        created = await s.until("session.created")
        assert created["session"]["type"] == ("transcription" if via_intent else "realtime")
        update = {"audio": {"input": {"transcription": {"model": "whisper-1", "language": "en"},
                                      "turn_detection": {"type": "server_vad", "silence_duration_ms": 300}}}}
        await s.update({"type": "transcription", **update})
        silence = np.zeros(RATE // 2, np.float32)
        for piece in pcm16_pieces(np.concatenate([silence, speech_like(0.8, RATE), silence]), RATE):
            await s.send({"type": "input_audio_buffer.append", "audio": piece})
        await s.until(TRANSCRIBED)  # the server VAD's turn
        for piece in pcm16_pieces(speech_like(0.3, RATE), RATE):
            await s.send({"type": "input_audio_buffer.append", "audio": piece})
        await s.send({"type": "input_audio_buffer.commit"})
        await s.until(TRANSCRIBED)  # the client's commit
        await s.send({"type": "response.create"})  # nothing to answer with
        await s.until("error")
        await s.send({"type": "conversation.item.create", "item": {
            "type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}})
        await s.until("error")
        await s.update({"audio": {"input": {"turn_detection": None}}})
        return s.events


@pytest.mark.parametrize("via_intent", [True, False])
def test_transcription_session_only_transcribes(server: LiveServer, via_intent: bool) -> None:
    events = asyncio.run(transcription_session(server, via_intent))
    kinds = [e["type"] for e in events]
    assert set(kinds) <= ALLOWED, set(kinds) - ALLOWED
    assert kinds.count(TRANSCRIBED) == 2 and kinds.count("input_audio_buffer.committed") == 2
    transcripts = [e["transcript"] for e in events if e["type"] == TRANSCRIBED]
    assert transcripts == ["Hello from the fake engine."] * 2
    # Every request the engine saw was a text-only transcription (the two commits', and any written down while the
    # VAD's turn was spoken): nothing was answered or spoken.
    assert len(server.engine.requests) >= 2 and not any(r.wants_audio for r in server.engine.requests)
    session = [e for e in events if e["type"] == "session.updated"][-1]["session"]
    RealtimeTranscriptionSessionCreateRequest.model_validate(session)
    assert session["type"] == "transcription" and session["object"] == "realtime.transcription_session"
    assert session["audio"]["input"]["transcription"] == {"model": "whisper-1", "language": "en"}
    assert session["audio"]["input"]["turn_detection"] is None and "output_modalities" not in session
    errors = [e["error"] for e in events if e["type"] == "error"]
    assert [e["param"] for e in errors] == ["type", "type"]
    assert sdk_problems(events) == [] and asyncio.run(agents_problems(events)) == []
