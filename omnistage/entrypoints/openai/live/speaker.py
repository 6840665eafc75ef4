"""Where a GPT-Live session's reply audio goes: ``session.output_audio.delta`` events on a WebSocket, or the reply
track of a WebRTC call (which negotiates its own media: no audio travels as events there).

The backend's audio is base64 in the session's output format, PCM16 at 24 kHz for PCM sessions; a 16 kHz
WebSocket session hears it resampled as a stream (no click at each delta's edge).
"""

from __future__ import annotations

import base64
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import numpy as np

from omnistage.audio.pcm16 import pcm16_base64
from omnistage.audio.resample_stream import StreamResampler
from omnistage.entrypoints.openai.live.events import LiveAudioFormat
from omnistage.entrypoints.openai.realtime.audio_formats import OutputFormat
from omnistage.entrypoints.openai.realtime.protocol import server_event
from omnistage.entrypoints.openai.webrtc.tracks import ReplyTrack
from omnistage.entrypoints.openai.webrtc.transport import decode_delta

BACKEND_PCM_RATE = 24000  # the rate of the backend's PCM16 audio


class Speaker(Protocol):
    async def play(self, delta: str) -> None:
        """One piece of the reply, base64 in the backend's output format."""

    def interrupt(self) -> None:
        """The user spoke over the reply: what is queued and not yet heard is dropped."""


class SocketSpeaker:
    def __init__(self, send: Callable[[dict[str, Any]], Awaitable[None]], fmt: LiveAudioFormat) -> None:
        self._send, self.format = send, fmt
        rate = fmt.rate if fmt.kind == "pcm16" else BACKEND_PCM_RATE
        self._resample = StreamResampler(BACKEND_PCM_RATE, rate) if rate != BACKEND_PCM_RATE else None

    async def play(self, delta: str) -> None:
        if self._resample is not None:
            pcm = np.frombuffer(base64.b64decode(delta), "<i2").astype(np.float32) / 32768.0
            delta = pcm16_base64(self._resample(pcm)).decode("ascii")
        await self._send(server_event("session.output_audio.delta", delta=delta))

    def interrupt(self) -> None:
        if self._resample is not None:
            self._resample.reset()  # the next reply starts a new stream


class TrackSpeaker:
    def __init__(self, track: ReplyTrack, fmt: LiveAudioFormat) -> None:
        self.track = track
        self.format = OutputFormat("pcm16" if fmt.kind == "pcm16" else fmt.kind)

    async def play(self, delta: str) -> None:
        self.track.push(decode_delta(delta, self.format))

    def interrupt(self) -> None:
        self.track.clear()
