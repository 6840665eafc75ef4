"""A GPT-Live session on today's turn-based machinery: one ordinary realtime session, driven through a bridge.

The realtime session (``realtime/session_loop.py``) runs unchanged: server VAD ends the user's turn and starts
the reply (``create_response``), speech over a reply cancels it (``interrupt_response``), streaming input
prefills the turn while it is spoken and a pause starts the reply speculatively, all under the server's
admission bound, budgets and timeouts. Its :class:`~omnistage.entrypoints.openai.realtime.transport.Transport`
is a :class:`Bridge`: the backend writes GA client events into it, and the GA server events it is given are
translated into :class:`~omnistage.entrypoints.openai.live.backend.LiveOutput` (audio and transcript deltas,
interruptions, errors); the rest (item and response lifecycles) has no GPT-Live counterpart and is dropped.

Input transcription is on: the thinker writes each committed turn down (``session.input_transcript.delta``).
Hops over the realtime path: one per event each way (a dict translated in ``_translate``, a queue to the
Live session's pump); a reply's audio keeps its base64 (a 16 kHz session's is resampled in ``speaker.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from omnistage.entrypoints.openai.live.backend import (
    AudioOut,
    ContextUsed,
    Ended,
    Failed,
    Interrupted,
    LiveOutput,
    TranscriptOut,
    until_ended,
)
from omnistage.entrypoints.openai.live.events import ContextKind, InitialMessage, StartConfig
from omnistage.entrypoints.openai.realtime.event_error import EventError
from omnistage.entrypoints.openai.realtime.service import RealtimeService
from omnistage.entrypoints.openai.realtime.session_loop import RealtimeSession
from omnistage.entrypoints.openai.realtime.transport import NORMAL_CLOSURE, ClientAudio, ClientEvent, Incoming

START_BARRIER = "live_start_barrier"  # the event id of the clear that ends the startup events
QUEUED_EVENTS = 64  # client events waiting for the realtime session: past it the client's reads wait (backpressure)
START_TIMEOUT_S = 30.0  # the startup events are settings and items: a session stuck longer is broken
# Errors that precede the realtime session closing on its own, and why it closes.
ENDINGS = {"idle_timeout": "expired", "server_shutting_down": "connection_lost"}
_TRANSCRIPTS = {"response.output_audio_transcript.delta": "assistant",
                "conversation.item.input_audio_transcription.delta": "user"}


class Bridge:
    """The realtime session's transport: client events from the backend, server events to a callback."""

    def __init__(self, on_event: Callable[[dict[str, Any]], Awaitable[None]],
                 on_close: Callable[[], None]) -> None:
        self.incoming: asyncio.Queue[Incoming | None] = asyncio.Queue(QUEUED_EVENTS)
        self._on_event, self._on_close = on_event, on_close
        self.ended = False

    async def send(self, event: dict[str, Any]) -> None:
        await self._on_event(event)

    async def receive(self) -> Incoming | None:
        return await self.incoming.get()

    async def close(self, reason: str, code: int = NORMAL_CLOSURE) -> None:
        self._on_close()

    async def put(self, event: Incoming | dict[str, Any]) -> None:
        if self.ended:
            return  # nobody reads any more: a put must not wait for ever
        await self.incoming.put(event if isinstance(event, ClientAudio) else ClientEvent(json.dumps(event)))

    def end(self) -> None:
        """The session's last message: what still waits is dropped, the read loop ends (and a waiting put goes)."""
        self.ended = True
        while not self.incoming.empty():
            self.incoming.get_nowait()
        self.incoming.put_nowait(None)


