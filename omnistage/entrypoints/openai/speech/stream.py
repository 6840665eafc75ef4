"""``WS /v1/audio/speech/stream``: text in as it is written (an LLM's deltas), speech out as it is made.

Client events (JSON): ``{"type": "session.update", "voice": ..., "instructions": ...}`` (before the text),
``{"type": "input_text.delta", "delta": "..."}`` any number of times, ``{"type": "input_text.done"}`` at the end.
The text is cut into segments at sentence ends (or at ``--max-speech-input-chars``), and each segment is spoken
as soon as it is complete, one after another, as ``/v1/audio/speech`` would speak it (same voices, same checks,
admitted under the same bound), while later text keeps arriving. Server events: ``speech.audio.delta`` (base64
PCM16, 24 kHz mono, with its ``segment``), ``speech.segment.done`` (the segment's text), then
``speech.audio.done`` with the usage of all segments; a failure is an ``error`` event and closes the socket.
The socket closes after ``--ws-idle-timeout`` seconds without an event.

A first event ``session.config`` is vLLM-Omni's protocol for this route: the session is the same, its events
are translated by :mod:`omnistage.entrypoints.openai.speech.vllm_omni` (a :class:`StreamDialect`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from contextlib import aclosing

from fastapi import APIRouter, WebSocket, WebSocketDisconnect

from omnistage.audio import StreamingAudioEncoder, TimeStretcher
from omnistage.core import OUTPUT_SAMPLE_RATE
from omnistage.entrypoints.openai.common.errors import APIError, scrub_reprs
from omnistage.entrypoints.openai.common.protocol import ErrorDetail
from omnistage.entrypoints.openai.common.request_checks import engine_failure
from omnistage.entrypoints.openai.common.streaming import engine_outputs
from omnistage.entrypoints.openai.speech.protocol import SpeechRequest, SpeechUsage
from omnistage.entrypoints.openai.speech.service import SpeechService
from omnistage.entrypoints.openai.speech.stream_dialect import Configure, StreamDialect
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
    def __init__(self, ws: WebSocket, service: SpeechService, model: str) -> None:
        self.ws, self.service = ws, service
        self.dialect = StreamDialect(ws)
        self.settings = SpeechRequest(model=model, input=" ")
        self.segments: asyncio.Queue[object] = asyncio.Queue()  # lists of segments, then END
        self.usage = [0, 0]

    async def run(self) -> None:
        speaker = asyncio.create_task(self._speak_all())
        try:
            await self._read(speaker)
            await speaker
        except TimeoutError:
            speaker.cancel()
            await self._fail(ValueError(f"no event for {self.service.limits.ws_idle_timeout:g} s (--ws-idle-timeout)"))
        except (WebSocketDisconnect, APIError, ValueError) as exc:
            speaker.cancel()
            if not isinstance(exc, WebSocketDisconnect):
                await self._fail(exc)
        finally:
            if not speaker.done():
                speaker.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await speaker

    async def _read(self, speaker: asyncio.Task) -> None:
        buffer, limit, first = "", self.service.limits.max_speech_input_chars, True
        while True:
            async with asyncio.timeout(self.service.limits.ws_idle_timeout):
                receive = asyncio.ensure_future(self.ws.receive_text())
                done, _ = await asyncio.wait({receive, speaker}, return_when=asyncio.FIRST_COMPLETED)
            if receive not in done:  # the speaker failed: stop reading
                receive.cancel()
                return
            try:
                raw = json.loads(receive.result())
            except (KeyError, RecursionError):  # a binary frame (receive_text finds no text), or JSON nested too deep
                raise ValueError("an event must be a JSON object in a text frame, not nested too deep") from None
            if first and speaks_vllm_omni(raw):  # the first event tells which protocol the client speaks
                self.dialect = VllmOmniStreamDialect(self.ws)
            first = False
            event = self.dialect.parse(raw if isinstance(raw, dict) else {})
            if isinstance(event, Configure):
                self.settings = self.settings.model_copy(update={
                    k: getattr(event.settings, k) for k in event.settings.model_fields_set - {"input"}})
                continue
            buffer += event.text
            if len(buffer) > limit:  # a large delta (MBs of text) is cut in the pool, not on the event loop
                segments, buffer = await self.service.pool.run(_cut_job, buffer, limit, event.done)
            else:
                segments, buffer = cut_segments(buffer, limit, final=event.done)
            if segments:
                self._body(segments[0])  # checked now: a bad voice fails before any audio (cut: none is too long)
                self.segments.put_nowait(segments)
            if event.done:
                self.segments.put_nowait(END)
                return

    def _body(self, text: str) -> SpeechRequest:
        fmt = self.settings.response_format if "response_format" in self.settings.model_fields_set \
            else self.dialect.response_format
        body = self.settings.model_copy(update={"input": text, "response_format": fmt})
        self.service.check(body)
        return body

    async def _speak_all(self) -> None:
        index = 0
        while (batch := await self.segments.get()) is not END:
            for segment in batch:  # type: ignore[attr-defined] - a list of segments
                await self._speak(index, segment)
                index += 1
        await self.dialect.finished(SpeechUsage(input_tokens=self.usage[0], output_tokens=self.usage[1],
                                                total_tokens=sum(self.usage)), index)
        await self.ws.close()

    async def _speak(self, index: int, text: str) -> None:
        service, body = self.service, self._body(text)
        ticket = service.admission.admit()
        try:
            request = await service.inputs.request(body)
        except BaseException:
            ticket.release()
            raise
        await self.dialect.segment_started(index, text, body)
        encoder, stretcher = StreamingAudioEncoder(body.audio_format, OUTPUT_SAMPLE_RATE), TimeStretcher(body.speed)
        size = 0
        async with aclosing(engine_outputs(service.engine, request, timeout_s=service.limits.request_timeout,
                                           ticket=ticket)) as outputs:
            async for out in outputs:
                pieces = [encoder.feed(stretcher.feed(out.audio))] if out.audio is not None and out.audio.size else []
                if out.finished:
                    failure = engine_failure(out)
                    if failure is not None:
                        raise failure
                    pieces.append(encoder.feed(stretcher.finish()) + encoder.finish())
                    if out.usage is not None:
                        self.usage[0] += out.usage.prompt_tokens
                        self.usage[1] += out.usage.completion_tokens
                for piece in filter(None, pieces):
                    size += len(piece)
                    await self.dialect.audio(index, piece)
        await self.dialect.segment_done(index, text, size)

    async def _fail(self, exc: Exception) -> None:
        detail = exc.detail if isinstance(exc, APIError) else ErrorDetail(
            type="invalid_request_error", code="invalid_event", message=scrub_reprs(str(exc)), param=None)
        with contextlib.suppress(Exception):
            await self.dialect.failed(detail)
            await self.ws.close(code=1008)


@router.websocket("/v1/audio/speech/stream")
async def speech_stream(ws: WebSocket) -> None:
    service: SpeechService = ws.app.state.services.speech
    await ws.accept()
    model = ws.query_params.get("model") or service.served.names[0]
    try:
        service.served.check(model)
    except APIError as exc:
        await SpeechStream(ws, service, model)._fail(exc)
        return
    await SpeechStream(ws, service, model).run()
