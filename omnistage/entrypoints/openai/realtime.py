"""``WS /v1/realtime``: OpenAI Realtime-style voice sessions over one WebSocket.

A session holds its configuration, an input audio buffer (PCM16 mono at 16 or
24 kHz, appended in pieces) and the conversation so far. ``commit`` turns the
buffer into a user turn (resampled to the audio encoder's 16 kHz with scipy's
polyphase filter); ``response.create`` renders the whole conversation with the
chat template and streams the answer as ``response.output_text.delta`` /
``response.output_audio.delta`` (base64 PCM16, 24 kHz) /
``response.output_audio_transcript.delta`` events, closed by ``response.done``.
The next turn re-renders the history, so with prefix caching on the thinker
reuses the KV blocks of the earlier turns' common prefix.

``response.cancel`` (or speech starting while a response runs, with server VAD)
cancels the response task: the engine request is aborted in every stage before
``response.done`` reports ``status: cancelled``. Bad events get ``error`` events
and the socket stays open. One response runs at a time per session; sessions
run concurrently, each as its own engine requests, under the server's
admission bound (``--max-queued-requests``: past it ``response.create`` gets
an ``error`` event, code ``overloaded``, or ``stage_unavailable`` while a stage
is down) and deadline (``--request-timeout``: the request is aborted and
``response.done`` reports ``failed``, code ``timeout``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from contextlib import aclosing
from dataclasses import dataclass, replace
from typing import Any

from fastapi import APIRouter, FastAPI, WebSocket, WebSocketDisconnect

from omnistage.audio.vad import EnergyVad
from omnistage.core import Modality, OmniOutput, OmniRequest
from omnistage.entrypoints.openai.admission import Admission, Overloaded, Ticket
from omnistage.entrypoints.openai.decode_pool import DecodePool
from omnistage.entrypoints.openai.engine_protocol import OmniEngine
from omnistage.entrypoints.openai.errors import APIError
from omnistage.entrypoints.openai.realtime_protocol import (
    EventError,
    ResponseOptions,
    SessionConfig,
    decode_pcm16,
    error_event,
    new_id,
    parse_event,
    response_options,
    server_event,
    update_session,
    user_text,
)
from omnistage.entrypoints.openai.realtime_conversation import InputBuffer, Turn, render_prompt_job
from omnistage.entrypoints.openai.realtime_response import ResponseWriter
from omnistage.entrypoints.openai.request_budget import turns_over_budget
from omnistage.entrypoints.openai.serving_common import completion_budget, make_sampling
from omnistage.entrypoints.openai.served_model import ServedModel
from omnistage.entrypoints.openai.server_config import ServerLimits
from omnistage.entrypoints.openai.streaming import engine_outputs
from omnistage.processing.prompt import AUDIO_SAMPLE_RATE

logger = logging.getLogger(__name__)
DEFAULT_MAX_OUTPUT_TOKENS = 4096  # a response's cap when the session says "inf" (the context may allow more)

router = APIRouter()


class RealtimeSession:
    def __init__(self, ws: WebSocket, engine: OmniEngine, limits: ServerLimits, admission: Admission,
                 pool: DecodePool) -> None:
        self.ws, self.engine, self.limits, self.admission, self.pool = ws, engine, limits, admission, pool
        self.id = new_id("sess")
        modalities = ("text", "audio") if engine.supports_audio else ("text",)
        voice = engine.voices[0] if engine.voices else "Ethan"
        self.config = SessionConfig(voice=voice, output_modalities=modalities)
        self.buffer = InputBuffer(self.config.input_rate, limits.max_audio_seconds)
        self.vad: EnergyVad | None = None
        self.speech_start = 0
        self.turns: list[Turn] = []
        self.response: asyncio.Task[None] | None = None
        self.writer: ResponseWriter | None = None  # the events of the latest response
        self._send_lock = asyncio.Lock()
        self.closed = False
        self._reader: asyncio.Task[Any] | None = None  # the read loop's task, while it waits for a message

    # -- sending ---------------------------------------------------------------------------------
    async def send(self, event: dict[str, Any]) -> None:
        async with self._send_lock:
            if self.closed:
                return
            try:
                async with asyncio.timeout(self.limits.send_timeout):
                    await self.ws.send_json(event)
            except TimeoutError:
                # The client stopped reading: end the session rather than buffer for it or hold its place.
                logger.warning("realtime session %s: the client read nothing for %g s (--send-timeout); closing",
                               self.id, self.limits.send_timeout)
                self._end_session()
            except (WebSocketDisconnect, RuntimeError, OSError):
                self.closed = True  # the client left; the read loop ends the session

    def _end_session(self) -> None:
        self.closed = True
        if self._reader is not None and self._reader is not asyncio.current_task():
            self._reader.cancel()  # wakes the read loop from its wait (see _receive)

    async def fail(self, exc: EventError) -> None:
        await self.send(error_event(exc))

    # -- the read loop ---------------------------------------------------------------------------
    async def run(self) -> None:
        await self.send(server_event("session.created", session=self.config.describe(self.id, self.engine.model_name)))
        try:
            while not self.closed:
                message = await self._receive()
                if message is None or message["type"] == "websocket.disconnect":
                    break
                raw = message.get("text") if message.get("text") is not None else message.get("bytes")
                try:
                    await self.handle(parse_event(raw or b""))
                except EventError as exc:
                    await self.fail(exc)
        finally:
            self.closed = True
            await self._cancel_response()

    async def _receive(self) -> dict[str, Any] | None:
        """The next client message; None when the session ends first: idle past ``--ws-idle-timeout`` with no
        response running, or ended by ``_end_session`` while waiting."""
        self._reader = asyncio.current_task()
        try:
            while True:
                try:
                    async with asyncio.timeout(self.limits.ws_idle_timeout):
                        return await self.ws.receive()
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
        with contextlib.suppress(WebSocketDisconnect, RuntimeError, OSError):
            async with asyncio.timeout(self.limits.send_timeout):
                await self.ws.close(code=1000, reason="idle timeout")

    async def handle(self, event: dict[str, Any]) -> None:
        kind = event["type"]
        if kind == "session.update":
            await self._update(event)
        elif kind == "input_audio_buffer.append":
            await self._append(event)
        elif kind == "input_audio_buffer.commit":
            await self._commit(event)
        elif kind == "input_audio_buffer.clear":
            self.buffer.clear()
            if self.vad is not None:
                self.vad.reset()
            await self.send(server_event("input_audio_buffer.cleared"))
        elif kind == "conversation.item.create":
            text = user_text(event)
            if len(text) > self.limits.max_text_chars:
                raise EventError("input_too_long", f"the item holds {len(text)} characters; the limit is "
                                 f"{self.limits.max_text_chars} (--max-text-chars)", "item.content",
                                 event.get("event_id"))
            await self._add_turn(Turn(new_id("item"), "user", text=text))
        elif kind == "response.create":
            await self._start_response(response_options(self.config, event), event.get("event_id"))
        elif kind == "response.cancel":
            if self.response is None or self.response.done():
                raise EventError("response_cancel_not_active", "there is no active response to cancel",
                                 event_id=event.get("event_id"))
            await self._cancel_response()

    # -- session and audio -----------------------------------------------------------------------
    async def _update(self, event: dict[str, Any]) -> None:
        config = update_session(self.config, event)
        if len(config.instructions) > self.limits.max_instructions_chars:
            raise EventError("input_too_long", f"instructions are {len(config.instructions)} characters; the limit "
                             f"is {self.limits.max_instructions_chars} (--max-instructions-chars)",
                             "session.instructions", event.get("event_id"))
        self._check_output(config.output_modalities, config.voice, "session", event.get("event_id"))
        if config.input_rate != self.config.input_rate and self.buffer.samples:
            raise EventError("invalid_value", "the input rate cannot change while the buffer holds audio; "
                             "commit or clear it first", "session.audio.input.format.rate", event.get("event_id"))
        voice = {v.lower(): v for v in self.engine.voices}.get(config.voice.lower(), config.voice)
        self.config = replace(config, voice=voice)
        self.buffer.rate = config.input_rate
        self.buffer.max_samples = int(self.limits.max_audio_seconds * config.input_rate)
        vad = config.turn_detection
        self.vad = None if vad is None else EnergyVad(vad, config.input_rate)
        await self.send(server_event("session.updated", session=self.config.describe(self.id, self.engine.model_name)))

    def _check_output(self, modalities: tuple[str, ...], voice: str, where: str, event_id: object) -> None:
        eid = event_id if isinstance(event_id, str) else None
        if "audio" not in modalities:
            return
        if not self.engine.supports_audio:
            raise EventError("audio_not_supported",
                             "this model is served text-only (its checkpoint has no talker/code2wav); "
                             "set output_modalities to ['text']", f"{where}.output_modalities", eid)
        if voice.lower() not in {v.lower() for v in self.engine.voices}:
            known = ", ".join(self.engine.voices) or "none"
            raise EventError("invalid_voice", f"unknown voice {voice!r}; this model has: {known}",
                             f"{where}.audio.output.voice", eid)

    async def _append(self, event: dict[str, Any]) -> None:
        piece = self.buffer.append(decode_pcm16(event))
        if self.vad is None:
            return
        for vad_event in self.vad.feed(piece):
            ms = vad_event.sample * 1000 // self.buffer.rate
            if vad_event.kind == "speech_started":
                self.speech_start = vad_event.sample
                await self.send(server_event("input_audio_buffer.speech_started", audio_start_ms=ms, item_id=None))
                if self.response is not None and not self.response.done():
                    await self._cancel_response()  # barge-in
            else:
                await self.send(server_event("input_audio_buffer.speech_stopped", audio_end_ms=ms, item_id=None))
                vad = self.config.turn_detection
                pad = (vad.prefix_padding_ms if vad else 0) * self.buffer.rate // 1000
                await self._commit(event, start=max(0, self.speech_start - pad))
                if self.config.create_response:
                    await self._start_response(response_options(self.config, {}), None)

    async def _commit(self, event: dict[str, Any], start: int = 0) -> None:
        if self.buffer.samples == 0:
            raise EventError("input_audio_buffer_commit_empty", "the input audio buffer is empty",
                             event_id=event.get("event_id"))
        audio = self.buffer.take(start)
        if self.vad is not None:
            self.vad.reset()
        turn = Turn(new_id("item"), "user", audio=audio)
        previous = self.turns[-1].item_id if self.turns else None
        self.turns.append(turn)
        await self.send(server_event("input_audio_buffer.committed", item_id=turn.item_id,
                                     previous_item_id=previous))

    async def _add_turn(self, turn: Turn) -> None:
        previous = self.turns[-1].item_id if self.turns else None
        self.turns.append(turn)
        item = {"id": turn.item_id, "type": "message", "role": turn.role,
                "content": [{"type": "input_text", "text": turn.text}]}
        await self.send(server_event("conversation.item.created", previous_item_id=previous, item=item))

    # -- responses -------------------------------------------------------------------------------
    async def _start_response(self, options: ResponseOptions, event_id: object) -> None:
        eid = event_id if isinstance(event_id, str) else None
        if self.response is not None and not self.response.done():
            raise EventError("conversation_already_has_active_response",
                             "a response is in progress; cancel it or wait for response.done", event_id=eid)
        self._check_output(options.output_modalities, self.config.voice, "response", eid)
        if not any(t.role == "user" for t in self.turns):
            raise EventError("conversation_empty", "nothing to respond to: commit audio or create a user item first",
                             event_id=eid)
        if len(options.instructions) > self.limits.max_instructions_chars:
            raise EventError("input_too_long", f"instructions are {len(options.instructions)} characters; the limit "
                             f"is {self.limits.max_instructions_chars} (--max-instructions-chars)",
                             "response.instructions", eid)
        self._fit_history()
        ticket = self._admit(eid)  # before the prompt is built: that work runs in the bounded pool
        try:
            request = await self._request(options, eid)
        except BaseException:
            ticket.release()
            raise
        self.writer = ResponseWriter(self.send, self.id, self.config.voice, request, options)
        self.response = asyncio.create_task(self._respond(self.writer, ticket))
        # Released however the task ends, even when cancelled before it ever ran (barge-in right away).
        self.response.add_done_callback(lambda _: ticket.release())

    def _admit(self, event_id: str | None) -> Ticket:
        """A place under the server's bound shared with every endpoint; refused as an ``error`` event."""
        try:
            return self.admission.admit()
        except Overloaded as exc:
            raise EventError(exc.detail.code or "overloaded", f"{exc.detail.message} (in {exc.retry_after_s:g} s)",
                             event_id=event_id, error_type="server_error") from exc

    def _fit_history(self) -> None:
        """The conversation is one request's prompt: past ``--max-text-chars`` or ``--max-audio-seconds`` its
        oldest turns are dropped (as OpenAI truncates a conversation past its context), so neither a response's
        work nor the session's memory grows without bound."""
        sizes = [(len(t.text), 0.0 if t.audio is None else len(t.audio) / AUDIO_SAMPLE_RATE) for t in self.turns]
        drop = turns_over_budget(sizes, self.limits)
        if drop:
            del self.turns[:drop]

    async def _request(self, options: ResponseOptions, event_id: str | None) -> OmniRequest:
        turns = list(self.turns)
        try:
            prompt = await self.pool.run(render_prompt_job, self.engine.processor, options.instructions, turns)
        except ValueError as exc:
            raise EventError("invalid_prompt", f"could not build the prompt: {exc}", event_id=event_id) from exc
        requested = options.max_output_tokens
        try:
            budget = completion_budget(requested, len(prompt.token_ids), self.engine.max_model_len,
                                       "max_output_tokens")
            sampling = make_sampling(max_tokens=budget if requested else min(budget, DEFAULT_MAX_OUTPUT_TOKENS),
                                     temperature=self.config.temperature)
        except APIError as exc:
            raise EventError(exc.detail.code or "invalid_request", exc.detail.message, exc.detail.param,
                             event_id) from exc
        wants_audio = "audio" in options.output_modalities
        modalities = frozenset({Modality.TEXT} | ({Modality.AUDIO} if wants_audio else set()))
        return OmniRequest(request_id=new_id("resp"), prompt=prompt, modalities=modalities, sampling=sampling,
                           voice=self.config.voice)

    async def _respond(self, writer: ResponseWriter, ticket: Ticket) -> None:
        request = writer.request
        final: OmniOutput | None = None
        try:
            await writer.start()
            # Unless read to its final output, the request is aborted in every stage before this returns or
            # raises (cancel, timeout, error); the ticket goes back when it ends.
            async with aclosing(engine_outputs(self.engine, request, timeout_s=self.limits.request_timeout,
                                               ticket=ticket)) as outputs:
                async for out in outputs:
                    await writer.delta(out)
                    final = out
        except asyncio.CancelledError:
            writer.cancel()
        except Exception as exc:  # noqa: BLE001 - the session outlives one failed response
            logger.exception("realtime response %s failed", request.request_id)
            writer.fail("engine_error", str(exc))
        await self._end(writer, final)

    async def _end(self, writer: ResponseWriter, final: OmniOutput | None) -> None:
        self.turns.append(Turn(writer.item_id, "assistant", text="".join(writer.text)))
        await writer.done(final)

    async def _cancel_response(self) -> None:
        task, writer = self.response, self.writer
        if task is None or task.done() or writer is None:
            return
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        if task.cancelled():  # cancelled before it ever ran: nothing reached the engine, the client hears the end
            await writer.start()
            writer.cancel()
            await self._end(writer, None)


