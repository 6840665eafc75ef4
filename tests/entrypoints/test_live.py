"""``WS /v1/live/sessions`` (OpenAI's GPT-Live API) on a fake engine, driven by the unchanged ``openai`` SDK's
``client.live.connect()``: start, spoken turn → audio and both transcripts, mute, appends, delegation, errors in
OpenAI's shape, and a clean close. Every server event validates against the SDK's ``ServerEvent`` union."""

from __future__ import annotations

import asyncio
import base64
import json
import shutil
from typing import Any

import numpy as np
import pytest
from websockets.asyncio.client import connect

from tests.audio.signals import peak_hz
from tests.audio.test_smart_turn import spoken
from tests.entrypoints.conftest import LiveServer
from tests.entrypoints.fake_engine import SINE_HZ
from tests.entrypoints.live_client import live_problems, pcm_pieces, read_until, sdk_client
from tests.entrypoints.test_realtime import spoken_like

pytestmark = pytest.mark.e2e
TIMEOUT_S = 20.0
RATE = 24000


def turn(rate: int = RATE) -> np.ndarray:
    """Half a second of quiet, a second of speech-like sound, then a second of quiet (server VAD's turn end)."""
    quiet = np.zeros(rate // 2, np.float32)
    return np.concatenate([quiet, spoken_like(1.0, rate), quiet, quiet])


def of_type(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e for e in events if e["type"] == kind]


def text_of(events: list[dict[str, Any]], kind: str) -> str:
    return "".join(e["delta"] for e in of_type(events, kind))


async def started(conn: Any, server: LiveServer, seen: list[dict[str, Any]], **session: Any) -> dict[str, Any]:
    await conn.session.start(session={"model": server.engine.model_name, **session}, event_id="start_1")
    return await read_until(conn, lambda e: e["type"] in ("session.started", "error"), seen, TIMEOUT_S)


def test_sdk_session_turn_audio_and_transcripts_then_closed(server: LiveServer) -> None:
    seen: list[dict[str, Any]] = []

    async def scenario() -> None:
        async with sdk_client(server.base_url).live.connect() as conn:
            first = await started(conn, server, seen, instructions="Be brief.", audio={"output": {"voice": "marin"}})
            assert first["type"] == "session.started" and first["client_event_id"] == "start_1"
            for piece in pcm_pieces(turn(), RATE):
                await conn.session.input_audio.append(audio=piece)
            # The reply is done at its usage; the user's transcript (a request of its own) may end after it.
            await read_until(conn, lambda _: of_type(seen, "session.usage.updated") and text_of(
                seen, "session.input_transcript.delta") == "Hello from the fake engine.", seen, TIMEOUT_S)
            await conn.session.close(event_id="bye")
            await read_until(conn, lambda e: e["type"] == "session.closed", seen, TIMEOUT_S)
    asyncio.run(scenario())
    assert live_problems(seen) == []
    closed = seen[-1]
    assert closed["reason"] == "close_requested" and closed["client_event_id"] == "bye"
    assert closed["session"]["id"] == seen[0]["session"]["id"] and closed["usage"]["seconds"] >= 0
    assert text_of(seen, "session.output_transcript.delta") == "Hello from the fake engine."
    audio = b"".join(base64.b64decode(e["delta"]) for e in of_type(seen, "session.output_audio.delta"))
    samples = np.frombuffer(audio, "<i2").astype(np.float32) / 32767
    assert len(samples) > 0 and abs(peak_hz(samples, RATE) - SINE_HZ) < 5
    assert not of_type(seen, "error")
    request = server.engine.requests[-1] if server.engine.requests[-1].wants_audio else server.engine.requests[-2]
    rendered = server.engine.front_end.processor.tokenizer.decode(request.prompt.token_ids)
    assert "Be brief." in rendered and request.voice == "Chelsie"  # marin, by the realtime voice table


@pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="real speech at 16 kHz (server VAD)")
def test_sdk_session_16k_speech_comes_back_at_16k(server: LiveServer) -> None:
    seen: list[dict[str, Any]] = []
    speech = np.concatenate([np.zeros(8000, np.float32), spoken("How are you today?", tail_s=1.2)])

    async def scenario() -> None:
        async with sdk_client(server.base_url).live.connect() as conn:
            await started(conn, server, seen, audio={"format": {"type": "audio/pcm", "rate": 16000}})
            for piece in pcm_pieces(speech, 16000):
                await conn.session.input_audio.append(audio=piece)
            await read_until(conn, lambda e: e["type"] == "session.usage.updated", seen, TIMEOUT_S)
    asyncio.run(scenario())
    assert seen[0]["session"]["audio"]["format"] == {"type": "audio/pcm", "rate": 16000}
    audio = b"".join(base64.b64decode(e["delta"]) for e in of_type(seen, "session.output_audio.delta"))
    samples = np.frombuffer(audio, "<i2").astype(np.float32) / 32767
    assert abs(peak_hz(samples, 16000) - SINE_HZ) < 5  # read at 16 kHz, the sine is where it was


