"""GPT-Live clients, unchanged, against tiny Moshi served by the duplex engine (``DuplexOmni``, what ``omnistage
serve`` runs for a duplex family) under real uvicorn: the ``openai`` SDK's ``client.live.connect()`` and LiveKit's
``GPTLiveModel`` stream espeak-ng speech; agent audio and the inner monologue's transcript come back while the user
speaks, and ``session.close`` ends with ``session.closed``, the session's engine row freed.

The engine's clock runs at a quarter of the wall clock's pace here (320 ms frames): a loaded 2-core CI host
can take longer than Moshi's 80 ms for a tiny step, and a late frame goes out as silence with no text. Every
other piece (admission, the tick thread, the backend, the protocol) is what a served model runs.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import shutil
import time
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
import soundfile
from aiortc import RTCSessionDescription
from fastapi.testclient import TestClient
from pipecat.frames.frames import LLMContextFrame, LLMFullResponseEndFrame, LLMTextFrame, SpeechOutputAudioRawFrame
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.services.openai.live.llm import OpenAILiveLLMService
from starlette.websockets import WebSocketDisconnect
from websockets.sync.client import connect

from omnistage.audio.decode import resample
from omnistage.audio.g711 import G711_RATE, encode_g711
from omnistage.entrypoints.openai.api_server import build_app
from omnistage.entrypoints.openai.server_config import AccessPolicy
from omnistage.pipeline.duplex_omni import DuplexOmni
from tests.audio.test_smart_turn import spoken
from tests.entrypoints.live_client import live_problems, livekit_session, pcm_pieces, read_until, sdk_client
from tests.entrypoints.server_thread import ServerThread
from tests.entrypoints.test_pipecat import drive, errors, pcm_frames
from tests.entrypoints.test_webrtc import Client, _until

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="real speech")]
RATE = 24000
PACE = 4.0  # wall seconds per engine second (see the module's docstring)
TIMEOUT_S = 90.0
KEY = "sk-duplex-0123456789"
HEARD_RMS = 1e-3  # Opus' silence is ~0; the random Mimi's decoded frames are louder


class SlowClock:
    def __init__(self, pace: float) -> None:
        self.pace, self.start = pace, time.monotonic()

    def __call__(self) -> float:
        return (time.monotonic() - self.start) / self.pace


class Served:
    def __init__(self, base_url: str, engine: DuplexOmni, app: Any) -> None:  # noqa: ANN401 - FastAPI
        self.base_url, self.engine, self.app = base_url, engine, app


@pytest.fixture(scope="module")
def moshi() -> Iterator[Served]:
    # One session row: the second session is refused (admission's other bound, real time, is a huge budget here).
    engine = DuplexOmni("moshi-tiny", max_sessions=1, budget=1000.0, clock=SlowClock(PACE))
    app = build_app(engine)
    thread = ServerThread(app)
    try:
        yield Served(thread.start(), engine, app)
    finally:
        thread.stop()
        asyncio.run(engine.shutdown())


def speech() -> np.ndarray:
    """An espeak-ng sentence at 24 kHz (about 1.5 s)."""
    return resample(spoken("Hello, how are you today?", tail_s=0.2), 16000, RATE).astype(np.float32)


def wav_bytes(samples: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    soundfile.write(buffer, samples, RATE, format="WAV", subtype="PCM_16")
    return buffer.getvalue()


def freed(engine: DuplexOmni, timeout_s: float = 20.0) -> bool:
    """No live session and no model row or codec stream left (released at the tick after the close)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if engine.sessions.live == 0 and engine.served.model.rows == 0:
            return True
        time.sleep(0.05)
    return False


def _count(seen: list[dict[str, Any]], kind: str) -> int:
    return sum(e["type"] == kind for e in seen)


def test_openai_sdk_live_session_on_tiny_moshi(moshi: Served) -> None:
    seen: list[dict[str, Any]] = []

    async def scenario() -> None:
        async with sdk_client(moshi.base_url).live.connect() as conn:
            # Moshi takes no text prompt: the instructions are kept in the snapshot and left unused.
            await conn.session.start(session={"model": "moshi-tiny", "instructions": "Be brief."})
            await read_until(conn, lambda e: e["type"] == "session.started", seen, TIMEOUT_S)
            for piece in pcm_pieces(speech(), RATE, piece_ms=80):
                await conn.session.input_audio.append(audio=piece)
            await read_until(conn, lambda e: _count(seen, "session.output_audio.delta") >= 12
                             and _count(seen, "session.output_transcript.delta") >= 1, seen, TIMEOUT_S)
            await conn.session.close()
            await read_until(conn, lambda e: e["type"] == "session.closed", seen, TIMEOUT_S)
    asyncio.run(scenario())
    assert live_problems(seen) == [] and not [e for e in seen if e["type"] == "error"]
    pcm = b"".join(base64.b64decode(e["delta"]) for e in seen if e["type"] == "session.output_audio.delta")
    assert len(pcm) >= 12 * 1920 * 2  # whole 80 ms frames of PCM16 at 24 kHz
    assert np.abs(np.frombuffer(pcm, "<i2")).max() > 0  # Mimi's decoded frames, not only late silence
    assert "".join(e["delta"] for e in seen if e["type"] == "session.output_transcript.delta").strip()
    assert seen[-1]["reason"] == "close_requested" and seen[-1]["session"]["instructions"] == "Be brief."
    assert freed(moshi.engine)