class TurnBackend:
    def __init__(self, service: RealtimeService) -> None:
        self.service = service
        self._out: asyncio.Queue[LiveOutput] = asyncio.Queue()
        self.bridge = Bridge(self._translate, self._closed)
        self.session = RealtimeSession(self.bridge, service)
        self._task: asyncio.Task[None] | None = None
        self._starting: asyncio.Future[None] | None = None
        self._start_errors: list[EventError] = []
        self._ending: EventError | None = None
        self._ended = False

    # -- the backend's interface -----------------------------------------------------------------
    async def start(self, config: StartConfig) -> list[EventError]:
        self._starting = asyncio.get_running_loop().create_future()
        self._task = asyncio.create_task(self._run())
        await self.bridge.put(_session_update(config, self.service.engine.model_name))
        for message in config.input:
            await self.bridge.put(_item(_ga_role(message), message.text, None, assistant=message.role == "assistant"))
        await self.bridge.put({"type": "input_audio_buffer.clear", "event_id": START_BARRIER})
        try:
            async with asyncio.timeout(START_TIMEOUT_S):
                await asyncio.shield(self._starting)
        except TimeoutError:
            self._start_errors.append(EventError("session_start_timeout", "the session did not start in time",
                                                 error_type="server_error"))
        self._starting = None
        return self._start_errors

    async def hear(self, audio: str | ClientAudio, event_id: str | None = None) -> None:
        await self.bridge.put(audio if isinstance(audio, ClientAudio) else
                              {"type": "input_audio_buffer.append", "audio": audio, "event_id": event_id})

    async def append(self, kind: ContextKind, text: str, event_id: str | None) -> None:
        # Each kind is a developer turn in the conversation; commentary (what to say or do now, the client's words
        # as they are: clients write it as an instruction) also gets a reply of its own, refused while one runs.
        await self.bridge.put(_item("system", text, event_id))
        if kind == "commentary":
            await self.bridge.put({"type": "response.create", "event_id": event_id})

    def outputs(self) -> AsyncIterator[LiveOutput]:
        return until_ended(self._out)

    async def close(self) -> None:
        self._ended = True  # the session ends because it was asked to: nothing more goes out
        self.bridge.end()
        if self._task is not None:
            with contextlib.suppress(Exception):
                await self._task

    # -- the realtime session's side -------------------------------------------------------------
    async def _run(self) -> None:
        try:
            await self.session.run()
        finally:
            self._closed()

    def _closed(self) -> None:
        self.bridge.end()  # the realtime session has stopped reading
        if self._starting is not None and not self._starting.done():
            self._starting.set_result(None)
        if not self._ended:
            self._ended = True
            error = self._ending
            reason = ENDINGS.get(error.code, "connection_lost") if error is not None else "connection_lost"
            self._out.put_nowait(Ended(reason, error))  # type: ignore[arg-type] - ENDINGS' values

    async def _translate(self, event: dict[str, Any]) -> None:
        kind = event["type"]
        if self._starting is not None:  # the startup events: their errors refuse the start
            self._starting_event(event)
            return
        out = _output(event)
        if isinstance(out, Failed) and out.error.code in ENDINGS:
            self._ending = out.error  # said with the session's end
        elif out is not None and not self._ended:
            self._out.put_nowait(out)
        elif kind == "response.done":
            self._usage(event["response"])

    def _starting_event(self, event: dict[str, Any]) -> None:
        if event["type"] == "error":
            self._start_errors.append(_error(event["error"]))
        elif event["type"] == "input_audio_buffer.cleared" and self._starting is not None:
            self._starting.set_result(None)

    def _usage(self, response: dict[str, Any]) -> None:
        usage, limit = response.get("usage") or {}, self.service.engine.max_model_len
        if usage.get("input_tokens") and limit and not self._ended:
            self._out.put_nowait(ContextUsed(min(1.0, usage["input_tokens"] / limit)))


def _output(event: dict[str, Any]) -> LiveOutput | None:
    kind = event["type"]
    if kind == "response.output_audio.delta":
        return AudioOut(event["delta"])
    if kind in _TRANSCRIPTS and event.get("delta"):
        return TranscriptOut(_TRANSCRIPTS[kind], event["delta"])  # type: ignore[arg-type] - its two roles
    if kind == "input_audio_buffer.speech_started":
        return Interrupted()
    if kind == "error":
        return Failed(_error(event["error"]))
    if kind == "response.done" and event["response"].get("status") == "failed":
        details = (event["response"].get("status_details") or {}).get("error") or {}
        return Failed(EventError(details.get("code") or "response_failed",
                                 details.get("message") or "the reply failed", error_type="server_error"))
    return None


def _error(error: dict[str, Any]) -> EventError:
    return EventError(error.get("code") or "error", error.get("message") or "", error.get("param"),
                      error.get("event_id"), error.get("type") or "invalid_request_error")


def _ga_role(message: InitialMessage) -> str:
    return "system" if message.role == "developer" else message.role


def _item(role: str, text: str, event_id: str | None, assistant: bool = False) -> dict[str, Any]:
    part = {"type": "output_text" if assistant else "input_text", "text": text}
    return {"type": "conversation.item.create", "event_id": event_id,
            "item": {"type": "message", "role": role, "content": [part]}}


def _session_update(config: StartConfig, model: str) -> dict[str, Any]:
    """The realtime session's settings for a GPT-Live session: spoken replies, server VAD that answers each
    turn and is interrupted by speech, input transcription, the Live format in (pcm16 out at 24 kHz: the front
    resamples to a 16 kHz session's rate)."""
    output = config.audio.ga() if config.audio.kind != "pcm16" else {"type": "audio/pcm", "rate": 24000}
    detection = {"type": "server_vad", "create_response": True, "interrupt_response": True}
    session: dict[str, Any] = {
        "type": "realtime", "output_modalities": ["audio"],
        "audio": {"input": {"format": config.audio.ga(), "turn_detection": detection,
                            "transcription": {"model": model}},
                  "output": {"format": output, "voice": config.voice_name}}}
    if config.instructions:
        session["instructions"] = config.instructions
    return {"type": "session.update", "session": session}
