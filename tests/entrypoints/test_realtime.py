"""``WS /v1/realtime`` against the fake engine: event flow, cancel, malformed events, VAD, text-only engines."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Iterator

import numpy as np
import pytest
import torch
from websockets.asyncio.client import ClientConnection, connect

from omnistage.audio.vad import EnergyVad, VadConfig
from omnistage.entrypoints.openai.realtime.conversation import InputBuffer
from omnistage.entrypoints.openai.realtime.audio_formats import InputFormat
from omnistage.entrypoints.openai.realtime.session_audio import ON_LOOP_AUDIO
from tests.audio.signals import speech_like
from tests.entrypoints.conftest import LiveServer

TIMEOUT_S = 20.0


def spoken_like(seconds: float, rate: int, seed: int = 0) -> np.ndarray:
    """A voiced, syllable-modulated signal: harmonics of a wandering pitch under a 4 Hz envelope."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * rate)) / rate
    pitch = 140 + 30 * np.sin(2 * np.pi * 0.7 * t)
    phase = 2 * np.pi * np.cumsum(pitch) / rate
    voiced = sum(np.sin(k * phase) / k for k in range(1, 6))
    envelope = 0.25 + 0.75 * np.abs(np.sin(2 * np.pi * 2 * t))
    return (0.2 * envelope * voiced + 0.003 * rng.standard_normal(len(t))).astype(np.float32)