def test_livekit_gpt_live_model_on_tiny_moshi(moshi: Served) -> None:
    run = asyncio.run(livekit_session(moshi.base_url, "moshi-tiny", speech(), RATE,
                                      lambda r: bool(r.said and r.samples >= 12 * 1920), TIMEOUT_S))
    assert run.errors == [] and live_problems(run.events) == []
    assert "".join(run.said).strip() and run.samples >= 12 * 1920
    assert any(e["type"] == "info" and e["code"] == "delegation_unavailable" for e in run.events)  # its default
    assert run.events[-1]["type"] == "session.closed" and run.events[-1]["reason"] == "close_requested"
    assert freed(moshi.engine)


def test_request_routes_refuse_a_duplex_model_and_the_server_reports_its_engine(moshi: Served) -> None:
    with httpx.Client(base_url=moshi.base_url, timeout=30) as http:
        refused = [
            http.post("/v1/chat/completions", json={"model": "moshi-tiny", "messages": [{"role": "user",
                                                                                          "content": "hi"}]}),
            http.post("/v1/responses", json={"model": "moshi-tiny", "input": "hi"}),
            http.post("/v1/audio/speech", json={"model": "moshi-tiny", "input": "hi", "voice": "alloy"}),
            http.post("/v1/audio/transcriptions", data={"model": "moshi-tiny"},
                      files={"file": ("a.wav", wav_bytes(speech()), "audio/wav")}),
        ]
        for r in refused:
            assert r.status_code == 400, r.text
            assert "full-duplex" in r.json()["error"]["message"] and "/v1/live/sessions" in r.json()["error"]["message"]
        with connect(moshi.base_url.replace("http://", "ws://") + "/v1/realtime?model=moshi-tiny") as ws:
            realtime = json.loads(ws.recv(timeout=30))
        assert realtime["type"] == "error" and "/v1/live/sessions" in realtime["error"]["message"]
        health, ready = http.get("/health"), http.get("/ready")
        assert health.status_code == 200 and health.json()["stages"][0]["stage"] == "duplex"
        assert ready.json() == {"status": "ready"}
        assert [m["id"] for m in http.get("/v1/models").json()["data"]] == ["moshi-tiny"]
        assert 'omnistage_requests_running{replica="0",stage="duplex"}' in http.get("/metrics").text
        assert http.get("/", headers={"Accept": "text/html"}).status_code == 200  # the playground's duplex mode
        minted = http.post("/v1/realtime/client_secrets", json={"session": {"type": "realtime", "audio": {
            "output": {"voice": "marin"}}, "instructions": "Hi."}})  # what the playground mints
        assert minted.status_code == 200 and minted.json()["session"]["instructions"] == "Hi."


def test_a_session_beyond_capacity_is_refused_and_a_closed_one_frees_its_slot(moshi: Served) -> None:
    seen_a: list[dict[str, Any]] = []
    seen_b: list[dict[str, Any]] = []
    start = {"model": "moshi-tiny"}

    async def scenario() -> httpx.Response:
        sdk = sdk_client(moshi.base_url)
        async with sdk.live.connect() as a, sdk.live.connect() as b:
            await a.session.start(session=start)
            await read_until(a, lambda e: e["type"] == "session.started", seen_a, TIMEOUT_S)
            await b.session.start(session=start, event_id="b1")
            await read_until(b, lambda e: e["type"] == "error", seen_b, TIMEOUT_S)
            async with httpx.AsyncClient(base_url=moshi.base_url) as http:  # a WebRTC creation is refused too
                webrtc = await http.post("/v1/live/sessions", json={"session": start, "transport": {
                    "type": "webrtc", "sdp": "v=0"}})
            await a.session.close()
            await read_until(a, lambda e: e["type"] == "session.closed", seen_a, TIMEOUT_S)
            assert await asyncio.to_thread(freed, moshi.engine)
            await b.session.start(session=start, event_id="b2")  # the refused client may start again
            await read_until(b, lambda e: e["type"] == "session.started", seen_b, TIMEOUT_S)
            await b.session.close()
            await read_until(b, lambda e: e["type"] == "session.closed", seen_b, TIMEOUT_S)
        return webrtc
    webrtc = asyncio.run(scenario())
    error = seen_b[0]["error"]
    assert error["code"] == "session_capacity_exceeded" and error["client_event_id"] == "b1"
    assert "all 1 session rows are live" in error["message"]
    assert webrtc.status_code == 503 and int(webrtc.headers["Retry-After"]) >= 1
    assert webrtc.json()["error"]["code"] == "session_capacity_exceeded"
    assert seen_b[-2]["type"] == "session.started" and seen_b[-2]["client_event_id"] == "b2"
    assert live_problems(seen_a + seen_b) == []
    assert freed(moshi.engine)


