"""``POST /v1/realtime/calls`` driven by an aiortc client, as a browser would: SDP offer and answer, espeak-ng
speech on the microphone track heard by the server's VAD, the reply's audio on the remote track, the events on
the ``oai-events`` data channel, a barge-in that silences the reply, and hang-ups that free the engine."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import httpx
import numpy as np
import pytest
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from omnistage.entrypoints.cli import build_parser
from omnistage.entrypoints.openai.api_server import build_app
from omnistage.entrypoints.openai.realtime.conversation import InputBuffer
from omnistage.entrypoints.openai.realtime.protocol import InputFormat
from omnistage.entrypoints.openai.server_config import (
    AccessPolicy,
    IceServer,
    ServingOptions,
    serving_options_from_args,
)
from omnistage.entrypoints.openai.webrtc.tracks import RATE, ReplyTrack
from tests.entrypoints.conftest import TEST_LIMITS
from tests.entrypoints.fake_engine import FakeEngine, RecordingProcessor, fake_front_end
from tests.entrypoints.realtime_validators import sdk_problems
from tests.entrypoints.server_thread import ServerThread
from tests.entrypoints.speech_sample import speech

KEY = "sk-webrtc-0123456789"
AUDIBLE_RMS = 0.02  # the fake engine's 440 Hz tone is ~0.2 RMS; Opus silence is ~0


@dataclass
class Server:
    base_url: str
    engine: FakeEngine
    app: Any  # noqa: ANN401 - FastAPI


def _serve(processor: RecordingProcessor, access: AccessPolicy | None = None) -> Iterator[Server]:
    engine = FakeEngine(fake_front_end(processor))
    # The energy detector: no model to load, and espeak's voice is loud and clean.
    app = build_app(engine, TEST_LIMITS, access=access, serving=ServingOptions(vad="energy"))
    thread = ServerThread(app)
    yield Server(thread.start(), engine, app)
    thread.stop()


@pytest.fixture(scope="module")
def server(processor: RecordingProcessor) -> Iterator[Server]:
    yield from _serve(processor)


@pytest.fixture(scope="module")
def keyed_server(processor: RecordingProcessor) -> Iterator[Server]:
    yield from _serve(processor, AccessPolicy(api_keys=(KEY,)))


@pytest.fixture(scope="module")
def spoken() -> np.ndarray:
    samples, _ = speech("Hello there, what time is it?", RATE)
    return samples


@dataclass
class Client:
    """An aiortc peer as a browser page would be: microphone out, reply in, events on the data channel."""

    pc: RTCPeerConnection = field(default_factory=lambda: RTCPeerConnection(RTCConfiguration(iceServers=[])))
    mic: ReplyTrack = field(default_factory=ReplyTrack)  # paced 20 ms frames, silence when nothing is queued
    events: list[dict[str, Any]] = field(default_factory=list)
    heard: list[tuple[float, float]] = field(default_factory=list)  # (arrival time, RMS) of each reply frame
    location: str = ""

    def __post_init__(self) -> None:
        self.channel = self.pc.createDataChannel("oai-events")
        self.channel.on("message", lambda m: self.events.append(json.loads(m)))
        self.pc.addTrack(self.mic)
        self.pc.on("track", lambda track: asyncio.ensure_future(self._listen(track)))

    async def _listen(self, track: MediaStreamTrack) -> None:
        while True:
            try:
                frame = await track.recv()
            except MediaStreamError:
                return
            pcm = frame.to_ndarray().astype(np.float32) / 32768.0
            self.heard.append((time.monotonic(), float(np.sqrt(np.mean(pcm ** 2)))))

    async def connect(self, http: httpx.AsyncClient, session: dict[str, Any] | None = None,
                      key: str | None = None) -> httpx.Response:
        await self.pc.setLocalDescription(await self.pc.createOffer())
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        if session is None:
            r = await http.post("/v1/realtime/calls", content=self.pc.localDescription.sdp,
                                headers={**headers, "Content-Type": "application/sdp"})
        else:
            r = await http.post("/v1/realtime/calls", headers=headers, files={
                "sdp": (None, self.pc.localDescription.sdp), "session": (None, json.dumps(session))})
        if r.status_code == 201:
            self.location = r.headers["location"]
            await self.pc.setRemoteDescription(RTCSessionDescription(r.text, "answer"))
        return r

    async def event(self, kind: str, timeout: float = 10.0, after: int = 0,
                    **match: Any) -> dict[str, Any]:  # noqa: ANN401 - JSON values
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for event in self.events[after:]:
                if event["type"] == kind and all(_get(event, k) == v for k, v in match.items()):
                    return event
            await asyncio.sleep(0.02)
        raise AssertionError(f"no {kind} {match} in {[e['type'] for e in self.events]}")

    def loudest(self, start: float, end: float) -> float:
        return max((rms for t, rms in self.heard if start <= t < end), default=0.0)


def _get(event: dict[str, Any], dotted: str) -> Any:  # noqa: ANN401
    for part in dotted.split("__"):
        event = event.get(part) if isinstance(event, dict) else None
    return event


async def _until(predicate: Any, timeout: float = 10.0) -> None:  # noqa: ANN401
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


def test_a_spoken_turn_is_answered_on_the_reply_track_and_barge_in_silences_it(server: Server,
                                                                                spoken: np.ndarray) -> None:
    server.engine.reset()
    server.engine.chunk_seconds = 0.5  # a 3 s reply: still playing when the user speaks again

    async def scenario() -> None:
        client = Client()
        async with httpx.AsyncClient(base_url=server.base_url, timeout=20) as http:
            r = await client.connect(http)
            assert r.status_code == 201 and r.headers["content-type"].startswith("application/sdp")
            assert client.location.startswith("/v1/realtime/calls/rtc_")
            assert (await client.event("session.created"))["session"]["type"] == "realtime"
            client.mic.push(spoken)
            await client.event("input_audio_buffer.speech_started")
            await client.event("input_audio_buffer.speech_stopped")
            await client.event("input_audio_buffer.committed")
            first = (await client.event("response.created"))["response"]["id"]
            started = await client.event("output_audio_buffer.started", response_id=first)
            await client.event("response.done", response__id=first, response__status="completed")
            await _until(lambda: client.loudest(0, time.monotonic() + 1) > AUDIBLE_RMS)  # the reply is heard
            kinds = {e["type"] for e in client.events}
            assert "response.output_audio_transcript.delta" in kinds
            assert "response.output_audio.delta" not in kinds  # the audio travels on the track, as OpenAI's
            assert started["response_id"] == first
            assert not sdk_problems(client.events), sdk_problems(client.events)  # the openai SDK reads them all

            # Barge-in: the user speaks while the reply still plays; the track is silent at once.
            server.engine.delay_s = 0.3  # the next answer takes ~2 s to generate: hung up in the middle
            mark = len(client.events)
            client.mic.push(spoken)
            await client.event("input_audio_buffer.speech_started", after=mark)
            await client.event("output_audio_buffer.cleared", after=mark, response_id=first)
            cut = time.monotonic()
            assert client.loudest(cut - 1.0, cut) > AUDIBLE_RMS  # it was playing up to the cut
            await asyncio.sleep(0.6)
            assert client.loudest(cut + 0.25, cut + 0.6) < AUDIBLE_RMS, "the reply went on after the barge-in"

            # The next turn's response runs; hanging up aborts it in the engine and ends the call.
            second = (await client.event("response.created", after=mark))["response"]["id"]
            assert (await http.delete(client.location)).status_code == 200
            calls = server.app.state.webrtc_calls
            await _until(lambda: not calls.live)
            # Beside the two responses, streaming input sent its speech-start prefill (``prefill_...``), ended too.
            responses = [r.request_id for r in server.engine.requests if r.request_id.startswith("resp")]
            prefills = [r.request_id for r in server.engine.requests if r.request_id.startswith("prefill")]
            assert len(responses) == 2 and second and set(prefills) <= set(server.engine.closed)
            running = responses[-1]
            await _until(lambda: running in server.engine.closed)
            assert running in server.engine.aborted
            assert (await http.delete(client.location)).status_code == 404
            assert not sdk_problems(client.events), sdk_problems(client.events)
            await client.pc.close()

    asyncio.run(scenario())


def test_the_form_sets_the_session_and_the_peer_closing_ends_the_call(server: Server, spoken: np.ndarray) -> None:
    server.engine.reset()

    async def scenario() -> None:
        client = Client()
        async with httpx.AsyncClient(base_url=server.base_url, timeout=20) as http:
            r = await client.connect(http, session={"type": "realtime", "instructions": "Be brief.", "audio": {
                "input": {"format": {"type": "audio/pcm", "rate": 16000}}, "output": {"voice": "Aiden"}}})
            assert r.status_code == 201, r.text
            created = await client.event("session.created")
            assert created["session"]["instructions"] == "Be brief."
            assert created["session"]["audio"]["output"]["voice"] == "Aiden"
            assert created["session"]["audio"]["input"]["format"]["rate"] == 16000
            client.channel.send(json.dumps({"type": "conversation.item.create", "item": {
                "type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}}))
            client.channel.send(json.dumps({"type": "response.create",
                                            "response": {"output_modalities": ["text"]}}))
            done = await client.event("response.done")
            assert done["response"]["status"] == "completed"
            mark = len(client.events)
            client.mic.push(spoken)  # the microphone reaches a 16 kHz session at its rate
            await client.event("input_audio_buffer.committed", after=mark)
            await client.event("response.done", after=mark, response__status="completed")
            heard = server.engine.front_end.processor.seen_audios[-1]  # the turn as the prompt got it, at 16 kHz
            assert 0.7 * len(spoken) / RATE < len(heard) / 16_000 < len(spoken) / RATE + 1.5
            await client.pc.close()  # the browser tab closes
            await _until(lambda: not server.app.state.webrtc_calls.live)
            bad = await http.post("/v1/realtime/calls", content="hello", headers={"Content-Type": "application/sdp"})
            assert bad.status_code == 400 and bad.json()["error"]["param"] == "sdp"

    asyncio.run(scenario())


def test_an_ephemeral_key_opens_one_call_and_may_hang_up_that_call_only(keyed_server: Server) -> None:
    async def mint(http: httpx.AsyncClient, instructions: str) -> str:
        minted = await http.post("/v1/realtime/client_secrets", headers={"Authorization": f"Bearer {KEY}"},
                                 json={"session": {"type": "realtime", "instructions": instructions}})
        return minted.json()["value"]

    async def scenario() -> None:
        async with httpx.AsyncClient(base_url=keyed_server.base_url, timeout=20) as http:
            value, other = await mint(http, "From the key."), await mint(http, "Another key.")
            client, second, again = Client(), Client(), Client()
            assert (await client.connect(http, key=value)).status_code == 201
            created = await client.event("session.created")
            assert created["session"]["instructions"] == "From the key."
            assert (await again.connect(http, key=value)).status_code == 401  # used once
            assert (await second.connect(http, key=other)).status_code == 201
            bearer = {"Authorization": f"Bearer {other}"}
            refused = await http.delete(client.location, headers=bearer)
            assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"
            assert (await http.delete(client.location, headers={"Authorization": f"Bearer {value}"})).status_code \
                == 200  # the key that opened the call may end it
            assert (await http.delete(second.location, headers={"Authorization": f"Bearer {KEY}"})).status_code \
                == 200  # and the API key any call
            for peer in (client, second, again):
                await peer.pc.close()

    asyncio.run(scenario())


class MutedMicrophone(MediaStreamTrack):
    """A microphone that never sends a frame: a peer gone quiet (its network dropped) without hanging up."""

    kind = "audio"

    async def recv(self) -> Any:  # noqa: ANN401
        await asyncio.Event().wait()


def test_a_call_that_goes_quiet_ends_at_the_idle_timeout(processor: RecordingProcessor) -> None:
    engine = FakeEngine(fake_front_end(processor))
    app = build_app(engine, replace(TEST_LIMITS, ws_idle_timeout=1.0), serving=ServingOptions(vad="energy"))
    thread = ServerThread(app)
    base_url = thread.start()

    async def scenario() -> None:
        client = Client(mic=MutedMicrophone())  # type: ignore[arg-type]
        async with httpx.AsyncClient(base_url=base_url, timeout=20) as http:
            assert (await client.connect(http)).status_code == 201
            await client.event("session.created")
            error = await client.event("error", timeout=5)
            assert error["error"]["code"] == "idle_timeout"
            await _until(lambda: not app.state.webrtc_calls.live, timeout=5)
            await client.pc.close()

    try:
        asyncio.run(scenario())
    finally:
        thread.stop()


def test_the_input_buffer_drops_old_audio_but_keeps_the_detector_positions() -> None:
    buffer = InputBuffer(InputFormat("pcm16", 16_000), max_seconds=5.0)
    buffer.append_samples(np.zeros(16_000, np.float32))
    buffer.keep_last(4_000)  # a second of silence, mostly dropped as it came
    buffer.append_samples(np.ones(8_000, np.float32))  # speech from sample 16000 (the detector's count)
    audio = buffer.take(start=16_000 - 1_600)  # the turn with 100 ms of padding before it
    assert len(audio) == 1_600 + 8_000 and audio[:1_600].max() == 0.0 and audio[1_600:].min() == 1.0
    assert buffer.samples == 0 and buffer.dropped == 0


def test_stun_and_turn_flags_reach_every_call(processor: RecordingProcessor) -> None:
    args = build_parser().parse_args([
        "serve", "--model", "tiny", "--webrtc-stun", "stun:stun.example.com:3478",
        "--webrtc-turn", "turns:turn.example.com:5349", "--webrtc-turn-username", "omni"])
    serving = serving_options_from_args(args, {"OMNISTAGE_WEBRTC_TURN_CREDENTIAL": "secret"})
    assert serving.ice_servers == (IceServer("stun:stun.example.com:3478"),
                                   IceServer("turns:turn.example.com:5349", "omni", "secret"))
    app = build_app(FakeEngine(fake_front_end(processor)), TEST_LIMITS, serving=serving)
    assert [(s.urls, s.username, s.credential) for s in app.state.webrtc_calls.ice_servers] == [
        ("stun:stun.example.com:3478", None, None), ("turns:turn.example.com:5349", "omni", "secret")]
    wrong = build_parser().parse_args(["serve", "--model", "tiny", "--webrtc-stun", "turn:turn.example.com"])
    with pytest.raises(ValueError, match="--webrtc-stun"):
        serving_options_from_args(wrong, {})