def pcm16_pieces(samples: np.ndarray, rate: int, piece_ms: int = 100) -> Iterator[str]:
    pcm = (np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes()
    step = rate * piece_ms // 1000 * 2
    for i in range(0, len(pcm), step):
        yield base64.b64encode(pcm[i:i + step]).decode("ascii")


def ws_url(server: LiveServer) -> str:
    return server.base_url.replace("http://", "ws://") + "/v1/realtime"


async def recv(ws: ClientConnection) -> dict:
    return json.loads(await asyncio.wait_for(ws.recv(), TIMEOUT_S))


async def until(ws: ClientConnection, kind: str) -> tuple[dict, list[dict]]:
    """Reads events up to the first of ``kind``; returns it and everything read before it."""
    seen: list[dict] = []
    while True:
        event = await recv(ws)
        if event["type"] == kind:
            return event, seen
        seen.append(event)


async def send(ws: ClientConnection, event: dict) -> None:
    await ws.send(json.dumps(event))


async def open_session(server: LiveServer, **session: object) -> ClientConnection:
    ws = await connect(ws_url(server))
    created = await recv(ws)
    assert created["type"] == "session.created"
    if session:
        await send(ws, {"type": "session.update", "session": session})
        updated, _ = await until(ws, "session.updated")
        assert updated["session"]["id"] == created["session"]["id"]
    return ws


async def stream_audio(ws: ClientConnection, samples: np.ndarray, rate: int) -> None:
    for piece in pcm16_pieces(samples, rate):
        await send(ws, {"type": "input_audio_buffer.append", "audio": piece})


def test_audio_turn_streams_text_and_audio_then_done(server: LiveServer, processor) -> None:  # noqa: ANN001
    async def scenario() -> None:
        async with await open_session(server, audio={"input": {"format": {"type": "audio/pcm", "rate": 16000},
                                                               "turn_detection": None},
                                                     "output": {"voice": "chelsie"}}) as ws:
            await stream_audio(ws, spoken_like(1.0, 16000), 16000)
            await send(ws, {"type": "input_audio_buffer.commit"})
            committed, _ = await until(ws, "input_audio_buffer.committed")
            await send(ws, {"type": "response.create"})
            done, events = await until(ws, "response.done")
            kinds = [e["type"] for e in events]
            assert kinds[:2] == ["conversation.item.added", "conversation.item.done"]  # the committed user item
            assert kinds[2] == "response.created" and "response.output_audio_transcript.delta" in kinds
            audio = b"".join(base64.b64decode(e["delta"]) for e in events if e["type"] == "response.output_audio.delta")
            assert len(audio) > 0 and len(audio) % 2 == 0
            text = "".join(e["delta"] for e in events if e["type"] == "response.output_audio_transcript.delta")
            assert text == "Hello from the fake engine."
            assert done["response"]["status"] == "completed"
            assert done["response"]["output"][0]["content"][0]["transcript"] == text
            assert done["response"]["usage"]["output_tokens"] == 6
            assert committed["item_id"]
    asyncio.run(scenario())
    request = server.engine.requests[-1]
    assert request.wants_audio and request.voice == "Chelsie"
    assert len(processor.seen_audios[-1]) == 16000  # one second at 16 kHz, passed through


def test_24khz_input_is_resampled_to_16khz(server: LiveServer, processor) -> None:  # noqa: ANN001
    async def scenario() -> None:
        async with await open_session(server, output_modalities=["text"],  # the default rate: 24 kHz
                                      audio={"input": {"turn_detection": None}}) as ws:
            await stream_audio(ws, spoken_like(0.5, 24000), 24000)
            await send(ws, {"type": "input_audio_buffer.commit"})
            await send(ws, {"type": "response.create"})
            done, events = await until(ws, "response.done")
            assert not any(e["type"] == "response.output_audio.delta" for e in events)
            assert done["response"]["status"] == "completed"
    asyncio.run(scenario())
    assert len(processor.seen_audios[-1]) == 8000
    assert not server.engine.requests[-1].wants_audio


def test_cancel_mid_response_reports_cancelled_and_aborts(server: LiveServer) -> None:
    server.engine.delay_s = 0.2

    async def scenario() -> None:
        async with await open_session(server) as ws:
            await send(ws, {"type": "conversation.item.create",
                            "item": {"type": "message", "role": "user",
                                     "content": [{"type": "input_text", "text": "hi"}]}})
            await until(ws, "conversation.item.added")
            await send(ws, {"type": "response.create"})
            await until(ws, "response.output_audio_transcript.delta")
            await send(ws, {"type": "response.cancel"})
            done, _ = await until(ws, "response.done")
            assert done["response"]["status"] == "cancelled"
            assert done["response"]["status_details"] == {"type": "cancelled", "reason": "client_cancelled"}
            # The socket still serves: a second cancel is an error, not a disconnect.
            await send(ws, {"type": "response.cancel"})
            error, _ = await until(ws, "error")
            assert error["error"]["code"] == "response_cancel_not_active"
    asyncio.run(scenario())
    request_id = server.engine.requests[-1].request_id
    assert request_id in server.engine.aborted and request_id in server.engine.closed


@pytest.mark.parametrize(("raw", "code"), [
    ("not json", "invalid_json"),
    ("[1, 2]", "invalid_event"),
    (json.dumps({"type": "nope.nothing", "event_id": "e1"}), "unknown_event_type"),
    (json.dumps({"type": "input_audio_buffer.append", "audio": "***"}), "invalid_audio"),
    (json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(b"abc").decode()}), "invalid_audio"),
    (json.dumps({"type": "input_audio_buffer.append"}), "invalid_event"),
    (json.dumps({"type": "input_audio_buffer.commit"}), "input_audio_buffer_commit_empty"),
    (json.dumps({"type": "response.create"}), "conversation_empty"),
    (json.dumps({"type": "session.update", "session": {"output_modalities": ["video"]}}), "invalid_value"),
    (json.dumps({"type": "session.update", "session": {"audio": {"output": {"voice": "Nobody"}}}}), "invalid_voice"),
    (json.dumps({"type": "session.update", "session": {"audio": {"input": {"format": {"rate": 8000}}}}}),
     "invalid_value"),
])
def test_malformed_events_get_errors_and_the_socket_stays_usable(server: LiveServer, raw: str, code: str) -> None:
    async def scenario() -> None:
        async with await open_session(server) as ws:
            await ws.send(raw)
            error, _ = await until(ws, "error")
            assert error["error"]["code"] == code and error["error"]["message"]
            if '"session.update"' in raw:  # the bad field fails alone: the update itself is still answered
                await until(ws, "session.updated")
            await send(ws, {"type": "session.update", "session": {"instructions": "be brief"}})
            updated, _ = await until(ws, "session.updated")
            assert updated["session"]["instructions"] == "be brief"
    asyncio.run(scenario())


def test_second_response_while_one_runs_is_refused(server: LiveServer) -> None:
    server.engine.delay_s = 0.1

    async def scenario() -> None:
        async with await open_session(server, output_modalities=["text"]) as ws:
            await send(ws, {"type": "conversation.item.create",
                            "item": {"role": "user", "content": [{"type": "input_text", "text": "hi"}]}})
            await send(ws, {"type": "response.create"})
            await until(ws, "response.created")
            await send(ws, {"type": "response.create"})
            error, _ = await until(ws, "error")
            assert error["error"]["code"] == "conversation_already_has_active_response"
            done, _ = await until(ws, "response.done")
            assert done["response"]["status"] == "completed"
    asyncio.run(scenario())


