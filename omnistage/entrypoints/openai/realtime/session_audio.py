"""A realtime session's input audio: appends and microphone audio into the buffer, the VAD watching it, and
streaming input listening to it (``RealtimeSession`` is a ``SessionAudio``).

A large ``input_audio_buffer.append`` (past ``ON_LOOP_AUDIO`` base64 characters: ~4 s of 24 kHz PCM16) is decoded
in the session pool, off the event loop; the read loop waits for it, so a session's pieces still enter the buffer
in order. A model-based VAD runs there too. A pause in a turn starts its reply speculatively (``speculation.py``),
and the turn's end commits the item that reply answers.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from omnistage.audio.decode import resample
from omnistage.audio.turn_judge import SEMANTIC_SPECULATE_MS
from omnistage.audio.vad import VadConfig, VadEvent
from omnistage.audio.vad_backend import Vad
from omnistage.entrypoints.openai.common.decode_pool import CancelToken
from omnistage.entrypoints.openai.realtime.audio_formats import InputFormat, decode_base64_audio
from omnistage.entrypoints.openai.realtime.conversation import InputBuffer
from omnistage.entrypoints.openai.realtime.event_error import EventError
from omnistage.entrypoints.openai.realtime.idle_timeout import IdleTimeout
from omnistage.entrypoints.openai.realtime.items import Item
from omnistage.entrypoints.openai.realtime.listening import Listener
from omnistage.entrypoints.openai.realtime.live_transcript import LiveTranscript
from omnistage.entrypoints.openai.realtime.protocol import new_id, response_options, server_event
from omnistage.entrypoints.openai.realtime.session import SessionState
from omnistage.entrypoints.openai.realtime.speculation import Speculation, SpeculativeTurn
from omnistage.entrypoints.openai.realtime.transport import ClientAudio
from omnistage.entrypoints.openai.realtime.turn_request import TurnRequests

if TYPE_CHECKING:
    from omnistage.entrypoints.openai.realtime.response import CancelReason
    from omnistage.entrypoints.openai.realtime.service import RealtimeService

IDLE_AUDIO_S = 2.0  # microphone audio kept while no one speaks (beyond any turn's prefix padding)
ON_LOOP_AUDIO = 256 * 1024  # base64 characters: a shorter append decodes in well under a millisecond


class SessionAudio:
    """The input-audio half of a realtime session; the session supplies the attributes below."""

    service: RealtimeService
    state: SessionState
    buffer: InputBuffer
    vad: Vad | None
    listener: Listener
    live: LiveTranscript
    requests: TurnRequests
    speech_start: int
    speech_item: str
    speculation: Speculation | None  # the speculative reply of the turn in progress
    response: asyncio.Task[None] | None
    idle: IdleTimeout  # server_vad's idle_timeout_ms (idle_timeout.py)

    async def send(self, event: dict[str, Any]) -> None: ...
    async def fail(self, exc: EventError) -> None: ...
    async def _commit(self, item_id: str | None, start: int = 0, heard: Item | None = None) -> None: ...
    async def _cancel_response(self, reason: CancelReason = "client_cancelled") -> None: ...
    async def _start_response(self, options: Any, eid: str | None,  # noqa: ANN401
                              speculation: Speculation | None = None) -> None: ...

    def _vad_config(self) -> VadConfig | None:
        """The session's VAD, reporting pauses when a turn's end starts a response and streaming input is on: the
        speculative reply's pause (server_vad: the session's ``speculative_reply_ms``, else the server's;
        semantic_vad: ``SEMANTIC_SPECULATE_MS``, before its classifier's first verdict, whose "complete" ends the
        turn)."""
        detection = self.state.config.turn_detection
        if detection is None:
            return None
        speculates = self._streams_input and detection.create_response
        ms = SEMANTIC_SPECULATE_MS if detection.semantic else self._speculative_reply_ms
        return replace(detection.vad, pause_ms=ms if speculates else 0)

    @property
    def _speculative_reply_ms(self) -> int:
        ms = self.state.config.speculative_reply_ms
        return self.service.speculative_reply_ms if ms is None else ms

    @property
    def _streams_input(self) -> bool:
        on = self.state.config.streaming_input
        return self.state.config.kind == "realtime" and (self.service.streaming_input if on is None else on)

    def _make_vad(self) -> Vad | None:
        detection = self.state.config.turn_detection
        return self.service.vad.make(self._vad_config(), self.buffer.rate, detection is not None and detection.semantic)

    def _reset_vad(self, rebuild: bool = False) -> None:
        if rebuild:
            self.vad = self._make_vad()
        elif self.vad is not None:
            self.vad.reset()
        self.speech_item = ""
        self.listener.discard()
        self.live.discard()
        self._drop_speculation()

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
        self.live.heard(self.buffer)
        for vad_event in events:
            await self._on_vad(vad_event)

    async def _on_vad(self, vad_event: VadEvent) -> None:
        ms = vad_event.sample * 1000 // self.buffer.rate
        detection = self.state.config.turn_detection
        pad = (detection.vad.prefix_padding_ms if detection else 0) * self.buffer.rate // 1000
        start = max(0, self.speech_start - pad)  # where the item begins (_commit cuts it there)
        if vad_event.kind == "speech_started":
            self.speech_start, self.speech_item = vad_event.sample, new_id("item")
            if self._streams_input:
                self.listener.begin(max(0, self.speech_start - pad))
            if self.state.config.transcribes:
                self.live.begin(self.speech_item, max(0, self.speech_start - pad))
            await self.send(server_event("input_audio_buffer.speech_started", audio_start_ms=ms,
                                         item_id=self.speech_item))
            self.idle.cancel()
            if detection is not None and detection.interrupt_response:
                await self._cancel_response("turn_detected")  # barge-in
        elif vad_event.kind == "speech_paused" and detection is not None and (pause_ms := self._vad_config().pause_ms):
            # (With no pause set, semantic_vad reports one at its first "incomplete": nothing to start then.) The turn
            # ends, at the earliest, once the rest of its silence (server_vad) or of the silence before the
            # classifier's first verdict (semantic_vad) has passed: from a live microphone, that much later.
            end_ms = detection.vad.judge_ms if detection.semantic else detection.vad.silence_duration_ms
            rest_s = max(end_ms - pause_ms, 0) / 1000
            self._speculate(start, vad_event.sample, time.monotonic() + rest_s)
        elif vad_event.kind in ("speech_paused", "speech_resumed"):
            self._drop_speculation()
        elif self.speech_item:
            await self.send(server_event("input_audio_buffer.speech_stopped", audio_end_ms=ms,
                                         item_id=self.speech_item))
            answer = detection is not None and detection.create_response and self.state.config.kind == "realtime"
            await self._end_turn(start, answer)

    async def _end_turn(self, start: int, answer: bool) -> None:
        """Commits the turn (the speculative reply's item, when one was built) and, when ``answer``, responds
        (with the speculative reply, when it still answers the committed conversation)."""
        speculation, self.speculation = self.speculation, None
        turn = None if speculation is None else await speculation.ready()
        try:
            await self._commit(self.speech_item, start=start, heard=None if turn is None else turn.item)
            if answer:
                await self._start_response(response_options(self.state.config, {}), None,
                                           speculation if turn is not None else None)
            elif speculation is not None:
                speculation.cancel()
        except BaseException:
            if speculation is not None:
                speculation.cancel()
            raise

    def _speculate(self, start: int, cut: int, turn_end: float) -> None:
        """The user paused (``speculation.py``): starts the reply to the item ``[start, cut)`` of the buffer, its
        outputs held, unless a response is in progress or the server lacks headroom (``speculation_gate.py``). Its audio is played from
        ``turn_end`` (``time.monotonic()``), when the turn is expected to end."""
        if not self.speech_item or (self.response is not None and not self.response.done()):
            return
        # No headroom (a spoken reply near running dry, the cap, a full server): the commit starts the reply.
        ticket = self.service.speculation_gate.admit(self.service.admission)
        if ticket is None:
            return
        self._drop_speculation()
        buffer, item_id, head, pending = self.buffer, self.speech_item, self.listener.head(), self.listener.in_flight()

        async def build() -> SpeculativeTurn:
            audio = await buffer.copy_in(self.service.pool, start, cut)
            item = Item(item_id, "message", role="user", audio=audio, listened=self.listener.listened(audio, head))
            if pending is not None:
                await asyncio.wait({pending})
            options = response_options(self.state.config, {})
            items = await self.requests.items(options, self.state.conversation.with_item(item))
            request, dropped = await self.requests.build(options, items, self.requests.tools(options), None)
            # Played only from the turn's end: until then the pipeline may make its first chunk smaller.
            return SpeculativeTurn(item, options, items, replace(request, plays_at=turn_end), dropped)

        self.speculation = Speculation(build, self.service.engine, ticket, self.service.limits.request_timeout,
                                       self.service.count_speculation)

    def _arm_idle(self, audio_s: float, started: float) -> None:
        """A response ended: with ``idle_timeout_ms``, the session prompts one itself after that much silence
        following the reply's playback (``audio_s`` of audio, played from ``started``, ``time.monotonic()``)."""
        detection = self.state.config.turn_detection
        if detection is None or detection.idle_timeout_ms is None or self.state.config.kind != "realtime":
            return
        playing_s = max(0.0, audio_s - (time.monotonic() - started))
        idle_s = detection.idle_timeout_ms / 1000
        self.idle.arm(playing_s + idle_s, lambda: self._idle_timed_out(idle_s))

    async def _idle_timed_out(self, idle_s: float) -> None:
        """The user said nothing for ``idle_s`` after the reply: the idle stretch of the buffer is their item."""
        detection = self.state.config.turn_detection
        busy = self.response is not None and not self.response.done()
        if detection is None or busy or (self.vad is not None and self.vad.in_speech):
            return
        idle = min(int(idle_s * self.buffer.rate), self.buffer.max_samples)
        if self.buffer.samples < idle:  # the client sent less than the silence it kept: the rest was silence too
            self.buffer.append_samples(np.zeros(idle - self.buffer.samples, np.float32))
        end = self.buffer.samples
        if self.vad is not None:
            self.vad.reset()  # the silence added was never fed to it: its positions start again with the commit
        self.speech_item = new_id("item")
        await self.send(server_event("input_audio_buffer.timeout_triggered", item_id=self.speech_item,
                                     audio_start_ms=(end - idle) * 1000 // self.buffer.rate,
                                     audio_end_ms=end * 1000 // self.buffer.rate))
        try:
            await self._end_turn(end - idle, detection.create_response)
        except EventError as exc:  # e.g. the server is at its bound: said as the response's own refusal would be
            await self.fail(exc)

    def _drop_speculation(self) -> None:
        speculation, self.speculation = self.speculation, None
        if speculation is not None:
            speculation.cancel()


def _decode_job(event: dict[str, Any], fmt: InputFormat, token: CancelToken) -> np.ndarray:
    token.check()
    return fmt.decode(decode_base64_audio(event))


def _feed_job(vad: Vad, piece: np.ndarray, token: CancelToken) -> list[VadEvent]:
    token.check()
    return vad.feed(piece)
