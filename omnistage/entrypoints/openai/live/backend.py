"""What a GPT-Live session runs on: the one typed interface between the protocol and a model's session engine.

``live/session.py`` speaks OpenAI's GPT-Live protocol to the client and nothing else; behind it a
:class:`LiveBackend` hears the user and answers. Today's backend is turn-based (``turn_backend.py``: a
realtime session with server VAD, streaming input, speculative replies and barge-in); a full-duplex engine
(one agent frame per user frame) implements the same five methods and yields the same outputs.

The contract:

- ``start(config)`` applies the immutable startup settings; it returns the errors that refuse them (an
  unknown voice, a bad history item), empty when the session may start.
- ``hear(audio, event_id)`` takes the user's audio as it arrives: base64 in the session's WebSocket format, or
  :class:`ClientAudio` samples from a WebRTC track (an error about it names ``event_id``); it may wait while the
  engine side is behind (backpressure on the client's reads). A muted session still calls it, with silence, so a
  clocked engine keeps its time.
- ``append(kind, text, event_id)`` adds context (instructions, thinking, commentary to say once).
- ``outputs()`` yields what the client hears and reads, in order, ending with :class:`Ended`.
- ``close()`` stops everything the backend started (engine requests aborted); idempotent.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Literal, Protocol

from omnistage.entrypoints.openai.live.events import ContextKind, StartConfig
from omnistage.entrypoints.openai.realtime.event_error import EventError
from omnistage.entrypoints.openai.realtime.transport import ClientAudio


@dataclass(frozen=True)
class AudioOut:
    delta: str  # base64 audio in the session's output format


@dataclass(frozen=True)
class TranscriptOut:
    role: Literal["user", "assistant"]
    text: str


@dataclass(frozen=True)
class Interrupted:
    """The user spoke over the reply: audio still queued for playback is dropped (a WebRTC track clears)."""


@dataclass(frozen=True)
class ContextUsed:
    ratio: float  # the latest prompt's tokens over the model's context


@dataclass(frozen=True)
class Failed:
    error: EventError  # one command or turn failed; the session goes on


@dataclass(frozen=True)
class Ended:
    reason: Literal["expired", "connection_lost"]  # the backend stopped on its own (idle, the server stopping)
    error: EventError | None = None


LiveOutput = AudioOut | TranscriptOut | Interrupted | ContextUsed | Failed | Ended


class LiveBackend(Protocol):
    async def start(self, config: StartConfig) -> list[EventError]: ...

    async def hear(self, audio: str | ClientAudio, event_id: str | None = None) -> None: ...

    async def append(self, kind: ContextKind, text: str, event_id: str | None) -> None: ...

    def outputs(self) -> AsyncIterator[LiveOutput]: ...

    async def close(self) -> None: ...


async def until_ended(queue: asyncio.Queue[LiveOutput]) -> AsyncIterator[LiveOutput]:
    """A backend's ``outputs()``: what it queued, in order, through the :class:`Ended` that closes them."""
    while True:
        out = await queue.get()
        yield out
        if isinstance(out, Ended):
            return