def test_history_is_kept_across_turns(server: LiveServer) -> None:
    async def scenario() -> None:
        async with await open_session(server, output_modalities=["text"]) as ws:
            for text in ("first question", "second question"):
                await send(ws, {"type": "conversation.item.create",
                                "item": {"role": "user", "content": [{"type": "input_text", "text": text}]}})
                await send(ws, {"type": "response.create"})
                await until(ws, "response.done")
    asyncio.run(scenario())
    first, second = (r.prompt.token_ids for r in server.engine.requests[-2:])
    assert second[:len(first)] == first and len(second) > len(first)


def test_text_only_engine_refuses_audio_output(server: LiveServer) -> None:
    server.engine.supports_audio = False

    async def scenario() -> None:
        async with await open_session(server) as ws:
            await send(ws, {"type": "session.update", "session": {"output_modalities": ["audio"]}})
            error, _ = await until(ws, "error")
            assert error["error"]["code"] == "audio_not_supported" and "text-only" in error["error"]["message"]
    asyncio.run(scenario())


def test_wrong_model_is_refused(server: LiveServer) -> None:
    async def scenario() -> None:
        async with connect(ws_url(server) + "?model=other") as ws:
            error = await recv(ws)
            assert error["type"] == "error" and error["error"]["code"] == "model_not_found"
    asyncio.run(scenario())


