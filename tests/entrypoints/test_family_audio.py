"""The whole API on families of another codec's timing: 25 Hz frames at 16 kHz, 7.5 Hz frames at 44.1 kHz.

Every generic layer reads the family's ``AudioSpec`` (frame duration, output rate): chat (streamed PCM16, a whole
WAV), speech (WAV, streamed PCM), realtime over WebSocket and WebRTC each carry exactly the audio the talker's
frames make (``frames x samples_per_frame`` at the family's rate; resampled to 24 kHz where the wire format says
so), and a player starting at the first audio never runs dry. The stages run in their own processes, so the
talker's chunks reach the codec replica directly.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest
import soundfile as sf
from websockets.asyncio.client import connect

from omnistage.entrypoints.openai.api_server import build_app
from omnistage.entrypoints.openai.server_config import ServingOptions
from omnistage.entrypoints.openai.webrtc.tracks import RATE as TRACK_RATE
from omnistage.pipeline.async_omni import AsyncOmni
from omnistage.tools.bench.metrics import StreamRecord
from tests.entrypoints.server_thread import ServerThread
from tests.entrypoints.speech_sample import speech
from tests.entrypoints.test_realtime import send, spoken_like, stream_audio, until
from tests.entrypoints.test_webrtc import Client
from tests.pipeline.toy_audio import HZ7_5_44K, HZ25_16K, Timing, make_folder, serve

pytestmark = pytest.mark.e2e
FRAMES = 40  # every reply's talker frames (the toy talker's limit)
PCM_RATE = 24000  # what raw PCM travels at


@dataclass
class Served:
    url: str
    timing: Timing
    engine: AsyncOmni

    @property
    def seconds(self) -> float:
        """The audio a reply holds: every frame's samples at the family's rate."""
        return FRAMES * self.timing.samples_per_frame / self.timing.sample_rate

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module", params=[HZ25_16K, HZ7_5_44K], ids=lambda t: t.name)
def served(request: pytest.FixtureRequest, tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory,
           ) -> Iterator[Served]:
    timing: Timing = request.param
    folder = make_folder(tiny_dir, tmp_path_factory.mktemp(timing.name), timing, FRAMES)
    engine = serve(folder, timing)
    thread = ServerThread(build_app(engine, serving=ServingOptions(vad="energy")))
    try:
        yield Served(thread.start(), timing, engine)
    finally:
        thread.stop()
        asyncio.run(engine.shutdown())


def _pcm_seconds(pcm: bytes) -> float:
    return len(pcm) / 2 / PCM_RATE


def test_streamed_chat_audio_lasts_its_frames_and_never_runs_dry(served: Served) -> None:
    stream = served.client().chat.completions.create(
        model=served.timing.name, messages=[{"role": "user", "content": "hi"}], modalities=["text", "audio"],
        audio={"voice": "Ethan", "format": "pcm16"}, stream=True, max_tokens=6, seed=1)
    record, pcm = StreamRecord(time.perf_counter()), b""
    for chunk in stream:
        for choice in chunk.choices:
            data = getattr(getattr(choice.delta, "audio", None), "data", None)
            if data:
                piece = base64.b64decode(data)
                record.add_audio(time.perf_counter(), len(piece) // 2)
                pcm += piece
    assert _pcm_seconds(pcm) == pytest.approx(served.seconds, abs=1 / PCM_RATE)
    assert record.audio_seconds == pytest.approx(served.seconds, abs=1 / PCM_RATE)
    assert record.underrun_s() == 0.0


def test_a_whole_wav_is_at_the_familys_rate(served: Served) -> None:
    answer = served.client().chat.completions.create(
        model=served.timing.name, messages=[{"role": "user", "content": "hi"}], modalities=["text", "audio"],
        audio={"voice": "Ethan", "format": "wav"}, max_tokens=4, seed=1)
    samples, rate = sf.read(io.BytesIO(base64.b64decode(answer.choices[0].message.audio.data)), dtype="float32")
    assert rate == served.timing.sample_rate
    assert len(samples) == FRAMES * served.timing.samples_per_frame


def test_speech_as_wav_and_as_streamed_pcm(served: Served) -> None:
    body = {"model": served.timing.name, "input": "Hello there.", "voice": "Ethan"}
    wav = httpx.post(f"{served.url}/v1/audio/speech", json={**body, "response_format": "wav"}, timeout=60)
    assert wav.status_code == 200, wav.text
    samples, rate = sf.read(io.BytesIO(wav.content), dtype="float32")
    assert rate == served.timing.sample_rate and len(samples) / rate == pytest.approx(served.seconds)
    pcm, record = b"", StreamRecord(time.perf_counter())
    with httpx.stream("POST", f"{served.url}/v1/audio/speech", timeout=60,
                      json={**body, "response_format": "pcm", "stream_format": "sse"}) as response:
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                event = json.loads(line[6:])
                if event.get("type") == "speech.audio.delta":
                    piece = base64.b64decode(event["audio"])
                    record.add_audio(time.perf_counter(), len(piece) // 2)
                    pcm += piece
    assert _pcm_seconds(pcm) == pytest.approx(served.seconds, abs=1 / PCM_RATE)
    assert record.underrun_s() == 0.0


def test_a_realtime_turn_streams_the_replys_audio_at_24_khz(served: Served) -> None:
    async def scenario() -> tuple[float, StreamRecord]:
        url = served.url.replace("http://", "ws://") + "/v1/realtime"
        async with connect(url) as ws:
            await until(ws, "session.created")
            await send(ws, {"type": "session.update", "session": {
                "type": "realtime", "audio": {"input": {"format": {"type": "audio/pcm", "rate": 16000},
                                                        "turn_detection": None}}}})
            await until(ws, "session.updated")
            await stream_audio(ws, spoken_like(1.0, 16000), 16000)
            await send(ws, {"type": "input_audio_buffer.commit"})
            await send(ws, {"type": "response.create", "response": {"max_output_tokens": 6}})
            record, pcm = StreamRecord(time.perf_counter()), b""
            while True:
                event = json.loads(await asyncio.wait_for(ws.recv(), 60))
                if event["type"] == "response.output_audio.delta":
                    piece = base64.b64decode(event["delta"])
                    record.add_audio(time.perf_counter(), len(piece) // 2)
                    pcm += piece
                elif event["type"] == "response.done":
                    assert event["response"]["status"] in ("completed", "incomplete"), event
                    return _pcm_seconds(pcm), record

    seconds, record = asyncio.run(scenario())
    assert seconds == pytest.approx(served.seconds, abs=1 / PCM_RATE)
    assert record.underrun_s() == 0.0


def test_a_webrtc_call_plays_the_whole_reply(served: Served) -> None:
    spoken, _ = speech("Hello there, what time is it?", TRACK_RATE)

    async def scenario() -> float:
        client = Client()
        async with httpx.AsyncClient(base_url=served.url, timeout=30) as http:
            assert (await client.connect(http)).status_code == 201
            await client.event("session.created", timeout=30)
            client.mic.push(spoken)
            first = (await client.event("response.created", timeout=30))["response"]["id"]
            await client.event("output_audio_buffer.stopped", timeout=60, response_id=first)
            await http.delete(client.location)
            await client.pc.close()
        # The reply track sends 20 ms frames; those carrying the tone are the reply.
        return sum(0.02 for _, rms in client.heard if rms > 0.05)

    assert asyncio.run(scenario()) == pytest.approx(served.seconds, rel=0.1)
