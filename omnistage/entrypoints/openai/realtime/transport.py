"""How a realtime session meets its client: the events in and out, and microphone audio where it travels apart.

The session loop (``session_loop.py``) reads :class:`ClientEvent` and
:class:`ClientAudio` from a :class:`Transport` and gives it server events; it
never names a socket. Two implementations: :class:`WebSocketTransport` here
(events as JSON messages, audio inside them as base64) and the WebRTC one in
``entrypoints/openai/webrtc/`` (events on the ``oai-events`` data channel,
audio on Opus tracks).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from fastapi import WebSocket, WebSocketDisconnect


@dataclass(frozen=True)
class ClientEvent:
    raw: str | bytes  # one JSON client event, not yet parsed


@dataclass(frozen=True)
class ClientAudio:
    """Microphone audio that came outside the events (a WebRTC track): mono float32 at ``rate``."""

    samples: np.ndarray
    rate: int


Incoming = ClientEvent | ClientAudio


# WebSocket close codes (RFC 6455; 1013 "try again later" is IANA-registered for a server at capacity)
NORMAL_CLOSURE, GOING_AWAY, TRY_AGAIN_LATER = 1000, 1001, 1013


class Transport(Protocol):
    async def send(self, event: dict[str, Any]) -> None:
        """One server event; raises ``ConnectionError`` when the client is gone."""

    async def receive(self) -> Incoming | None:
        """The next thing the client sent; None once it has left (or ``close`` was called)."""

    async def close(self, reason: str, code: int = NORMAL_CLOSURE) -> None:
        """Ends the connection from the server's side (idle timeout, the server stopping); idempotent. ``code``: a
        WebSocket's close code (a WebRTC call has none)."""


class WebSocketTransport:
    def __init__(self, ws: WebSocket) -> None:
        self.ws = ws

    async def send(self, event: dict[str, Any]) -> None:
        try:
            await self.ws.send_json(event)
        except (WebSocketDisconnect, RuntimeError) as exc:  # RuntimeError: sent after the close
            raise ConnectionError(str(exc)) from exc

    async def receive(self) -> Incoming | None:
        message = await self.ws.receive()
        if message["type"] == "websocket.disconnect":
            return None
        raw = message.get("text") if message.get("text") is not None else message.get("bytes")
        return ClientEvent(raw or b"")

    async def close(self, reason: str, code: int = NORMAL_CLOSURE) -> None:
        try:
            await self.ws.close(code=code, reason=reason)
        except (WebSocketDisconnect, RuntimeError, OSError):
            pass  # already closed by the client
