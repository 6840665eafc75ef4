"""``POST /v1/audio/transcriptions`` and ``/v1/audio/translations``: an uploaded file written down by the thinker.

A request is bounded before any decoding: the body by ``--max-request-bytes`` (the body-limit middleware), the
file by ``--max-media-bytes``, and what its header declares (sample rate, seconds) by the request budget, probed
in the decode pool. Only then is it admitted; the file is decoded to 16 kHz mono in the decode pool, cut into
segments (``segments.py``; a recogniser family's own length, else 30 s), and each segment is one text-only thinker request (``common/transcriber.py``), one
after another under the request's one admission ticket, so a long file holds one place, not one per segment.
The talker never runs. Whole answers are rendered by ``formats.py``; ``stream=true`` sends each thinker delta as
a ``transcript.text.delta`` event and ends with ``transcript.text.done``.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from contextlib import aclosing
from dataclasses import dataclass, replace

import numpy as np
from fastapi import Request, UploadFile
from fastapi.responses import Response

from omnistage.core import Usage
from omnistage.entrypoints.openai.common.admission import Admission, Ticket
from omnistage.entrypoints.openai.common.decode_pool import CancelToken, DecodePool
from omnistage.entrypoints.openai.common.errors import APIError, MediaError, bad_request
from omnistage.entrypoints.openai.common.metrics import RequestTimer, ServerMetrics
from omnistage.entrypoints.openai.common.protocol import ErrorResponse
from omnistage.entrypoints.openai.common.request_budget import MediaBudget, over_budget
from omnistage.entrypoints.openai.common.request_checks import require_requests
from omnistage.entrypoints.openai.common.served_model import ServedModel
from omnistage.entrypoints.openai.common.streaming import (
    AbortingStreamingResponse,
    ClientDisconnected,
    peek,
    prepare_admitted,
    run_until_disconnect,
    sse_event,
)
from omnistage.entrypoints.openai.common.transcriber import (
    TRANSCRIPTION_MODALITIES,
    TranscriptDone,
    TranscriptionAsk,
    instructions,
    render_transcription,
    reply_reader,
    transcript_events,
    transcription_request,
)
from omnistage.entrypoints.openai.engine_protocol import OmniEngine
from omnistage.entrypoints.openai.media.loaders import decode_audio_item
from omnistage.entrypoints.openai.media.probe import probe_audio
from omnistage.entrypoints.openai.server_config import ServerLimits
from omnistage.entrypoints.openai.transcription.formats import (
    DeltaJoiner,
    SegmentText,
    TranscriptResult,
    render,
    token_usage,
)
from omnistage.entrypoints.openai.transcription.protocol import (
    TranscriptionForm,
    TranscriptTextDelta,
    TranscriptTextDone,
)
from omnistage.entrypoints.openai.transcription.segments import SEGMENT_SECONDS, split
from omnistage.processing.prompt import AUDIO_SAMPLE_RATE
from omnistage.processing.transcription import TranscriptionPrompter, UnsupportedLanguage, WordTime, WordTimer

NO_TRANSCRIPTION = ("this model cannot transcribe: it is a text-to-speech checkpoint, with no thinker to hear "
                    "audio; serve a Qwen3-Omni or Qwen3-ASR checkpoint for /v1/audio/transcriptions and "
                    "/v1/audio/translations")
NO_TRANSLATION = ("this model cannot translate: it is a speech recogniser that writes what it hears in the language "
                  "it hears; use /v1/audio/transcriptions, or serve an omni checkpoint for /v1/audio/translations")
ROUTES = {False: "/v1/audio/transcriptions", True: "/v1/audio/translations"}


@dataclass(frozen=True)
class SegmentDelta:
    """New text of segment ``index``, as the thinker streams it."""

    index: int
    text: str


Event = SegmentDelta | SegmentText


class TranscriptionService:
    def __init__(self, engine: OmniEngine, limits: ServerLimits, admission: Admission, pool: DecodePool,
                 served: ServedModel, metrics: ServerMetrics) -> None:
        self.engine, self.limits, self.admission, self.pool = engine, limits, admission, pool
        self.served, self.metrics = served, metrics

    async def create(self, form: TranscriptionForm, upload: UploadFile, raw: Request) -> Response:
        arrived = time.perf_counter()
        self.check(form)
        data = await self._read(upload)
        await self.pool.run(self._check_header, data)
        ticket = self.admission.admit(TRANSCRIPTION_MODALITIES)  # served while the audio stages are down
        try:
            audio = await prepare_admitted(raw, ticket, self.pool.run(self._decode, data))
        except ClientDisconnected:
            return Response(status_code=499)
        timer = self.metrics.track(ROUTES[form.translate], arrived, streamed=form.stream)
        events = self._events(audio, form, ticket, timer)
        if form.stream:
            return await self._stream(raw, events, ticket)
        try:
            result = await run_until_disconnect(raw, _collect(events, len(audio) / AUDIO_SAMPLE_RATE))
        except ClientDisconnected:
            return Response(status_code=499)
        finally:  # the events generator releases both, unless it never started
            ticket.release()
            timer.finish("client_disconnected")
        return render(result, form)

    def check(self, form: TranscriptionForm) -> None:
        self.served.check(form.model)
        front = self.engine.front_end
        require_requests(self.engine)
        if front.processor is None and front.transcriber is None:
            raise bad_request(NO_TRANSCRIPTION, param="model", code="transcription_not_supported")
        form.check(words=front.word_timer is not None)
        if front.transcriber is not None:
            _check_recogniser(front.transcriber, form)
        if form.prompt is not None and len(form.prompt) > self.limits.max_text_chars:
            raise over_budget("max_text_chars", f"prompt is {len(form.prompt)} characters; the limit is "
                              f"{self.limits.max_text_chars}", "prompt", "input_too_long")

    async def _read(self, upload: UploadFile) -> bytes:
        limit = self.limits.max_media_bytes
        if upload.size is None or upload.size <= limit:
            data = await upload.read(limit + 1)
            if len(data) <= limit:
                return data
        raise over_budget("max_media_bytes", f"the file is larger than {limit} bytes", "file", "media_too_large")

    def _check_header(self, data: bytes, token: CancelToken) -> None:
        """The file's header (rate, seconds) against the request's budget, before anything is decoded."""
        try:
            info = probe_audio(data, None)
        except MediaError as exc:
            raise bad_request(f"the file is not audio this server can read: {exc}", "file", exc.code) from exc
        MediaBudget(self.limits).add_audio(info.sample_rate, info.seconds, "file", info.channels)

    def _decode(self, data: bytes, token: CancelToken) -> np.ndarray:
        try:
            return decode_audio_item(data, None, self.limits.max_audio_seconds, token.check,
                                     self.limits.max_audio_samples)
        except MediaError as exc:
            # The header understated the length or gave none: the decoder stopped at the bound, which names it.
            if exc.code == "audio_too_large":
                raise APIError(400, str(exc), param="file", code=exc.code) from exc
            if exc.code == "audio_too_long":
                raise over_budget("max_audio_seconds", str(exc), "file", exc.code) from exc
            raise bad_request(f"could not decode the file: {exc}", "file", exc.code) from exc

    async def _events(self, audio: np.ndarray, form: TranscriptionForm, ticket: Ticket,
                      timer: RequestTimer) -> AsyncGenerator[Event, None]:
        """Each segment's deltas, then its ``SegmentText``; a failed segment ends the stream.

        This generator owns the request's ticket and timer: however it ends, its ``finally`` releases them."""
        outcome = "client_disconnected"
        deadline = time.monotonic() + self.limits.request_timeout
        system = instructions(form.translate, form.language, form.prompt)
        try:
            for index, segment in enumerate(split(audio, AUDIO_SAMPLE_RATE, self._segment_seconds(form))):
                ask = TranscriptionAsk(audio[segment.start:segment.end], system, form.sampling_temperature,
                                       logprobs=form.response_format == "verbose_json", language=form.language,
                                       context=form.prompt)
                try:
                    prompt = await self.pool.run(render_transcription, self.engine.front_end, ask)
                    request = transcription_request(self.engine, prompt, ask)
                except APIError as exc:
                    outcome = "client_error"
                    yield SegmentText(segment, TranscriptDone("", (), (), Usage(0, 0), exc))
                    return
                events = transcript_events(self.engine, request, timeout_s=max(deadline - time.monotonic(), 0.0),
                                           reader=reply_reader(self.engine.front_end, ask))
                async with aclosing(events):
                    async for event in events:
                        if isinstance(event, TranscriptDone):
                            if event.failure is not None:
                                outcome = "engine_error"  # before the yield: the reader may close us there
                            yield await self._timed(SegmentText(segment, event), audio, form)
                            if event.failure is not None:
                                return
                        else:
                            yield SegmentDelta(index, event.text)
            outcome = "ok"
        finally:
            ticket.release()
            timer.finish(outcome)

    def _segment_seconds(self, form: TranscriptionForm) -> float:
        """A recogniser's own longest piece (Qwen3-ASR reads 20 minutes at once), else the thinker's 30 s; no longer
        than the aligner times at once when words are asked for."""
        front = self.engine.front_end
        seconds = SEGMENT_SECONDS if front.transcriber is None else front.transcriber.segment_seconds
        if form.wants_words and front.word_timer is not None:
            seconds = min(seconds, front.word_timer.max_seconds)
        return seconds

    async def _timed(self, piece: SegmentText, audio: np.ndarray, form: TranscriptionForm) -> SegmentText:
        """The piece with its words timed by the aligner (in the file's time), when words were asked for."""
        timer = self.engine.front_end.word_timer
        if not form.wants_words or timer is None or piece.done.failure is not None or not piece.done.text:
            return piece
        clip = audio[piece.segment.start:piece.segment.end]
        language = form.language or piece.done.language
        words = await self.pool.run(_align, timer, clip, piece.done.text, language)
        offset = piece.start
        return replace(piece, words=tuple(WordTime(w.word, w.start + offset, w.end + offset) for w in words))

    async def _stream(self, raw: Request, events: AsyncGenerator[Event, None], ticket: Ticket) -> Response:
        try:
            first, rest = await peek(raw, events)
        except ClientDisconnected:
            return Response(status_code=499)
        # A request that fails before its first text still gets a JSON error, not an event stream.
        if isinstance(first, SegmentText) and first.done.failure is not None:
            await events.aclose()
            raise first.done.failure
        return AbortingStreamingResponse(_sse(rest), media_type="text/event-stream", upstream=events, ticket=ticket)


