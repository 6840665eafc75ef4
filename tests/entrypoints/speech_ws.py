"""A speech-stream WebSocket session as a client holds it: events sent in order, every event received until the
audio is done (or an error)."""

from __future__ import annotations

import asyncio
import json


async def speech_stream_session(url: str, model: str, events: list[dict]) -> list[dict]:
    from websockets.asyncio.client import connect

    received: list[dict] = []
    async with connect(url.replace("http://", "ws://") + f"/v1/audio/speech/stream?model={model}", open_timeout=10,
                       max_size=None) as ws:
        for event in events:
            await ws.send(json.dumps(event))
        while not received or received[-1]["type"] not in ("speech.audio.done", "error"):
            received.append(json.loads(await asyncio.wait_for(ws.recv(), 60)))
    return received
