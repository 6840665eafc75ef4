"""``POST /v1/live/sessions``: a GPT-Live session over WebRTC, created by the unchanged ``openai`` SDK's
``client.live.create`` for an aiortc peer (as a browser would): espeak-ng speech on the microphone track, the
reply on the audio track (no audio events), Live events on the ``oai-events`` channel, ``session.close`` on the
channel and the SDK's ``client.live.sessions.hangup``; a bad creation is a 4xx in OpenAI's shape."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import numpy as np
import openai
import pytest
from aiortc import RTCSessionDescription

from tests.entrypoints.live_client import live_problems, sdk_client
from tests.entrypoints.test_webrtc import AUDIBLE_RMS, Client, Server, _until, server, spoken  # noqa: F401 - fixtures

pytestmark = pytest.mark.e2e


async def _create(client: Client, sdk: openai.AsyncOpenAI, model: str) -> str:
    await client.pc.setLocalDescription(await client.pc.createOffer())
    created = await sdk.live.create(session={"model": model, "instructions": "Be brief."},
                                    transport={"type": "webrtc", "sdp": client.pc.localDescription.sdp})
    await client.pc.setRemoteDescription(RTCSessionDescription(created.transport.sdp, "answer"))
    return created.session.id


def test_sdk_creates_a_webrtc_session_heard_on_the_track_then_closed(server: Server, spoken: np.ndarray) -> None:  # noqa: F811
    server.engine.reset()

    async def scenario() -> list[dict[str, Any]]:
        client = Client()
        sdk = sdk_client(server.base_url)
        session_id = await _create(client, sdk, server.engine.model_name)
        started = await client.event("session.started")
        assert started["session"]["id"] == session_id
        client.mic.push(spoken)
        await client.event("session.output_transcript.delta", timeout=20)
        await client.event("session.usage.updated", timeout=20)
        await _until(lambda: client.loudest(0, time.monotonic() + 1) > AUDIBLE_RMS)  # the reply is heard
        client.channel.send('{"type": "session.close", "event_id": "bye"}')
        closed = await client.event("session.closed")
        assert closed["reason"] == "close_requested" and closed["client_event_id"] == "bye"
        await _until(lambda: not server.app.state.webrtc_calls.live)
        await client.pc.close()
        return client.events
    events = asyncio.run(scenario())
    kinds = [e["type"] for e in events]
    assert "session.output_audio.delta" not in kinds  # the audio travels on the track
    assert "session.input_transcript.delta" in kinds
    assert live_problems(events) == []


def test_sdk_hangup_ends_the_session(server: Server) -> None:  # noqa: F811
    server.engine.reset()

    async def scenario() -> None:
        client = Client()
        sdk = sdk_client(server.base_url)
        session_id = await _create(client, sdk, server.engine.model_name)
        await client.event("session.started")
        await sdk.live.sessions.hangup(session_id)
        await _until(lambda: not server.app.state.webrtc_calls.live)
        with pytest.raises(openai.NotFoundError):
            await sdk.live.sessions.hangup(session_id)
        await client.pc.close()
    asyncio.run(scenario())


@pytest.mark.parametrize(("body", "status", "param"), [
    ({"session": {"model": "fake-omni"}}, 400, "transport"),
    ({"session": {"model": "nope"}, "transport": {"type": "webrtc", "sdp": "v=0"}}, 404, "model"),
    ({"session": {"model": "fake-omni", "audio": 3}, "transport": {"type": "webrtc", "sdp": "v=0"}}, 400,
     "session.audio"),
    ({"transport": {"type": "webrtc", "sdp": "v=0"}}, 400, "session"),
    ({"session": {"model": "fake-omni"}, "transport": {"type": "webrtc", "sdp": "v=0"}}, 400, None),
])
def test_bad_creations_are_openai_errors(server: Server, body: dict[str, Any], status: int,  # noqa: F811
                                         param: str | None) -> None:
    r = httpx.post(f"{server.base_url}/v1/live/sessions", json=body, timeout=20)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["message"] and (param is None or error["param"] == param)
    assert not server.app.state.webrtc_calls.live


def test_speaking_over_the_reply_silences_the_track_and_aborts_it(server: Server, spoken: np.ndarray) -> None:  # noqa: F811
    server.engine.reset()
    server.engine.chunk_seconds = 0.5  # a 3 s reply: still playing when the user speaks again

    async def scenario() -> None:
        client = Client()
        await _create(client, sdk_client(server.base_url), server.engine.model_name)
        await client.event("session.started")
        client.mic.push(spoken)
        await client.event("session.output_transcript.delta", timeout=20)
        await _until(lambda: client.loudest(0, time.monotonic() + 1) > AUDIBLE_RMS, timeout=20)
        server.engine.delay_s = 0.3  # the next reply is slow: still generating when the call ends
        pushed = time.monotonic()
        client.mic.push(spoken)  # ~2 s of speech: the next reply cannot start before it ends
        await asyncio.sleep(1.6)
        assert client.loudest(pushed - 0.5, pushed) > AUDIBLE_RMS  # the first reply was playing
        assert client.loudest(pushed + 0.8, pushed + 1.6) < AUDIBLE_RMS, "the first reply went on over the user"
        await _until(lambda: len([r for r in server.engine.requests if r.request_id.startswith("resp")]) == 2,
                     timeout=20)
        client.channel.send('{"type": "session.close"}')
        await client.event("session.closed")
        running = [r.request_id for r in server.engine.requests if r.request_id.startswith("resp")][-1]
        await _until(lambda: running in server.engine.closed)
        assert running in server.engine.aborted  # the close aborted the reply in the engine
        await client.pc.close()
    asyncio.run(scenario())


def test_a_muted_microphone_is_heard_as_silence(server: Server, spoken: np.ndarray) -> None:  # noqa: F811
    server.engine.reset()

    async def scenario() -> list[dict[str, Any]]:
        client = Client()
        await _create(client, sdk_client(server.base_url), server.engine.model_name)
        await client.event("session.started")
        client.channel.send('{"type": "session.input_audio.mute", "event_id": "m"}')
        await client.event("session.input_audio.muted")
        client.mic.push(spoken)
        await asyncio.sleep(len(spoken) / 24000 + 1.0)  # the speech and a turn's end of silence, muted
        client.channel.send('{"type": "session.close"}')
        await client.event("session.closed")
        await client.pc.close()
        return client.events
    events = asyncio.run(scenario())
    assert server.engine.requests == []  # nothing was heard: no turn, no reply
    assert live_problems(events) == []
