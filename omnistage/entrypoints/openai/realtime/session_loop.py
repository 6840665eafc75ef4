"""OpenAI Realtime (GA) voice sessions, the beta protocol too, over a WebSocket (``WS /v1/realtime``) or WebRTC.

The session reads and writes through a ``Transport`` (``transport.py``): the
WebSocket's JSON messages, or a WebRTC call's data channel and tracks
(``entrypoints/openai/webrtc/``), whose microphone audio enters the input
buffer as an ``input_audio_buffer.append`` would.

A session holds its settings (``session.py``), an input audio buffer
(PCM16 at 16/24 kHz or G.711 at 8 kHz), and the conversation's items. Server VAD
(OpenAI's default; Silero VAD in a small thread pool, or the energy detector)
watches the buffer (``session_audio.py``): speech start and stop are reported with
the id the committed user item will have, and the end of a turn commits it and
starts a response. ``response.create`` renders the items with the chat template
(tools included) and streams the answer (``response.py``); a tool call
becomes a ``function_call`` item, answered by the client's
``function_call_output`` and a new ``response.create``.

With input transcription on (``audio.input.transcription``), each committed user
audio item is transcribed by the thinker itself (a text-only request asking it to
write down the audio), streamed as ``conversation.item.input_audio_transcription``
events. ``response.cancel``, ``output_audio_buffer.clear`` or speech starting
while a response runs (``interrupt_response``) cancel the response: its engine
request is aborted in every stage before ``response.done`` says ``cancelled`` (reason
``turn_detected`` for speech, else ``client_cancelled``);
``conversation.item.truncate`` then cuts the assistant's item at what was played.
Every response runs under the server's admission bound and ``--request-timeout``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, Callable
from contextlib import aclosing
from typing import Any

from omnistage.core import OmniOutput, OmniRequest
from omnistage.entrypoints.openai.common.admission import Overloaded, Ticket
from omnistage.entrypoints.openai.common.served_model import audio_rate
from omnistage.entrypoints.openai.common.streaming import engine_outputs
from omnistage.entrypoints.openai.common.tool_calls import ToolSetup
from omnistage.entrypoints.openai.realtime.beta import to_beta
from omnistage.entrypoints.openai.realtime.conversation import InputBuffer
from omnistage.entrypoints.openai.realtime.event_rate import EventRate
from omnistage.entrypoints.openai.realtime.idle_timeout import IdleTimeout
from omnistage.entrypoints.openai.realtime.items import Item, decoded
from omnistage.entrypoints.openai.realtime.listening import Listener
from omnistage.entrypoints.openai.realtime.live_transcript import LiveTranscript
from omnistage.entrypoints.openai.realtime.protocol import (
    CONVERSATION_EVENTS,
    EventError,
    ResponseOptions,
    error_event,
    event_id,
    new_id,
    parse_event,
    response_options,
    server_event,
)
from omnistage.entrypoints.openai.realtime.response import CancelReason, ResponseWriter
from omnistage.entrypoints.openai.realtime.service import RealtimeService
from omnistage.entrypoints.openai.realtime.session import SessionState, check_output
from omnistage.entrypoints.openai.realtime.session_audio import SessionAudio
from omnistage.entrypoints.openai.realtime.speculation import Speculation
from omnistage.entrypoints.openai.realtime.transcribe import transcribe
from omnistage.entrypoints.openai.realtime.transport import (
    GOING_AWAY,
    TRY_AGAIN_LATER,
    ClientAudio,
    Incoming,
    Transport,
)
from omnistage.entrypoints.openai.realtime.turn_request import TurnRequests
from omnistage.entrypoints.openai.realtime.vllm_omni import VllmOmniDialect
from omnistage.entrypoints.openai.realtime.vllm_omni import detect as detect_vllm_omni

logger = logging.getLogger(__name__)


class RealtimeSession(SessionAudio):
    def __init__(self, transport: Transport, service: RealtimeService, beta: bool = False, kind: str = "realtime",
                 settings: dict[str, Any] | None = None) -> None:
        """``kind``: "transcription" for a transcription session (``?intent=transcription``). ``settings``: the
        session object of the ephemeral key that opened it, applied before ``session.created``."""
        self.transport, self.service, self.settings = transport, service, settings
        self.engine, self.limits = service.engine, service.limits
        self.id = new_id("sess")
        self.meter = service.budget.meter()  # this session's share of the server's realtime bounds (budget.py)
        self.state = SessionState(self.engine, service.served.voices, self.limits, beta, kind, self.meter,
                                  semantic_vad=service.vad.turn is not None)
        self.buffer = InputBuffer(self.state.config.input_format, self.limits.max_audio_seconds, self.meter)
        self.vad = self._make_vad()
        self.speech_start, self.speech_item = 0, ""
        self.response: asyncio.Task[None] | None = None
        self.writer: ResponseWriter | None = None  # the events of the latest response
        self.side_tasks: set[asyncio.Task[None]] = set()  # input transcriptions
        self._send_lock = asyncio.Lock()
        self.closed = False
        self._reader: asyncio.Task[Any] | None = None  # the read loop's task, while it waits for a message
        self.dialect: VllmOmniDialect | None = None  # vLLM-Omni's protocol, translated (realtime/vllm_omni.py)
        self.requests = TurnRequests(self.engine, self.limits, service.pool, self.state, service.first_chunk_frames)
        self.listener = Listener(self.engine, service.pool, self.requests.prefill)
        self.speculation: Speculation | None = None
        self.live = LiveTranscript(self)  # the turn written down while it is spoken (live_transcript.py)
        self.idle = IdleTimeout()  # server_vad's idle_timeout_ms
        self.rate = EventRate(self.limits.realtime_events_per_second)  # client events acted on (event_rate.py)

    @property
    def config(self):  # noqa: ANN201 - SessionConfig
        return self.state.config

    # -- sending ---------------------------------------------------------------------------------
    async def send(self, event: dict[str, Any]) -> None:
        for out in self.dialect.outgoing(event) if self.dialect is not None else (event,):
            await self._send_one(out)

    async def _send_one(self, event: dict[str, Any]) -> None:
        if self.state.beta:
            beta = to_beta(event)
            if beta is None:
                return
            event = beta
        async with self._send_lock:
            if self.closed:
                return
            try:
                async with asyncio.timeout(self.limits.send_timeout):
                    await self.transport.send(event)
            except TimeoutError:
                # The client stopped reading: end the session rather than buffer for it or hold its place.
                logger.warning("realtime session %s: the client read nothing for %g s (--send-timeout); closing",
                               self.id, self.limits.send_timeout)
                self._end_session()
            except ConnectionError:
                self.closed = True  # the client left; the read loop ends the session

    def _end_session(self) -> None:
        self.closed = True
        if self._reader is not None and self._reader is not asyncio.current_task():
            self._reader.cancel()  # wakes the read loop from its wait (see _receive)

    async def fail(self, exc: EventError) -> None:
        await self.send(error_event(exc))

    def _describe(self) -> dict[str, Any]:
        described = self.config.describe(self.id, self.engine.model_name, self.state.beta)
        if self.config.kind == "realtime" and not self.state.beta:  # omnistage's own settings, as in effect
            described |= {"streaming_input": self._streams_input, "speculative_reply_ms": self._speculative_reply_ms}
        return described

    # -- the read loop ---------------------------------------------------------------------------
    def take_place(self) -> None:
        """Takes this session's place among those the server holds (EventError past --max-realtime-sessions), once:
        a WebRTC call's session before its offer is answered (``webrtc/calls.py``), a WebSocket's as it runs."""
        if not self.meter.opened:
            self.meter.open()

    async def run(self) -> None:
        try:
            self.take_place()
        except EventError as exc:  # the server holds as many sessions as it may: the client hears why, and that
            await self.fail(exc)  # a later try may succeed (1013), not that all went well (1000)
            await self.transport.close("too many sessions", code=TRY_AGAIN_LATER)
            return
        self.service.sessions.add(self)
        try:
            await self._run()
        finally:
            self.meter.close()
            self.service.sessions.discard(self)

    async def shut_down(self) -> None:
        """The server stops: the running response finishes, then the client hears why and the session ends (a
        WebSocket's close code 1001, going away)."""
        if self.response is not None and not self.response.done():
            await asyncio.wait([self.response])
        if not self.closed:
            await self.fail(EventError("server_shutting_down", "the server is shutting down; reconnect to go on",
                                       error_type="server_error"))
            self._end_session()
            await self.transport.close("server shutting down", code=GOING_AWAY)

    async def _run(self) -> None:
        errors = self._apply({"type": "session.update", "session": self.settings}) if self.settings else []
        await self.send(server_event("session.created", session=self._describe()))
        for error in errors:  # checked when the key was minted: only a server changed since then gets here
            await self.fail(error)
        try:
            while not self.closed:
                message = await self._receive()
                if message is None:
                    break
                await self._serve(message)
                # Queued events never suspend the read: without this, a flood of them held the event loop (and
                # every other session and request) until the last was handled.
                await asyncio.sleep(0)
        finally:
            self.closed = True
            await self.idle.close()
            await self.listener.close()
            self.live.discard()
            if self.speculation is not None:
                await self.speculation.close()
            await self._cancel_response()
            for task in list(self.side_tasks):
                task.cancel()

    async def _serve(self, message: Incoming) -> None:
        """One client message acted on, or answered with the ``error`` event saying why not."""
        event: dict[str, Any] = {}
        try:
            if isinstance(message, ClientAudio):
                await self._hear(message)
                return
            event = parse_event(message.raw)
            if not self.rate.take():
                raise EventError("rate_limit_exceeded", f"more than {self.rate.per_second:g} events a second "
                                 "(--realtime-events-per-second): this one was not acted on")
            self.dialect = self.dialect or detect_vllm_omni(event, self.service.served)
            for each in self.dialect.incoming(event) if self.dialect is not None else (event,):
                await self.handle(each)
        except EventError as exc:
            exc.event_id = exc.event_id or event_id(event)
            await self.fail(exc)

    async def _receive(self) -> Incoming | None:
        """The next client message; None when the session ends first: idle past ``--ws-idle-timeout`` with no
        response running, or ended by ``_end_session`` while waiting."""
        self._reader = asyncio.current_task()
        try:
            while True:
                try:
                    async with asyncio.timeout(self.limits.ws_idle_timeout):
                        return await self.transport.receive()
                except TimeoutError:
                    if self.response is None or self.response.done():
                        await self._close_idle()
                        return None
        except asyncio.CancelledError:
            if not self.closed:
                raise
            asyncio.current_task().uncancel()  # our own wake-up, not the server's cancellation
            return None
        finally:
            self._reader = None

    async def _close_idle(self) -> None:
        await self.fail(EventError("idle_timeout", f"no event for {self.limits.ws_idle_timeout:g} s "
                                                   "(--ws-idle-timeout); closing the session"))
        self.closed = True
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.limits.send_timeout):
                await self.transport.close("idle timeout")

    async def handle(self, event: dict[str, Any]) -> None:
        kind = event["type"]
        if kind != "input_audio_buffer.append":
            self._drop_speculation()  # a speculative reply answers the session as it was at the pause
        if self.config.kind == "transcription" and kind in CONVERSATION_EVENTS:
            raise EventError("invalid_event", f"a transcription session only writes down its input audio: "
                             f"{kind} has nothing to act on", "type")
        if kind == "session.update":
            await self._update(event)
        elif kind == "input_audio_buffer.append":
            await self._append(event)
        elif kind == "input_audio_buffer.commit":
            await self._commit(None)
        elif kind == "input_audio_buffer.clear":
            self.buffer.clear()
            self._reset_vad()
            self.listener.discard()
            await self.send(server_event("input_audio_buffer.cleared"))
        elif kind == "conversation.item.create":
            parsed = self.state.parse_item(event)
            (item,) = await decoded([parsed], self.config.input_format, self.service.pool, self.limits)
            for out in self.state.item_events(item, self.state.add_item(item, event)):
                await self.send(out)
        elif kind == "conversation.item.retrieve":
            await self.send(self.state.retrieve(event))
        elif kind == "conversation.item.truncate":
            await self.send(self.state.truncate(event))
        elif kind == "conversation.item.delete":
            await self.send(self.state.delete(event))
        elif kind == "response.create":
            await self._start_response(response_options(self.config, event), event_id(event))
        elif kind == "response.cancel":
            if self.response is None or self.response.done():
                raise EventError("response_cancel_not_active", "there is no active response to cancel")
            await self._cancel_response()
        elif kind == "output_audio_buffer.clear":
            writer = self.writer
            await self._cancel_response()
            # The SDK's event needs a string id: the latest response's (whose audio was cut), or "" before any.
            await self.send(server_event("output_audio_buffer.cleared", response_id=writer.id if writer else ""))

    # -- session and audio -----------------------------------------------------------------------
    async def _update(self, event: dict[str, Any]) -> None:
        for error in self._apply(event):
            await self.fail(error)
        await self.send(server_event("session.updated", session=self._describe()))

    def _apply(self, event: dict[str, Any]) -> list[EventError]:
        detection = self.config.turn_detection
        errors = self.state.update(event, buffered=self.buffer.samples > 0)
        if self.config.turn_detection != detection:
            self.idle.cancel()  # idle_timeout_ms changed or gone: the next reply's end arms it anew
        if self.buffer.format != self.config.input_format:
            self.buffer = InputBuffer(self.config.input_format, self.limits.max_audio_seconds, self.meter)
        self._reset_vad(rebuild=True)
        return errors

    async def _commit(self, item_id: str | None, start: int = 0, heard: Item | None = None) -> None:
        """Commits the buffer from ``start`` as a user item; ``heard``: the item a speculative reply answers,
        committed as it is (the buffer's audio after it, silence, dropped)."""
        if heard is not None:
            self.buffer.clear()
            item = heard
        elif self.buffer.samples == 0:
            raise EventError("input_audio_buffer_commit_empty", "the input audio buffer is empty")
        else:
            audio = await self.buffer.take_in(self.service.pool, start)  # resampling off the event loop
            item = Item(item_id or new_id("item"), "message", role="user", audio=audio,
                        listened=self.listener.take(audio))
        opening = await self.live.finish(item.id)  # what was sent of it while it was spoken
        self._reset_vad()
        if self.config.kind == "transcription":  # no conversation: the item lives as long as its transcription
            await self.send(server_event("input_audio_buffer.committed", item_id=item.id, previous_item_id=None))
        else:
            previous = self.state.conversation.add(item)
            await self.send(server_event("input_audio_buffer.committed", item_id=item.id, previous_item_id=previous))
            for out in self.state.item_events(item, previous):
                await self.send(out)
        if self.config.transcribes:
            task = asyncio.create_task(transcribe(self, item, opening))
            self.side_tasks.add(task)
            task.add_done_callback(self.side_tasks.discard)

    # -- responses -------------------------------------------------------------------------------
    async def _start_response(self, options: ResponseOptions, eid: str | None,
                              speculation: Speculation | None = None) -> None:
        """Starts a response; ``speculation``: the turn's speculative reply, used when it answers these options and
        this conversation (else cancelled, and the response built here)."""
        if self.response is not None and not self.response.done():
            raise EventError("conversation_already_has_active_response",
                             "a response is in progress; cancel it or wait for response.done", event_id=eid)
        check_output(self.engine, self.state.voices, options.output_modalities, self.config.voice, "response", eid)
        if len(options.instructions) > self.limits.max_instructions_chars:
            raise EventError("input_too_long", f"instructions are {len(options.instructions)} characters; the limit "
                             f"is {self.limits.max_instructions_chars} (--max-instructions-chars)",
                             "response.instructions", eid)
        items = await self.requests.items(options)
        if not items and not options.instructions:
            raise EventError("conversation_empty", "nothing to respond to: commit audio or create an item first",
                             event_id=eid)
        tools = TurnRequests.tools(options)
        self.idle.cancel()
        turn = None if speculation is None else speculation.turn
        if turn is not None and turn.answers(options, items):
            self.requests.drop(options, turn.dropped)
            request, ticket, outputs = turn.request, speculation.ticket, speculation.outputs()
        else:
            if speculation is not None:
                speculation.cancel()
            request, ticket = await self._build_response(options, items, tools, eid)
            outputs = engine_outputs(self.engine, request, timeout_s=self.limits.request_timeout, ticket=ticket)
        conversation = self.state.conversation if options.in_conversation else None
        self.writer = ResponseWriter(self.send, self.id, self.config.voice, request, options,
                                     self.config.output_format, conversation, tools.parser(), audio_rate(self.engine))
        self.response = asyncio.create_task(self._respond(self.writer, outputs))
        stopped = self.service.speculation_gate.playing(self.writer)  # its headroom gates others' speculation
        # Released however the task ends, even when cancelled before it ever ran (barge-in right away), and a
        # speculative request that never got read is aborted then.
        self.response.add_done_callback(lambda _: _ended(ticket, speculation, stopped))

    async def _build_response(self, options: ResponseOptions, items: tuple[Item, ...], tools: ToolSetup,
                              eid: str | None) -> tuple[OmniRequest, Ticket]:
        ticket = self.admit(eid)  # before the prompt is built: that work runs in the bounded pool
        try:
            await self.listener.settle()  # the committed turn's prefill in flight: the prompt extends it
            return await self.requests.response(options, items, tools, eid), ticket
        except BaseException:
            ticket.release()
            raise

    def admit(self, event_id: str | None) -> Ticket:
        """A place under the server's bound shared with every endpoint; refused as an ``error`` event."""
        try:
            return self.service.admission.admit()
        except Overloaded as exc:
            raise EventError(exc.detail.code or "overloaded", f"{exc.detail.message} (in {exc.retry_after_s:g} s)",
                             event_id=event_id, error_type="server_error") from exc

    async def _respond(self, writer: ResponseWriter, outputs: AsyncGenerator[OmniOutput, None]) -> None:
        final: OmniOutput | None = None
        started = time.monotonic()
        try:
            await writer.start()
            # Unless read to its final output, the request is aborted in every stage before this returns or
            # raises (cancel, timeout, error); the ticket goes back when it ends.
            async with aclosing(outputs):
                async for out in outputs:
                    await writer.delta(out)
                    final = out
        except asyncio.CancelledError:
            writer.cancel()
        except Exception as exc:  # noqa: BLE001 - the session outlives one failed response
            logger.exception("realtime response %s failed", writer.request.request_id)
            writer.fail("engine_error", str(exc))
        await writer.done(final)
        self._arm_idle(writer.audio_samples / writer.source_rate, started)

    async def _cancel_response(self, reason: CancelReason = "client_cancelled") -> None:
        task, writer = self.response, self.writer
        if task is None or task.done() or writer is None:
            return
        writer.cancel_reason = reason  # what response.done says, however the task ends up cancelled
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        if task.cancelled():  # cancelled before it ever ran: nothing reached the engine, the client hears the end
            await writer.start()
            writer.cancel()
            await writer.done(None)


def _ended(ticket: Ticket, speculation: Speculation | None, stopped: Callable[[], None]) -> None:
    stopped()
    ticket.release()
    if speculation is not None:
        speculation.cancel()
