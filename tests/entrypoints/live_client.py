"""What the GPT-Live tests share: the SDK's server-event union as its strict reader, and a session driven through
the unchanged ``openai`` SDK's ``client.live.connect()``."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, Any

import numpy as np
import openai
import pydantic
from openai.types.live import ServerEvent

from tests.entrypoints.realtime_validators import refused

LIVE = pydantic.TypeAdapter(Annotated[ServerEvent, pydantic.Field(discriminator="type")])


def live_problems(events: list[dict[str, Any]]) -> list[str]:
    """Each event the SDK's ``ServerEvent`` union refuses, with pydantic's reason."""
    return refused(events, LIVE)


def pcm_pieces(samples: np.ndarray, rate: int, piece_ms: int = 40) -> list[str]:
    pcm = (np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes()
    step = rate * piece_ms // 1000 * 2
    return [base64.b64encode(pcm[i:i + step]).decode() for i in range(0, len(pcm), step)]


async def read_until(conn: Any, done: Callable[[dict[str, Any]], bool], seen: list[dict[str, Any]],
                     timeout_s: float) -> dict[str, Any]:
    """Reads the SDK connection's events (as the JSON the server sent) into ``seen`` up to the first ``done``."""
    async with asyncio.timeout(timeout_s):
        while True:
            event = (await conn.recv()).to_dict()
            seen.append(event)
            if done(event):
                return event


def sdk_client(base_url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0)


@dataclass
class LiveKitRun:
    """What LiveKit's ``GPTLiveModel`` session saw: the server's events, the agent's transcript deltas, the samples
    of its audio stream and the errors it emitted."""

    events: list[dict[str, Any]] = field(default_factory=list)
    said: list[str] = field(default_factory=list)
    samples: int = 0
    errors: list[Any] = field(default_factory=list)


async def livekit_session(base_url: str, model: str, audio: np.ndarray, rate: int,
                          done: Callable[[LiveKitRun], bool], timeout_s: float) -> LiveKitRun:
    """An unchanged ``GPTLiveModel`` session: started as LiveKit's duplex adapter starts it, ``audio`` pushed as a
    room's track delivers it (20 ms frames), read until ``done``, then closed (it waits for ``session.closed``)."""
    import aiohttp
    from livekit import rtc
    from livekit.plugins.openai.realtime import GPTLiveModel

    run = LiveKitRun()
    async with aiohttp.ClientSession() as http:
        live = GPTLiveModel(model=model, api_key="unused", base_url=f"{base_url}/v1", http_session=http)
        session = live.session()
        session.on("openai_server_event_received", run.events.append)
        session.on("transcript_delta", lambda e: run.said.append(e.text))
        session.on("error", run.errors.append)

        async def listen() -> None:
            async for frame in session.audio_stream:
                run.samples += frame.frame.samples_per_channel
        listener = asyncio.create_task(listen())
        await session._update_session(instructions="Answer briefly.")  # as LiveKit's duplex adapter does
        pcm = (audio * 32767).astype("<i2")
        step = rate // 50
        for i in range(0, len(pcm), step):
            session.push_audio(rtc.AudioFrame(pcm[i:i + step].tobytes(), rate, 1, len(pcm[i:i + step])))
            await asyncio.sleep(0)
        async with asyncio.timeout(timeout_s):
            while not done(run):
                await asyncio.sleep(0.05)
        await session.aclose()
        listener.cancel()
        await live.aclose()
    return run