def test_text_appended_to_a_duplex_session_is_refused_clearly_and_the_session_goes_on(moshi: Served) -> None:
    with TestClient(build_app(moshi.engine)) as client, client.websocket_connect("/v1/live/sessions") as ws:
        ws.send_json({"type": "session.start", "session": {"model": "moshi-tiny"}})
        assert ws.receive_json()["type"] == "session.started"
        ws.send_json({"type": "session.instructions.append", "content": "Speak French.", "event_id": "i1"})
        error = ws.receive_json()
        ws.send_json({"type": "session.close"})
        events = [ws.receive_json()]
        while events[-1]["type"] != "session.closed":
            events.append(ws.receive_json())
    assert error["type"] == "error" and error["error"]["code"] == "unsupported_feature"
    assert error["error"]["client_event_id"] == "i1" and "fixed when the session starts" in error["error"]["message"]
    assert not any(e["type"].endswith(".appended") for e in events)
    assert freed(moshi.engine)


def test_the_server_stopping_ends_a_duplex_session_with_1001(moshi: Served) -> None:
    """What SIGTERM does (``common/draining.py``): the session hears why, ``session.closed``, then close 1001."""
    app = build_app(moshi.engine)
    with TestClient(app) as client, client.websocket_connect("/v1/live/sessions") as ws:
        ws.send_json({"type": "session.start", "session": {"model": "moshi-tiny"}})
        assert ws.receive_json()["type"] == "session.started"
        client.portal.call(app.state.realtime.shut_down_sessions)
        events = []
        while not events or events[-1]["type"] != "session.closed":
            events.append(ws.receive_json())
        with pytest.raises(WebSocketDisconnect) as gone:
            while True:
                ws.receive_json()
    errors = [e for e in events if e["type"] == "error"]
    assert [e["error"]["code"] for e in errors] == ["server_shutting_down"]
    assert events[-1]["reason"] == "connection_lost" and gone.value.code == 1001
    assert freed(moshi.engine)


def test_a_webrtc_session_feeds_the_call_into_moshi_and_plays_its_frames_on_the_track(moshi: Served) -> None:
    """``POST /v1/live/sessions`` by the SDK's ``client.live.create`` for an aiortc peer: speech on the microphone
    track is what the duplex session hears; Moshi's frames play on the reply track (no audio events), its text on
    the ``oai-events`` channel."""
    async def scenario() -> tuple[list[dict[str, Any]], float]:
        client = Client()
        await client.pc.setLocalDescription(await client.pc.createOffer())
        created = await sdk_client(moshi.base_url).live.create(
            session={"model": "moshi-tiny"}, transport={"type": "webrtc", "sdp": client.pc.localDescription.sdp})
        await client.pc.setRemoteDescription(RTCSessionDescription(created.transport.sdp, "answer"))
        await client.event("session.started", timeout=TIMEOUT_S)
        client.mic.push(speech())
        await client.event("session.output_transcript.delta", timeout=TIMEOUT_S)
        await _until(lambda: client.loudest(0, time.monotonic() + 1) > HEARD_RMS, timeout=TIMEOUT_S)
        loudest = client.loudest(0, time.monotonic() + 1)
        client.channel.send('{"type": "session.close", "event_id": "bye"}')
        await client.event("session.closed", timeout=TIMEOUT_S)
        await _until(lambda: not moshi.app.state.webrtc_calls.live, timeout=TIMEOUT_S)
        await client.pc.close()
        return client.events, loudest
    events, loudest = asyncio.run(scenario())
    kinds = [e["type"] for e in events]
    assert "session.output_audio.delta" not in kinds and "error" not in kinds
    assert events[-1]["type"] == "session.closed" and events[-1]["reason"] == "close_requested"
    assert loudest > HEARD_RMS and live_problems(events) == []
    assert freed(moshi.engine)