@dataclass
class RealtimeService:
    engine: OmniEngine
    limits: ServerLimits
    admission: Admission
    pool: DecodePool
    served: ServedModel


@router.websocket("/v1/realtime")
async def realtime(ws: WebSocket) -> None:
    service: RealtimeService = ws.app.state.realtime
    # OpenAI's browser SDKs offer "realtime" beside the key subprotocol and expect it back, as OpenAI answers.
    await ws.accept(subprotocol="realtime" if "realtime" in ws.scope.get("subprotocols", ()) else None)
    model = ws.query_params.get("model")
    if model is not None and model != service.engine.model_name:
        await ws.send_json(error_event(EventError("model_not_found", f"The model '{model}' does not exist", "model")))
        await ws.close(code=1008)
        return
    await RealtimeSession(ws, service.engine, service.limits, service.admission, service.pool).run()


def install_realtime(app: FastAPI, engine: OmniEngine, limits: ServerLimits,
                     admission: Admission | None = None, pool: DecodePool | None = None,
                     served: ServedModel | None = None) -> None:
    """``admission`` and ``pool``: the bound and the decode pool the HTTP endpoints share (a realtime response
    takes a place like a request, its prompt is built in the same pool)."""
    app.state.realtime = RealtimeService(engine, limits, admission or Admission(engine, limits.max_queued_requests),
                                         pool or DecodePool(limits.decode_workers), served or ServedModel.of(engine))
    app.include_router(router)
