"""A realtime session over WebRTC: events on the ``oai-events`` data channel, audio on the call's tracks.

The session loop is the WebSocket's (``realtime/session_loop.py``); this
transport is what differs. Client events arrive as data-channel messages,
the microphone as :class:`ClientAudio` (the session's input buffer and VAD
take it as they take ``input_audio_buffer.append``). Server events leave on
the channel as they would on the socket, except that the reply's audio goes
to the reply track instead of ``response.output_audio.delta`` events, as
OpenAI's WebRTC does, with its ``output_audio_buffer.started`` / ``stopped``
/ ``cleared`` around it. A cancelled response (``response.cancel``,
``output_audio_buffer.clear``) empties the track at once, and so does the
user speaking (with ``interrupt_response``) while the reply still plays, even
when its response is done: the track plays in real time, generation runs ahead.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
from collections.abc import Callable
from typing import Any

import numpy as np
from aiortc import RTCDataChannel, RTCPeerConnection
from aiortc.mediastreams import MediaStreamTrack

from omnistage.audio.decode import resample
from omnistage.audio.g711 import decode_g711
from omnistage.entrypoints.openai.realtime.protocol import OutputFormat, SessionConfig, server_event
from omnistage.entrypoints.openai.realtime.transport import NORMAL_CLOSURE, ClientAudio, ClientEvent, Incoming
from omnistage.entrypoints.openai.webrtc.tracks import RATE, ReplyTrack, microphone_pcm

logger = logging.getLogger(__name__)
EVENTS_LABEL = "oai-events"
G711_RATE = 8000
MAX_QUEUED_AUDIO = 250  # microphone pieces (~5 s) waiting for the session; past it the newest are dropped
MAX_BACKLOG = 1000  # events sent before the data channel opened
HIGH_WATER = 1 << 20  # bytes the channel may hold unsent before a send waits (the session's --send-timeout bounds it)


class WebRtcTransport:
    def __init__(self, pc: RTCPeerConnection, config: Callable[[], SessionConfig]) -> None:
        """``config``: the session's settings, read as they are now (output format, interrupt_response)."""
        self.pc, self._config = pc, config
        self.reply = ReplyTrack()
        self._incoming: asyncio.Queue[Incoming | None] = asyncio.Queue()
        self._audio_queued = 0
        self._channel: RTCDataChannel | None = None
        self._backlog: list[str] = []
        self._playing: str | None = None  # the response whose audio the track is playing
        self._tasks: set[asyncio.Task[None]] = set()
        self.closed = False
        self.connected = asyncio.Event()  # ICE and DTLS are up (calls.py ends a call that never gets there)
        pc.on("datachannel", self._on_channel)
        pc.on("track", self._on_track)
        pc.on("connectionstatechange", self._on_state)

    # -- from the peer ---------------------------------------------------------------------------
    def _on_channel(self, channel: RTCDataChannel) -> None:
        if channel.label != EVENTS_LABEL:
            return
        self._channel = channel
        channel.on("message", lambda message: self._incoming.put_nowait(ClientEvent(message)))
        channel.on("close", self._end)
        for text in self._backlog:
            channel.send(text)
        self._backlog.clear()

    def _on_track(self, track: MediaStreamTrack) -> None:
        if track.kind == "audio":
            self._spawn(self._listen(track))

    async def _listen(self, track: MediaStreamTrack) -> None:
        async for samples, rate in microphone_pcm(track, lambda: self._config().input_format.rate):
            if self.closed:
                return
            if self._audio_queued >= MAX_QUEUED_AUDIO:
                continue  # the session is behind (a slow VAD): drop rather than grow without bound
            self._audio_queued += 1
            self._incoming.put_nowait(ClientAudio(samples, rate))

    def _on_state(self) -> None:
        if self.pc.connectionState == "connected":
            self.connected.set()
        if self.pc.connectionState in ("failed", "closed"):  # ICE failure, consent lost, or the peer hung up
            self._end()

    def _end(self) -> None:
        if not self.closed:
            self.closed = True
            self._incoming.put_nowait(None)

    async def receive(self) -> Incoming | None:
        item = await self._incoming.get()
        if isinstance(item, ClientAudio):
            self._audio_queued -= 1
        return item

    # -- to the peer -----------------------------------------------------------------------------
    async def send(self, event: dict[str, Any]) -> None:
        if self.closed:
            raise ConnectionError("the call has ended")
        kind = event.get("type")
        if kind == "response.output_audio.delta":
            await self._play(event)
            return
        if kind == "input_audio_buffer.speech_started" and self._interrupts():
            await self._cut()  # before the event: the page hears silence as it learns of the turn
        await self._send_event(event)
        if kind == "response.done":
            await self._response_done(event["response"])

    def _interrupts(self) -> bool:
        detection = self._config().turn_detection
        return detection is not None and detection.interrupt_response

    async def _send_event(self, event: dict[str, Any]) -> None:
        text = json.dumps(event)
        channel = self._channel
        if channel is None or channel.readyState != "open":
            if len(self._backlog) < MAX_BACKLOG:
                self._backlog.append(text)
            return
        while channel.bufferedAmount > HIGH_WATER and not self.closed:
            await asyncio.sleep(0.01)  # a peer that stops reading: the session's --send-timeout ends it
        channel.send(text)

    async def _play(self, event: dict[str, Any]) -> None:
        self.reply.push(decode_delta(event["delta"], self._config().output_format))
        if self._playing != event["response_id"]:
            self._playing = event["response_id"]
            await self._send_event(server_event("output_audio_buffer.started", response_id=self._playing))

    async def _response_done(self, response: dict[str, Any]) -> None:
        if self._playing != response.get("id"):
            return
        if response.get("status") == "cancelled":
            await self._cut()
        else:
            self._spawn(self._stopped_when_drained(self._playing))

    async def _cut(self) -> None:
        playing, self._playing = self._playing, None
        if playing is not None:
            self.reply.clear()  # silent from the next frame
            await self._send_event(server_event("output_audio_buffer.cleared", response_id=playing))

    async def _stopped_when_drained(self, response_id: str) -> None:
        while self.reply.queued_samples and self._playing == response_id and not self.closed:
            await asyncio.sleep(0.02)
        if self._playing == response_id and not self.closed:
            self._playing = None
            await self._send_event(server_event("output_audio_buffer.stopped", response_id=response_id))

    async def close(self, reason: str, code: int = NORMAL_CLOSURE) -> None:  # noqa: ARG002 - a call has no close code
        logger.debug("webrtc call closing: %s", reason)
        self._end()
        for task in list(self._tasks):
            task.cancel()
        self.reply.stop()
        with contextlib.suppress(Exception):  # closing a half-open connection must not fail the hang-up
            await self.pc.close()

    def _spawn(self, coro: Any) -> None:  # noqa: ANN401 - a coroutine
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


def decode_delta(delta: str, fmt: OutputFormat) -> np.ndarray:
    """An audio delta's base64 bytes in the session's output format → float32 at 24 kHz for the track."""
    raw = base64.b64decode(delta)
    if fmt.kind == "pcm16":
        return np.frombuffer(raw, dtype="<i2").astype(np.float32) / 32768.0
    return resample(decode_g711(raw, "ulaw" if fmt.kind == "pcmu" else "alaw"), G711_RATE, RATE)