def test_an_ephemeral_key_opens_one_duplex_session_behind_the_api_key_and_g711_goes_both_ways(moshi: Served) -> None:
    """The same auth as every route: no key is refused; a key minted by ``/v1/realtime/client_secrets`` holds its
    instructions for the Live session it opens, once. The session speaks G.711 μ-law at 8 kHz both ways: 640
    bytes of its format a frame."""
    app = build_app(moshi.engine, access=AccessPolicy(api_keys=(KEY,)))
    with TestClient(app) as client:
        with pytest.raises(WebSocketDisconnect), client.websocket_connect("/v1/live/sessions") as ws:
            ws.receive_json()
        minted = client.post("/v1/realtime/client_secrets", headers={"Authorization": f"Bearer {KEY}"},
                             json={"session": {"type": "realtime", "instructions": "Only trains."}})
        assert minted.status_code == 200, minted.text
        value = minted.json()["value"]
        with client.websocket_connect("/v1/live/sessions", subprotocols=[f"openai-insecure-api-key.{value}"]) as ws:
            ws.send_json({"type": "session.start", "session": {"model": "moshi-tiny", "audio": {
                "format": {"type": "audio/pcmu"}}}})
            started = ws.receive_json()
            ulaw = encode_g711(resample(speech(), RATE, G711_RATE), "ulaw")
            for i in range(0, len(ulaw), 640):
                ws.send_json({"type": "session.input_audio.append",
                              "audio": base64.b64encode(ulaw[i:i + 640]).decode()})
            deltas = []
            while len(deltas) < 6:
                event = ws.receive_json()
                assert event["type"] != "error", event
                if event["type"] == "session.output_audio.delta":
                    deltas.append(base64.b64decode(event["delta"]))
            ws.send_json({"type": "session.close"})
            while ws.receive_json()["type"] != "session.closed":
                pass
        with pytest.raises(WebSocketDisconnect), client.websocket_connect(
                "/v1/live/sessions", subprotocols=[f"openai-insecure-api-key.{value}"]) as ws:
            ws.receive_json()  # spent
    assert started["type"] == "session.started" and started["session"]["instructions"] == "Only trains."
    assert started["session"]["audio"]["format"] == {"type": "audio/pcmu", "rate": 8000}
    assert [len(d) for d in deltas] == [640] * 6
    assert freed(moshi.engine)


def test_pipecat_live_service_on_tiny_moshi(moshi: Served) -> None:
    """pipecat's ``OpenAILiveLLMService``, unchanged: Moshi's text groups into an assistant turn that ends after a
    quiet gap (its ``LLMFullResponseEndFrame``), and its frames reach the pipeline as audio."""
    url = moshi.base_url.replace("http://", "ws://") + "/v1/live/sessions"
    service = OpenAILiveLLMService(api_key="unused", base_url=url, settings=OpenAILiveLLMService.Settings(
        model="moshi-tiny", system_instruction="Be brief."))
    down, up = asyncio.run(drive([service], [LLMContextFrame(LLMContext()), *pcm_frames(speech())],
                                 LLMFullResponseEndFrame))
    assert errors(up) == []
    assert sum(len(f.audio) for f in down if isinstance(f, SpeechOutputAudioRawFrame)) >= 4 * 1920 * 2
    assert "".join(f.text for f in down if isinstance(f, LLMTextFrame)).strip()
    assert freed(moshi.engine)


def test_a_stopped_engine_ends_its_sessions_and_the_server_says_it_is_unhealthy() -> None:
    """No tick will take the client's audio: the session ends (``engine_stopped``, ``session.closed``) rather than
    pacing the client for ever, and /health answers 503 naming the stopped thread."""
    engine = DuplexOmni("moshi-tiny", max_sessions=1, budget=1000.0, clock=SlowClock(PACE))
    app = build_app(engine)
    frame = base64.b64encode(bytes(1920 * 2)).decode()
    try:
        with TestClient(app) as client, client.websocket_connect("/v1/live/sessions") as ws:
            ws.send_json({"type": "session.start", "session": {"model": "moshi-tiny"}})
            assert ws.receive_json()["type"] == "session.started"
            engine.sessions.stop()
            for _ in range(10):  # more than the jitter buffer holds
                ws.send_json({"type": "session.input_audio.append", "audio": frame})
            events = [ws.receive_json()]
            while events[-1]["type"] != "session.closed":
                events.append(ws.receive_json())
            health = client.get("/health")
    finally:
        asyncio.run(engine.shutdown())
    assert [e["error"]["code"] for e in events if e["type"] == "error"] == ["engine_stopped"]
    assert events[-1]["reason"] == "connection_lost"
    assert health.status_code == 503 and "stopped" in health.json()["stages"][0]["replicas"][0]["detail"]
