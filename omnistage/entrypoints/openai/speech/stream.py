"""``WS /v1/audio/speech/stream``: text in as it is written (an LLM's deltas), speech out as it is made.

Client events (JSON): ``{"type": "session.update", "voice": ..., "instructions": ..., "text_input": ...}`` (before
the text), ``{"type": "input_text.delta", "delta": "..."}`` any number of times, ``{"type": "input_text.done"}`` at
the end, or ``{"type": "input_text.cancel"}`` to stop speaking (no audio after the chunk in flight; the session
ends as at the end of its text). At connect the server says how the text will be spoken (``session.created``,
``session.text_input``). ``deltas`` (a family that takes text deltas, Qwen3-TTS; its default): the text is one
utterance fed to the model as it is written (:mod:`omnistage.entrypoints.openai.speech.stream_deltas`), its first
audio after the first words. ``sentences`` (every other family, or asked for): the text is cut into segments at
sentence ends (or at ``--max-speech-input-chars``), and each segment is spoken
as soon as it is complete, one after another, as ``/v1/audio/speech`` would speak it (same voices, same checks,
admitted under the same bound), while later text keeps arriving. Server events: ``speech.audio.delta`` (base64
PCM16, 24 kHz mono, with its ``segment``), ``speech.segment.done`` (the segment's text), then
``speech.audio.done`` with the usage of all segments, and the socket closes (1000). A client's mistake or a
segment that fails is an ``error`` event and the session goes on (:class:`SpeechStream` says which close it);
the socket closes (1008) after ``--ws-idle-timeout`` seconds without an event.

A first event ``session.config`` is vLLM-Omni's protocol for this route: the session is the same, its events
are translated by :mod:`omnistage.entrypoints.openai.speech.vllm_omni` (a :class:`StreamDialect`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from functools import partial

from fastapi import APIRouter, WebSocket, WebSocketDisconnect

from omnistage.entrypoints.openai.common.errors import APIError, scrub_reprs
from omnistage.entrypoints.openai.common.json_text import LONE_SURROGATE, lone_surrogate
from omnistage.entrypoints.openai.common.protocol import ErrorDetail
from omnistage.entrypoints.openai.common.request_budget import over_budget
from omnistage.entrypoints.openai.speech.protocol import SpeechRequest, SpeechUsage
from omnistage.entrypoints.openai.speech.service import SpeechService
from omnistage.entrypoints.openai.speech.stream_audio import stream_audio
from omnistage.entrypoints.openai.speech.stream_deltas import DeltaUtterance
from omnistage.entrypoints.openai.speech.stream_dialect import Cancel, Configure, StreamDialect, TextIn
from omnistage.entrypoints.openai.speech.vllm_omni import VllmOmniStreamDialect, speaks_vllm_omni

router = APIRouter()
# A sentence ends at . ! ? (or their full-width forms), ; or a newline, once what follows has begun.
SENTENCE_END = re.compile(r"[.!?;\u3002\uff01\uff1f](?=\s)|\n")
END = object()  # the queue's last item


def cut_segments(buffer: str, limit: int, final: bool = False) -> tuple[list[str], str]:
    """Complete segments of ``buffer`` and what is left; ``final`` takes the rest too.

    Linear in the buffer: each search looks only at the next ``limit`` characters (and the one after, for the
    look-ahead) from where the last segment ended, and the buffer is sliced once per segment (a 4 MB delta with
    no sentence end once took 34 s of searching the whole rest again per segment, on the event loop)."""
    segments: list[str] = []
    start = 0
    while True:
        match = SENTENCE_END.search(buffer, start, start + limit + 1)
        if match is not None and match.end() - start <= limit:
            end = match.end()
        elif len(buffer) - start > limit:
            end = start + limit
        else:
            break
        segments.append(buffer[start:end])
        start = end
    rest = buffer[start:]
    if final:
        segments.append(rest)
        rest = ""
    return [s.strip() for s in segments if s.strip()], rest


def _cut_job(buffer: str, limit: int, final: bool, token: object) -> tuple[list[str], str]:
    return cut_segments(buffer, limit, final)


class SpeechStream:
    """One session. A client's mistake (a frame that is no JSON object, an unknown event, a field of the wrong
    type, an unknown voice, a segment refused or failed) is an ``error`` event and the session goes on, as
    OpenAI's realtime sessions do: settings stay as they were, the refused segment is not spoken, later text
    is. Only an idle session (``--ws-idle-timeout``) and an unknown model at connect are closed (1008, after
    their error event); frames the WebSocket layer cannot read at all (invalid UTF-8 text, a frame over its size
    bound) are closed by that layer (1007, 1009)."""

    def __init__(self, ws: WebSocket, service: SpeechService, model: str) -> None:
        self.ws, self.service = ws, service
        self.dialect = StreamDialect(ws)
        self.settings = SpeechRequest(model=model, input=" ")
        self.segments: asyncio.Queue[object] = asyncio.Queue()  # lists of segments (or text pieces), then END
        self.usage = [0, 0]
        self.buffer, self.first = "", True
        self.deltas = takes_deltas(service)  # the text spoken as it is written (else cut in sentences)
        self.texted = False  # text has come: the mode is fixed
        self.written = 0  # characters of the utterance's text (text_input deltas)
        self.stopped = asyncio.Event()  # a cancel: no audio after it
        self.current: asyncio.Task | DeltaUtterance | None = None  # what is speaking now

    async def run(self) -> None:
        speaker = asyncio.create_task(self._speak_all())
        try:
            await self._read(speaker)
            await speaker
        except TimeoutError:
            speaker.cancel()
            await self._close_with(ValueError(f"no event for {self.service.limits.ws_idle_timeout:g} s "
                                              f"(--ws-idle-timeout)"))
        except WebSocketDisconnect:
            speaker.cancel()
        finally:
            if not speaker.done():
                speaker.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await speaker

    async def _read(self, speaker: asyncio.Task) -> None:
        """Client events until the speaker ends. After the text's end the socket is still read (a cancel, the
        close, keep-alive pings; no idle bound while the speech goes on)."""
        ended = False
        while True:
            async with asyncio.timeout(None if ended else self.service.limits.ws_idle_timeout):
                receive = asyncio.ensure_future(self.ws.receive_text())
                done, _ = await asyncio.wait({receive, speaker}, return_when=asyncio.FIRST_COMPLETED)
            if speaker in done:  # the speaker ended (it closed the socket, or the socket went): stop reading
                if not receive.cancel() and not receive.cancelled():
                    receive.exception()  # a read that failed as the socket closed is no error: retrieved
                return
            try:
                text = receive.result()
            except KeyError:  # a binary frame: receive_text finds no text in it
                text = None
            try:
                ended = await self._take(text, ended) or ended
            except (APIError, ValueError) as exc:
                await self._error(exc)  # the event is refused; the session goes on

    async def _take(self, text: str | None, ended: bool = False) -> bool:
        """Acts on one client event; True once the text is done (``ended``: it was, only a cancel is taken)."""
        if text is None:
            raise ValueError("an event must be a JSON object in a text frame")
        if lone_surrogate(text):
            raise ValueError(LONE_SURROGATE)
        try:
            raw = json.loads(text)
        except RecursionError:
            raise ValueError("an event must be a JSON object, not nested too deep") from None
        if not isinstance(raw, dict):
            raise ValueError("an event must be a JSON object")
        if self.first and speaks_vllm_omni(raw):  # the first event tells which protocol the client speaks
            self.dialect = VllmOmniStreamDialect(self.ws)
        self.first = False
        event = self.dialect.parse(raw)
        if ended and not isinstance(event, Cancel):
            raise ValueError("the text has ended: only input_text.cancel is taken now")
        if isinstance(event, Configure):
            settings = self.settings.model_copy(update={
                k: getattr(event.settings, k) for k in event.settings.model_fields_set - {"input"}})
            self._body(" ", settings)  # checked now (voice, lengths): refused settings leave the session's as they were
            if event.text_input is not None:
                self._text_input(event.text_input)
            self.settings = settings
            return False
        if isinstance(event, Cancel):
            await self._cancel()
            return True
        await self._text(event)
        return event.done

    def _text_input(self, mode: str) -> None:
        if self.texted:
            raise ValueError("text_input is set before the text")
        if mode == "deltas" and not takes_deltas(self.service):
            raise ValueError("this model speaks whole sentences: text_input 'deltas' is not available")
        self.deltas = mode == "deltas"

    async def _cancel(self) -> None:
        """Stops the audio now: nothing queued is spoken, the request speaking is aborted."""
        self.stopped.set()
        self.segments.put_nowait(END)
        current = self.current
        if isinstance(current, DeltaUtterance):
            await current.stop()
        elif current is not None and not current.done():
            current.cancel()

    async def _text(self, event: TextIn) -> None:
        self.texted = True
        if self.deltas:  # the utterance takes the pieces as they are
            self._delta(event)
            return
        self.buffer += event.text
        limit = self.service.limits.max_speech_input_chars
        if len(self.buffer) > limit:  # a large delta (MBs of text) is cut in the pool, not on the event loop
            segments, self.buffer = await self.service.pool.run(_cut_job, self.buffer, limit, event.done)
        else:
            segments, self.buffer = cut_segments(self.buffer, limit, final=event.done)
        try:
            if segments:
                self._body(segments[0])  # checked now: a bad setting fails before any audio (cut: none too long)
                self.segments.put_nowait(segments)
        finally:
            if event.done:
                self.segments.put_nowait(END)  # however its last segments fared, the session ends

    def _delta(self, event: TextIn) -> None:
        """A piece of the utterance; its whole text is bounded as one ``/v1/audio/speech`` input is (a piece past
        the bound is refused, its end still ends the utterance)."""
        limit, taken = self.service.limits.max_speech_input_chars, False
        try:
            if self.written + len(event.text) > limit:
                raise over_budget("max_speech_input_chars", f"the text would be over {limit} characters",
                                  "delta", "input_too_long")
            self.written += len(event.text)
            self.segments.put_nowait(event)
            taken = True
        finally:
            if event.done:
                if not taken:
                    self.segments.put_nowait(TextIn("", done=True))
                self.segments.put_nowait(END)

    def _body(self, text: str, settings: SpeechRequest | None = None) -> SpeechRequest:
        settings = settings or self.settings
        fmt = settings.response_format if "response_format" in settings.model_fields_set \
            else self.dialect.response_format
        body = settings.model_copy(update={"input": text, "response_format": fmt})
        self.service.check(body)
        return body

    async def _speak_all(self) -> None:
        first = await self.segments.get()
        spoken = await (self._speak_deltas(first) if self.deltas and first is not END else self._speak_sentences(first))
        await self.dialect.finished(SpeechUsage(input_tokens=self.usage[0], output_tokens=self.usage[1],
                                                total_tokens=sum(self.usage)), spoken)
        await self.ws.close()

    async def _speak_deltas(self, first: object) -> int:
        self.segments.put_nowait(first)  # taken again, in order, by the utterance
        utterance = self.current = DeltaUtterance(self.service, self.dialect, self.settings, self.stopped)
        try:
            utterance.body = self._body(" ")  # the settings checked again, their format the dialect's
            return await utterance.speak(self.segments, END)
        except (APIError, ValueError) as exc:  # refused or failed: said, and the session ends with what was spoken
            await self._error(exc)
            return 1 if utterance.reader is not None else 0
        finally:
            self.usage = utterance.usage

    async def _speak_sentences(self, batch: object) -> int:
        index = 0
        while batch is not END and not self.stopped.is_set():
            for segment in batch:  # type: ignore[attr-defined] - a list of segments
                if self.stopped.is_set():
                    break
                self.current = asyncio.create_task(self._speak(index, segment))
                try:
                    await self.current
                except asyncio.CancelledError:
                    if not self.stopped.is_set():
                        raise  # the session's own end, not a cancel
                except (APIError, ValueError) as exc:  # refused (over a limit) or failed: said, and the next goes on
                    await self._error(exc)
                index += 1
            batch = await self.segments.get()
        return index

    async def _speak(self, index: int, text: str) -> None:
        service, body = self.service, self._body(text)
        ticket = service.admission.admit()
        try:
            request = await service.inputs.request(body)
        except BaseException:
            ticket.release()
            raise
        await self.dialect.segment_started(index, text, body)
        size, usage = await stream_audio(service, request, body, ticket, partial(self.dialect.audio, index))
        if usage is not None:
            self.usage[0] += usage.prompt_tokens
            self.usage[1] += usage.completion_tokens
        await self.dialect.segment_done(index, text, size)

    async def _error(self, exc: Exception) -> None:
        detail = exc.detail if isinstance(exc, APIError) else ErrorDetail(
            type="invalid_request_error", code="invalid_event", message=scrub_reprs(str(exc)), param=None)
        with contextlib.suppress(Exception):  # the socket may be gone already: its reader sees that
            await self.dialect.failed(detail)

    async def _close_with(self, exc: Exception) -> None:
        await self._error(exc)
        with contextlib.suppress(Exception):
            await self.ws.close(code=1008)


def takes_deltas(service: SpeechService) -> bool:
    """Whether the served family speaks text as it is written (its front end says so)."""
    speech = service.engine.front_end.speech
    return speech is not None and speech.takes_text_deltas


@router.websocket("/v1/audio/speech/stream")
async def speech_stream(ws: WebSocket) -> None:
    service: SpeechService = ws.app.state.services.speech
    await ws.accept()
    model = ws.query_params.get("model") or service.served.names[0]
    try:
        service.served.check(model)
    except APIError as exc:
        await SpeechStream(ws, service, model)._close_with(exc)
        return
    await ws.send_json({"type": "session.created", "session": {
        "model": model, "text_input": "deltas" if takes_deltas(service) else "sentences"}})
    await SpeechStream(ws, service, model).run()
