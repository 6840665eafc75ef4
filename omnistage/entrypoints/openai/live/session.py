"""One GPT-Live session: OpenAI's Live protocol spoken to the client, a :class:`LiveBackend` behind it.

On a WebSocket the client sends ``session.start`` first (anything else is refused until then, and a refused start
may be sent again); a WebRTC call starts with its creation. ``session.started`` carries the session's snapshot.
Then: audio in (``session.input_audio.append``, or the call's microphone track), muted as silence so the backend's
clock keeps running; ``session.{instructions,thinking,commentary}.append`` acknowledged on the session's
timeline; ``session.update`` for what may change (delegation settings of the same type). Out: the reply's audio
(``session.output_audio.delta``, or the call's reply track), both speakers' transcript deltas, usage after each
reply, errors in OpenAI's shape (``client_event_id`` names the command). It ends with ``session.closed``
(``close_requested``; ``expired`` past the session's life or when idle; ``connection_lost`` when the server
stops), its final snapshot and usage, then the connection closes.

This server's models answer every turn themselves: a ``delegation`` is accepted and echoed, and an ``info``
event says no task will be delegated; Decisions, Responses and audio-fixture commands are refused with an error
saying so.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from omnistage.entrypoints.openai.common.errors import no_such_model, scrub_reprs
from omnistage.entrypoints.openai.live.backend import (
    AudioOut,
    ContextUsed,
    Ended,
    Failed,
    Interrupted,
    LiveBackend,
    LiveOutput,
    TranscriptOut,
)
from omnistage.entrypoints.openai.live.events import (
    AppendAudio,
    AppendContext,
    Close,
    Command,
    Mute,
    Start,
    StartConfig,
    Unsupported,
    Update,
    parse_command,
)
from omnistage.entrypoints.openai.live.key_settings import keyed
from omnistage.entrypoints.openai.live.speaker import SocketSpeaker, Speaker, TrackSpeaker
from omnistage.entrypoints.openai.realtime.event_error import EventError
from omnistage.entrypoints.openai.realtime.event_rate import EventRate
from omnistage.entrypoints.openai.realtime.protocol import new_id, server_event
from omnistage.entrypoints.openai.realtime.service import RealtimeService
from omnistage.entrypoints.openai.realtime.transport import GOING_AWAY, NORMAL_CLOSURE, ClientAudio, Transport
from omnistage.entrypoints.openai.webrtc.tracks import ReplyTrack

logger = logging.getLogger(__name__)
MAX_SESSION_S = 3600  # a Live session's life (OpenAI's sessions last an hour): then it closes as "expired"
SILENCE = {"pcm16": 0x00, "pcmu": 0xFF, "pcma": 0xD5}  # a muted byte of each format


class LiveSession:
    def __init__(self, transport: Transport, service: RealtimeService, backend: Callable[[], LiveBackend],
                 track: ReplyTrack | None = None, session_id: str | None = None,
                 preset: StartConfig | None = None, key_session: dict[str, Any] | None = None) -> None:
        """``backend``: makes the engine side for each start; ``track``: a WebRTC call's reply track (audio goes
        there instead of events); ``preset``: a WebRTC call's session, started at once (else the client's
        ``session.start``); ``key_session``: the settings of the ephemeral key that opened it (``key_settings.py``)."""
        self.preset, self.key_session = preset, key_session
        self.transport, self.service, self._make_backend, self._track = transport, service, backend, track
        self.id = session_id or new_id("sess")
        self.config: StartConfig | None = None
        self.backend: LiveBackend | None = None
        self.speaker: Speaker | None = None
        self.muted = False
        self.rate = EventRate(service.limits.realtime_events_per_second)
        self._t0 = 0.0
        self._ended = asyncio.Event()
        self._send_lock = asyncio.Lock()
        self._tasks: list[asyncio.Task[None]] = []
        self._closing = False

    # -- clock and sending -----------------------------------------------------------------------
    def _ms(self) -> int:
        return int((time.monotonic() - self._t0) * 1000)

    def _usage(self) -> dict[str, Any]:
        return {"seconds": float(int(time.monotonic() - self._t0))}

    def _snapshot(self) -> dict[str, Any]:
        assert self.config is not None
        return self.config.describe(self.id, int(time.time() - (time.monotonic() - self._t0)) + MAX_SESSION_S)

    async def send(self, event: dict[str, Any]) -> None:
        async with self._send_lock:
            if self._ended.is_set() and event["type"] != "session.closed":
                return
            try:
                async with asyncio.timeout(self.service.limits.send_timeout):
                    await self.transport.send(event)
            except (TimeoutError, ConnectionError):
                self._ended.set()  # the client stopped reading or left: nothing more can reach it

    async def fail(self, exc: EventError) -> None:
        eid = exc.event_id
        error = {"type": exc.error_type, "code": exc.code, "message": scrub_reprs(str(exc)), "param": exc.param,
                 "client_event_id": eid}
        await self.send(server_event("error", error=error, client_event_id=eid))

    # -- the session's life ----------------------------------------------------------------------
    def take_place(self) -> None:
        """Nothing to take: a duplex engine's room is checked before the call's offer is answered (``route.py``)."""

    async def run(self) -> None:
        try:
            started = await self._start(self.preset, None) if self.preset is not None else await self._await_start()
            if started:
                await self._serve()
        finally:
            await self._finish("connection_lost")

    async def _await_start(self) -> bool:
        while True:
            try:
                async with asyncio.timeout(self.service.limits.ws_idle_timeout):
                    message = await self._next()
            except TimeoutError:
                await self.fail(EventError("idle_timeout", "no session.start came; closing"))
                return False
            if message is None or self._ended.is_set():
                return False
            try:
                command = self._command(message)
                if isinstance(command, Close):
                    return False
                if not isinstance(command, Start):
                    raise EventError("session_not_started", "send session.start and wait for session.started first",
                                     "type", getattr(command, "event_id", None))
                if await self._start(command.config, command.event_id):
                    return True
            except EventError as exc:
                await self.fail(exc)

    async def _start(self, config: StartConfig, eid: str | None) -> bool:
        try:
            config = keyed(config, self.key_session)
        except EventError as exc:
            exc.event_id = eid
            raise
        if config.model not in self.service.served.names:
            raise EventError("model_not_found", no_such_model(config.model), "session.model", eid)
        backend = self._make_backend()
        errors = await backend.start(config)
        if errors:
            await backend.close()
            for error in errors:
                error.event_id = error.event_id or eid
                await self.fail(error)
            return False
        self.config, self.backend, self._t0 = config, backend, time.monotonic()
        self.speaker = TrackSpeaker(self._track, config.audio) if self._track is not None else \
            SocketSpeaker(self.send, config.audio)
        await self.send(server_event("session.started", session=self._snapshot(), client_event_id=eid))
        if config.delegation is not None:
            await self.send(server_event("info", code="delegation_unavailable", message=self._no_delegation()))
        self._tasks = [asyncio.create_task(self._pump(backend)), asyncio.create_task(self._expire())]
        return True

    def _no_delegation(self) -> str:
        return (f"delegation is accepted, but {self.service.engine.model_name} answers every turn itself: no task "
                "will be delegated, and no Responses or Decisions backend runs")

    async def _serve(self) -> None:
        while not self._ended.is_set():
            message = await self._next()
            if message is None:
                return
            try:
                await self._handle(message)
            except EventError as exc:
                await self.fail(exc)
            await asyncio.sleep(0)  # a flood of queued events must not hold the event loop

    async def _next(self) -> ClientAudio | str | bytes | None:
        """The client's next message, None once it has left or the session has ended."""
        receive = asyncio.ensure_future(self.transport.receive())
        ended = asyncio.ensure_future(self._ended.wait())
        await asyncio.wait({receive, ended}, return_when=asyncio.FIRST_COMPLETED)
        ended.cancel()
        if not receive.done():
            receive.cancel()
            return None
        try:
            message = receive.result()
        except (RuntimeError, OSError):  # read after the socket closed
            return None
        if message is None or isinstance(message, ClientAudio):
            return message
        return message.raw

    def _command(self, raw: str | bytes) -> Command:
        try:
            command = parse_command(raw)
        except EventError:
            raise
        except (AttributeError, TypeError, KeyError, IndexError, ValueError) as exc:
            # A shape the readers did not foresee: the client hears it was malformed, the session reads on.
            logger.warning("live session %s: unreadable client event (%s)", self.id, type(exc).__name__)
            raise EventError("invalid_event", "the event is malformed: see the Live API's shape for its type") \
                from None
        if not isinstance(command, AppendAudio) and not self.rate.take():
            raise EventError("rate_limit_exceeded", f"more than {self.rate.per_second:g} events a second "
                             "(--realtime-events-per-second): this one was not acted on",
                             event_id=getattr(command, "event_id", None))
        return command

    async def _finish(self, reason: str, error: EventError | None = None, eid: str | None = None) -> None:
        """Ends the session once: the backend stopped, then ``session.closed`` and the connection's close."""
        if self._closing:
            return
        self._closing = True
        for task in self._tasks:
            if task is not asyncio.current_task():
                task.cancel()
        if self.backend is not None:
            await self.backend.close()
        if error is not None:
            await self.fail(error)
        if self.config is not None:
            await self.send(server_event("session.closed", reason=reason, session=self._snapshot(),
                                         usage=self._usage(), client_event_id=eid))
        self._ended.set()
        code = GOING_AWAY if error is not None and error.code == "server_shutting_down" else NORMAL_CLOSURE
        with contextlib.suppress(Exception):
            await self.transport.close(reason, code)

    async def _expire(self) -> None:
        await asyncio.sleep(MAX_SESSION_S)
        await self._finish("expired")

    # -- what the client sends -------------------------------------------------------------------
    async def _handle(self, message: ClientAudio | str | bytes) -> None:
        assert self.backend is not None
        if isinstance(message, ClientAudio):
            samples = message.samples * 0 if self.muted else message.samples
            await self.backend.hear(ClientAudio(samples, message.rate))
            return
        command = self._command(message)
        if isinstance(command, AppendAudio):
            await self.backend.hear(self._silenced(command) if self.muted else command.audio, command.event_id)
        elif isinstance(command, Mute):
            self.muted = command.muted
            kind = "session.input_audio.muted" if command.muted else "session.input_audio.unmuted"
            await self.send(server_event(kind, client_event_id=command.event_id))
        elif isinstance(command, AppendContext):
            await self._append(command)
        elif isinstance(command, Update):
            await self._update(command)
        elif isinstance(command, Close):
            await self._finish("close_requested", eid=command.event_id)
        elif isinstance(command, Start):
            raise EventError("session_already_started", "the session has started; its settings are immutable",
                             "type", command.event_id)
        elif isinstance(command, Unsupported):
            raise EventError("unsupported_feature", f"{command.kind}: {command.feature} is not served here; "
                             f"{self._no_delegation()}", "type", command.event_id)

    def _silenced(self, command: AppendAudio) -> str:
        try:
            size = len(base64.b64decode(command.audio, validate=True))
        except (binascii.Error, ValueError) as exc:
            raise EventError("invalid_audio", "'audio' is not valid base64", "audio", command.event_id) from exc
        assert self.config is not None
        return base64.b64encode(bytes([SILENCE[self.config.audio.kind]]) * size).decode("ascii")

    async def _append(self, command: AppendContext) -> None:
        assert self.backend is not None
        if command.delegation_id is not None:
            raise EventError("invalid_value", f"no delegation {command.delegation_id!r}: "
                             f"{self._no_delegation()}", "delegation_id", command.event_id)
        limit = self.service.limits.max_instructions_chars
        if len(command.content) > limit:
            raise EventError("input_too_long", f"content is {len(command.content)} characters; the limit is {limit} "
                             "(--max-instructions-chars)", "content", command.event_id)
        await self.backend.append(command.kind, command.content, command.event_id)
        now = self._ms()
        await self.send(server_event(f"session.{command.kind}.appended", start_ms=now, end_ms=now,
                                     client_event_id=command.event_id))

    async def _update(self, command: Update) -> None:
        assert self.config is not None
        if command.has_triggers:
            raise EventError("unsupported_feature", "triggers run Decisions, which this server does not serve",
                             "session.triggers", command.event_id)
        if command.delegation is not None:
            kind = command.delegation.get("type")
            if kind != self.config.delegation:
                raise EventError("invalid_value", f"the delegation type cannot change (it is "
                                 f"{self.config.delegation!r})", "session.delegation.type", command.event_id)
            raw = {**(self.config.delegation_raw or {}), **command.delegation}
            self.config = replace(self.config, delegation_raw=raw)
        await self.send(server_event("session.updated", session=self._snapshot(), client_event_id=command.event_id))

    # -- what the backend says -------------------------------------------------------------------
    async def _pump(self, backend: LiveBackend) -> None:
        async for out in backend.outputs():
            if isinstance(out, Ended):
                await self._finish(out.reason, out.error)
                return
            await self._emit(out)

    async def _emit(self, out: LiveOutput) -> None:
        assert self.speaker is not None
        if isinstance(out, AudioOut):
            await self.speaker.play(out.delta)
        elif isinstance(out, TranscriptOut):
            kind = "session.output_transcript.delta" if out.role == "assistant" else "session.input_transcript.delta"
            now = self._ms()
            await self.send(server_event(kind, delta=out.text, start_ms=now, end_ms=now))
        elif isinstance(out, Interrupted):
            self.speaker.interrupt()
        elif isinstance(out, ContextUsed):
            await self.send(server_event("session.usage.updated", usage=self._usage(),
                                         context_window={"usage_ratio": out.ratio}))
        elif isinstance(out, Failed):
            await self.fail(out.error)