def test_muted_audio_is_silence_and_acknowledged(server: LiveServer) -> None:
    seen: list[dict[str, Any]] = []

    async def scenario() -> None:
        async with sdk_client(server.base_url).live.connect() as conn:
            await started(conn, server, seen)
            await conn.session.input_audio.mute(event_id="m")
            for piece in pcm_pieces(turn(), RATE):
                await conn.session.input_audio.append(audio=piece)
            await conn.session.input_audio.unmute(event_id="u")
            await read_until(conn, lambda e: e["type"] == "session.input_audio.unmuted", seen, TIMEOUT_S)
            await asyncio.sleep(0.5)
    asyncio.run(scenario())
    assert [e["client_event_id"] for e in of_type(seen, "session.input_audio.muted")] == ["m"]
    assert server.engine.requests == []  # the speech went in as silence: no turn, no reply
    assert live_problems(seen) == []


def test_appends_delegation_and_refusals_in_openais_shape(server: LiveServer) -> None:
    seen: list[dict[str, Any]] = []

    async def scenario() -> None:
        async with sdk_client(server.base_url).live.connect() as conn:
            await started(conn, server, seen, delegation={"type": "responses", "responses": {"model": "gpt-5"}})
            await conn.session.instructions.append(content="Speak slowly.", delegation_id=None, event_id="i")
            await conn.session.thinking.append(content="The user is Ada.", delegation_id="d_1", event_id="t")
            await conn.response.create(event_id="r")
            await conn.session.update(session={"delegation": {"type": "client"}}, event_id="up")
            await conn.send({"type": "session.start", "session": {"model": "x"}, "event_id": "again"})
            await conn.session.commentary.append(content="Greet the user.", delegation_id=None, event_id="c")
            await read_until(conn, lambda e: e["type"] == "session.usage.updated", seen, TIMEOUT_S)
    asyncio.run(scenario())
    assert live_problems(seen) == []
    info = of_type(seen, "info")
    assert info and info[0]["code"] == "delegation_unavailable" and "answers every turn itself" in info[0]["message"]
    assert seen[0]["session"]["delegation"]["type"] == "responses"
    assert [e["client_event_id"] for e in of_type(seen, "session.instructions.appended")] == ["i"]
    assert [e["client_event_id"] for e in of_type(seen, "session.commentary.appended")] == ["c"]
    errors = {e["error"]["client_event_id"]: e["error"] for e in of_type(seen, "error")}
    assert errors["t"]["param"] == "delegation_id" and errors["r"]["code"] == "unsupported_feature"
    assert errors["up"]["param"] == "session.delegation.type" and errors["again"]["code"] == "session_already_started"
    rendered = server.engine.front_end.processor.tokenizer.decode(server.engine.requests[-1].prompt.token_ids)
    assert "Speak slowly." in rendered and "Greet the user." in rendered  # the commentary's reply


@pytest.mark.parametrize(("event", "code", "param"), [
    ("not json", "invalid_json", None),
    ({"type": "session.input_audio.append", "audio": 5}, "invalid_type", "audio"),
    ({"type": "session.bogus"}, "unknown_event_type", "type"),
    ({"type": "session.input_audio.append", "audio": "AAAA"}, "session_not_started", "type"),
    ({"type": "session.start", "session": {"model": "nope"}}, "model_not_found", "session.model"),
    ({"type": "session.start", "session": {"model": "M", "audio": {"format": {"type": "audio/pcm", "rate": 8000}}}},
     "invalid_value", "session.audio.format.rate"),
    ({"type": "session.start", "session": {"model": "M", "audio": {"output": {"voice": "nobody"}}}}, None, None),
])
def test_bad_events_get_openai_errors_and_the_socket_stays(server: LiveServer, event: Any, code: str | None,
                                                          param: str | None) -> None:
    async def scenario() -> list[dict[str, Any]]:
        async with connect(server.base_url.replace("http", "ws") + "/v1/live/sessions") as ws:
            text = event if isinstance(event, str) else json.dumps(event).replace('"M"', json.dumps(
                server.engine.model_name))
            await ws.send(text)
            error = json.loads(await asyncio.wait_for(ws.recv(), TIMEOUT_S))
            # Still reading: a good start after the refusal starts the session.
            await ws.send(json.dumps({"type": "session.start", "session": {"model": server.engine.model_name}}))
            while (started := json.loads(await asyncio.wait_for(ws.recv(), TIMEOUT_S)))["type"] != "session.started":
                pass
            return [error, started]
    error, started = asyncio.run(scenario())
    assert live_problems([error, started]) == []
    assert error["type"] == "error"
    if code is not None:
        assert (error["error"]["code"], error["error"]["param"]) == (code, param)