def _align(timer: WordTimer, clip: np.ndarray, text: str, language: str | None,
           token: CancelToken) -> Sequence[WordTime]:
    token.check()
    return timer.align(clip, text, language)


def _check_recogniser(transcriber: TranscriptionPrompter, form: TranscriptionForm) -> None:
    """What a speech recogniser cannot do, refused before the file is read."""
    if form.translate and not transcriber.translates:
        raise bad_request(NO_TRANSLATION, param="model", code="translation_not_supported")
    if form.language is not None:
        try:
            transcriber.check_language(form.language)
        except UnsupportedLanguage as exc:
            raise bad_request(str(exc), param="language", code="unsupported_language") from exc


async def _collect(events: AsyncGenerator[Event, None], duration: float) -> TranscriptResult:
    pieces: list[SegmentText] = []
    async with aclosing(events):
        async for event in events:
            if isinstance(event, SegmentText):
                if event.done.failure is not None:
                    raise event.done.failure
                pieces.append(event)
    return TranscriptResult(tuple(pieces), duration)


async def _sse(events: AsyncGenerator[Event, None]) -> AsyncIterator[str]:
    joiner = DeltaJoiner()
    usage = Usage(0, 0)
    async with aclosing(events):
        async for event in events:
            if isinstance(event, SegmentDelta):
                if delta := joiner.feed(event.index, event.text):
                    yield sse_event(TranscriptTextDelta(delta=delta))
                continue
            if event.done.failure is not None:
                yield sse_event(ErrorResponse(error=event.done.failure.detail))
                return
            usage = Usage(usage.prompt_tokens + event.done.usage.prompt_tokens,
                          usage.completion_tokens + event.done.usage.completion_tokens)
    yield sse_event(TranscriptTextDone(text=joiner.text, usage=token_usage(usage)))
