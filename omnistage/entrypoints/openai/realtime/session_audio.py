"""A realtime session's input audio: appends and microphone audio into the buffer, the VAD watching it, and
streaming input listening to it (``RealtimeSession`` is a ``SessionAudio``).

A large ``input_audio_buffer.append`` (past ``ON_LOOP_AUDIO`` base64 characters: ~4 s of 24 kHz PCM16) is decoded
in the session pool, off the event loop; the read loop waits for it, so a session's pieces still enter the buffer
in order. A model-based VAD runs there too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from omnistage.audio.decode import resample
from omnistage.audio.vad import VadEvent
from omnistage.audio.vad_backend import Vad
from omnistage.entrypoints.openai.common.decode_pool import CancelToken
from omnistage.entrypoints.openai.realtime.audio_formats import InputFormat, decode_base64_audio
from omnistage.entrypoints.openai.realtime.conversation import InputBuffer
from omnistage.entrypoints.openai.realtime.listening import Listener
from omnistage.entrypoints.openai.realtime.protocol import new_id, response_options, server_event
from omnistage.entrypoints.openai.realtime.session import SessionState
from omnistage.entrypoints.openai.realtime.transport import ClientAudio

if TYPE_CHECKING:
    from omnistage.entrypoints.openai.realtime.response import CancelReason
    from omnistage.entrypoints.openai.realtime.session_loop import RealtimeService

IDLE_AUDIO_S = 2.0  # microphone audio kept while no one speaks (beyond any turn's prefix padding)
ON_LOOP_AUDIO = 256 * 1024  # base64 characters: a shorter append decodes in well under a millisecond


class SessionAudio:
    """The input-audio half of a realtime session; the session supplies the attributes below."""

    service: RealtimeService
    state: SessionState
    buffer: InputBuffer
    vad: Vad | None
    listener: Listener
    speech_start: int
    speech_item: str

    async def send(self, event: dict[str, Any]) -> None: ...
    async def _commit(self, item_id: str | None, start: int = 0) -> None: ...
    async def _cancel_response(self, reason: CancelReason = "client_cancelled") -> None: ...
    async def _start_response(self, options: Any, eid: str | None) -> None: ...  # noqa: ANN401

    def _vad_config(self):  # noqa: ANN202 - VadConfig | None
        detection = self.state.config.turn_detection
        return None if detection is None else detection.vad

    @property
    def _streams_input(self) -> bool:
        on = self.state.config.streaming_input
        return self.state.config.kind == "realtime" and (self.service.streaming_input if on is None else on)

    def _reset_vad(self, rebuild: bool = False) -> None:
        if rebuild:
            self.vad = self.service.vad.make(self._vad_config(), self.buffer.rate)
        elif self.vad is not None:
            self.vad.reset()
        self.speech_item = ""
        self.listener.discard()

    async def _append(self, event: dict[str, Any]) -> None:
        data = event.get("audio")
        if isinstance(data, str) and len(data) > ON_LOOP_AUDIO:
            samples = await self.service.vad_pool.run(_decode_job, event, self.buffer.format)
        else:
            samples = self.buffer.format.decode(decode_base64_audio(event))
        await self._detect(self.buffer.append_samples(samples))

    async def _hear(self, audio: ClientAudio) -> None:
        """Microphone audio from a track: it never stops, so what no turn will need is dropped as it goes."""
        piece = resample(audio.samples, audio.rate, self.buffer.rate)
        idle = self.vad is not None and not self.vad.in_speech
        keep = self.buffer.max_samples
        if idle:
            keep = min(keep, int(self.buffer.rate * (IDLE_AUDIO_S + self._vad_config().prefix_padding_ms / 1000)))
        self.buffer.keep_last(keep - len(piece))
        await self._detect(self.buffer.append_samples(piece))

    async def _detect(self, piece: np.ndarray) -> None:
        if self.vad is None:  # the client commits: the item will be the whole buffer
            if self._streams_input and not self.listener.active:
                self.listener.begin(0)
            self.listener.heard(self.buffer)
            return
        # The read loop waits for the detector, so one session's pieces are fed in order, one at a time.
        pool = self.service.vad_pool
        events = self.vad.feed(piece) if self.vad.inline else await pool.run(_feed_job, self.vad, piece)
        self.listener.heard(self.buffer)
        for vad_event in events:
            await self._on_vad(vad_event)

    async def _on_vad(self, vad_event: VadEvent) -> None:
        ms = vad_event.sample * 1000 // self.buffer.rate
        detection = self.state.config.turn_detection
        pad = (detection.vad.prefix_padding_ms if detection else 0) * self.buffer.rate // 1000
        if vad_event.kind == "speech_started":
            self.speech_start, self.speech_item = vad_event.sample, new_id("item")
            if self._streams_input:
                self.listener.begin(max(0, self.speech_start - pad))  # where _commit will cut the item
            await self.send(server_event("input_audio_buffer.speech_started", audio_start_ms=ms,
                                         item_id=self.speech_item))
            if detection is not None and detection.interrupt_response:
                await self._cancel_response("turn_detected")  # barge-in
        elif self.speech_item:
            await self.send(server_event("input_audio_buffer.speech_stopped", audio_end_ms=ms,
                                         item_id=self.speech_item))
            await self._commit(self.speech_item, start=max(0, self.speech_start - pad))
            if detection is not None and detection.create_response and self.state.config.kind == "realtime":
                await self._start_response(response_options(self.state.config, {}), None)


def _decode_job(event: dict[str, Any], fmt: InputFormat, token: CancelToken) -> np.ndarray:
    token.check()
    return fmt.decode(decode_base64_audio(event))


def _feed_job(vad: Vad, piece: np.ndarray, token: CancelToken) -> list[VadEvent]:
    token.check()
    return vad.feed(piece)
