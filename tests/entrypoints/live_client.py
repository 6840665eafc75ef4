"""What the GPT-Live tests share: the SDK's server-event union as its strict reader, and a session driven through
the unchanged ``openai`` SDK's ``client.live.connect()``."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Callable
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
