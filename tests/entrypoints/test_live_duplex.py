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
import shutil
import time
from collections.abc import Iterator
from typing import Any

import aiohttp
import numpy as np
import pytest
from livekit import rtc
from livekit.plugins.openai.realtime import GPTLiveModel

from omnistage.audio.decode import resample
from omnistage.entrypoints.openai.api_server import build_app
from omnistage.pipeline.duplex_omni import DuplexOmni
from tests.audio.test_smart_turn import spoken
from tests.entrypoints.live_client import live_problems, pcm_pieces, read_until, sdk_client
from tests.entrypoints.server_thread import ServerThread

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="real speech")]
RATE = 24000
PACE = 4.0  # wall seconds per engine second (see the module's docstring)
TIMEOUT_S = 90.0


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
    async def scenario() -> tuple[list[dict[str, Any]], list[str], int, list[Any]]:
        async with aiohttp.ClientSession() as http:
            model = GPTLiveModel(model="moshi-tiny", api_key="unused", base_url=f"{moshi.base_url}/v1",
                                 http_session=http)
            session = model.session()
            events: list[dict[str, Any]] = []
            session.on("openai_server_event_received", events.append)
            said: list[str] = []
            session.on("transcript_delta", lambda e: said.append(e.text))
            errors: list[Any] = []
            session.on("error", errors.append)
            samples = 0

            async def listen() -> None:
                nonlocal samples
                async for frame in session.audio_stream:
                    samples += frame.frame.samples_per_channel
            listener = asyncio.create_task(listen())
            await session._update_session(instructions="Be brief.")  # as LiveKit's duplex adapter does: it starts
            pcm = (speech() * 32767).astype("<i2")
            step = RATE // 50  # 20 ms frames, as a room's track delivers them
            for i in range(0, len(pcm), step):
                session.push_audio(rtc.AudioFrame(pcm[i:i + step].tobytes(), RATE, 1, len(pcm[i:i + step])))
                await asyncio.sleep(0)
            async with asyncio.timeout(TIMEOUT_S):
                while not (said and samples >= 12 * 1920):
                    await asyncio.sleep(0.05)
            await session.aclose()  # session.close, then it waits for session.closed
            listener.cancel()
            await model.aclose()
            return events, said, samples, errors
    events, said, samples, errors = asyncio.run(scenario())
    assert errors == [] and live_problems(events) == []
    assert "".join(said).strip() and samples >= 12 * 1920
    assert any(e["type"] == "info" and e["code"] == "delegation_unavailable" for e in events)  # its default
    assert events[-1]["type"] == "session.closed" and events[-1]["reason"] == "close_requested"
    assert freed(moshi.engine)