def test_server_vad_commits_at_end_of_speech_and_responds(server: LiveServer, processor) -> None:  # noqa: ANN001
    rate = 16000
    audio = np.concatenate([np.zeros(rate // 2, np.float32), speech_like(0.8, rate),
                            np.zeros(rate // 2, np.float32)])

    async def scenario() -> None:
        async with await open_session(server, output_modalities=["text"], audio={"input": {
                "format": {"rate": rate}, "turn_detection": {"type": "server_vad", "silence_duration_ms": 300}}}) as ws:
            await stream_audio(ws, audio, rate)
            started, _ = await until(ws, "input_audio_buffer.speech_started")
            stopped, _ = await until(ws, "input_audio_buffer.speech_stopped")
            await until(ws, "input_audio_buffer.committed")
            done, _ = await until(ws, "response.done")
            assert done["response"]["status"] == "completed"
            assert 400 <= started["audio_start_ms"] <= 600 and 1200 <= stopped["audio_end_ms"] <= 1400
    asyncio.run(scenario())
    # Committed from 300 ms (prefix padding) before the start of speech.
    assert 0.9 * rate < len(processor.seen_audios[-1]) < 1.6 * rate


def test_energy_vad_on_pieces_matches_whole() -> None:
    rate = 24000
    audio = np.concatenate([np.zeros(rate, np.float32), spoken_like(1.0, rate), np.zeros(rate, np.float32)])
    whole = EnergyVad(VadConfig(silence_duration_ms=200), rate).feed(audio)
    vad = EnergyVad(VadConfig(silence_duration_ms=200), rate)
    pieces = [e for i in range(0, len(audio), 1234) for e in vad.feed(audio[i:i + 1234])]
    assert whole == pieces and [e.kind for e in whole] == ["speech_started", "speech_stopped"]
    assert abs(whole[0].sample - rate) <= rate // 50 * 3


def test_input_buffer_resamples_with_a_real_filter() -> None:
    buffer = InputBuffer(InputFormat("pcm16", 24000), max_seconds=5)
    t = np.arange(24000) / 24000
    tone = 0.5 * np.sin(2 * np.pi * 1000 * t)
    buffer.append((tone * 32767).astype("<i2").tobytes())
    out = buffer.take()
    assert len(out) == 16000
    spectrum = np.abs(np.fft.rfft(out))
    assert abs(int(np.argmax(spectrum)) - 1000) <= 1


def test_speech_during_a_response_barges_in(server: LiveServer) -> None:
    """Speech heard by the server VAD cancels the running response as OpenAI does: reason ``turn_detected``."""
    server.engine.delay_s = 0.3
    rate = 16000

    async def scenario() -> None:
        async with await open_session(server, output_modalities=["text"], audio={"input": {
                "format": {"rate": rate}, "turn_detection": {"type": "server_vad", "create_response": False}}}) as ws:
            await send(ws, {"type": "conversation.item.create",
                            "item": {"role": "user", "content": [{"type": "input_text", "text": "hi"}]}})
            await send(ws, {"type": "response.create"})
            await until(ws, "response.created")
            await stream_audio(ws, speech_like(0.5, rate), rate)
            await until(ws, "input_audio_buffer.speech_started")
            done, _ = await until(ws, "response.done")
            assert done["response"]["status"] == "cancelled"
            assert done["response"]["status_details"] == {"type": "cancelled", "reason": "turn_detected"}
    asyncio.run(scenario())
    # (The speech start also sent streaming input's prefill of the conversation: the response is the one aborted.)
    response = [r for r in server.engine.requests if r.request_id.startswith("resp")][-1]
    assert response.request_id in server.engine.aborted


@pytest.mark.parametrize("detection", [{"type": "server_vad", "silence_duration_ms": 300},
                                       {"type": "semantic_vad", "eagerness": "high"}])
def test_turn_detection_runs_silero_noise_is_not_a_turn(server: LiveServer, processor,  # noqa: ANN001
                                                        detection: dict) -> None:
    """A second of loud white noise (-20 dBFS: the energy detector would call it speech), then vowels: the turn
    starts at the vowels (after such noise Silero may miss the first vowel: within two syllables), never in the
    noise. semantic_vad runs the same detector, its classifier judging the pause: vowels may sound unfinished to
    it, so its eagerness's longest silence (2 s) follows too; either way the turn stops where the silence began."""
    rate = 24000
    noise = (0.1 * np.random.default_rng(0).standard_normal(rate)).astype(np.float32)
    tail = 2.5 if detection["type"] == "semantic_vad" else 1.0
    audio = np.concatenate([noise, speech_like(0.8, rate), np.zeros(int(tail * rate), np.float32)])

    async def scenario() -> None:
        async with await open_session(server, output_modalities=["text"], audio={"input": {
                "turn_detection": detection}}) as ws:
            await stream_audio(ws, audio, rate)
            started, _ = await until(ws, "input_audio_buffer.speech_started")
            stopped, _ = await until(ws, "input_audio_buffer.speech_stopped")
            done, _ = await until(ws, "response.done")
            assert done["response"]["status"] == "completed"
            assert 950 <= started["audio_start_ms"] <= 1300 and 1700 <= stopped["audio_end_ms"] <= 1900
            assert started["item_id"] == stopped["item_id"]
    asyncio.run(scenario())
    # The committed turn: from 300 ms (prefix padding) before the start to where the silence was heard out.
    longest = 1.5 if detection["type"] == "server_vad" else 3.5  # 2 s of silence where it was judged incomplete
    assert 0.8 * 16000 < len(processor.seen_audios[-1]) < longest * 16000


def test_a_large_append_is_decoded_off_the_loop_in_order(server: LiveServer, processor) -> None:  # noqa: ANN001
    """An append past ON_LOOP_AUDIO is decoded in the session pool: its samples still enter the buffer between the
    appends sent before and after it, and a bad one is still an error event the session survives."""
    rate = 24000  # the test server keeps 5 s: 4.5 s at 24 kHz is 288 KB of base64, past ON_LOOP_AUDIO
    small = np.full(rate // 5, 1000, np.int16).tobytes()
    large = np.full(rate * 9 // 2, -2000, np.int16).tobytes()
    assert len(base64.b64encode(large)) > ON_LOOP_AUDIO

    async def scenario() -> None:
        async with await open_session(server, output_modalities=["text"], streaming_input=False,  # whole audio
                                      audio={"input": {"turn_detection": None}}) as ws:
            await send(ws, {"type": "input_audio_buffer.append", "audio": base64.b64encode(large[:-1]).decode(),
                            "event_id": "odd"})  # an odd number of bytes: not PCM16
            error, _ = await until(ws, "error")
            assert error["error"]["code"] == "invalid_audio"
            for piece in (small, large, small):
                await send(ws, {"type": "input_audio_buffer.append", "audio": base64.b64encode(piece).decode()})
            await send(ws, {"type": "input_audio_buffer.commit"})
            _, before = await until(ws, "input_audio_buffer.committed")
            assert not [e for e in before if e["type"] == "error"]
            await send(ws, {"type": "response.create"})
            await until(ws, "response.done")
    asyncio.run(scenario())
    heard = torch.from_numpy(processor.seen_audios[-1])
    assert len(heard) == 16000 * 49 // 10  # 0.2 + 4.5 + 0.2 s, at 16 kHz
    # Away from the steps (the resampler's filter rings there), each piece's level, in the order sent.
    levels = torch.stack([heard[800:2400].mean(), heard[8000:70000].mean(), heard[-2400:-800].mean()])
    torch.testing.assert_close(levels, torch.tensor([1000.0, -2000.0, 1000.0]) / 32768, rtol=0, atol=1e-3)
