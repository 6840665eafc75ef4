"""The speech stream's text-delta mode: the session's text is one utterance, spoken as it is written.

For a family whose front end takes text deltas (``SpeechFrontEnd.takes_text_deltas``: Qwen3-TTS's dual-track
talker). Its :class:`~omnistage.families.speech.SpokenText` tokenizes the pieces as they come (in the decode
pool); the request opens on the first words the model can start from, and every later piece's ids are fed to the
running request (``OmniEngine.feed``) while its audio streams back, so the first audio follows the first words,
not the first sentence end. The end of the text (``input_text.done``) ends the utterance; a cancel stops its audio
at once (the request is aborted; no chunk is sent after it). The audio is the session's one segment (index 0),
told as the segmenting mode tells each of its segments.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from functools import partial

from omnistage.core import OmniRequest
from omnistage.entrypoints.openai.common.admission import Ticket
from omnistage.entrypoints.openai.common.decode_pool import CancelToken
from omnistage.entrypoints.openai.common.errors import bad_request
from omnistage.entrypoints.openai.speech.protocol import SpeechRequest
from omnistage.entrypoints.openai.speech.service import SpeechService
from omnistage.entrypoints.openai.speech.stream_audio import stream_audio
from omnistage.entrypoints.openai.speech.stream_dialect import StreamDialect, TextIn
from omnistage.families.speech import SpokenText, TextStep

# The first chunk's audio: small, so the first audio waits for few words (each frame needs its text row), and
# enough to play while the next chunk is made at the text's pace. On tts-tiny at 20 LLM tokens a second (a busy
# 2-core machine), 0.24 s gave underruns of up to 128 ms in 4 of 5 sessions, 0.32 s in 1 of 5 at the same first
# audio (p50 ~175 ms): the text comes faster than the frames the extra one waits for.
FIRST_CHUNK_S = 0.32


def _add_job(spoken: SpokenText, text: str, done: bool, token: CancelToken) -> TextStep:
    return spoken.add(text, done)


@dataclass
class DeltaUtterance:
    """One session's utterance: ``speak`` reads its text pieces from a queue (``end``: the queue's last item) and
    returns once its audio has all been sent; ``stopped``: set by a cancel, no audio is sent after it."""

    service: SpeechService
    dialect: StreamDialect
    body: SpeechRequest
    stopped: asyncio.Event
    text: str = ""
    usage: list[int] = field(default_factory=lambda: [0, 0])
    reader: asyncio.Task[None] | None = None
    request_id: str | None = None

    async def speak(self, pieces: asyncio.Queue[object], end: object) -> int:
        """Segments spoken: 1 once the request opened, else 0."""
        spoken, voice = await self.service.inputs.spoken_text(self.body)
        try:
            while (event := await pieces.get()) is not end and not self.stopped.is_set():
                if not isinstance(event, TextIn):
                    raise TypeError(f"a text-delta session queues text, not {type(event).__name__}")
                await self._take(spoken, voice, event)
                if self.reader is not None and self.reader.done() and not self.reader.cancelled():
                    # A failure is said now; an utterance that ended takes no more text. A reader a cancel stopped
                    # meanwhile is no failure (its result() would raise CancelledError out of the socket).
                    self.reader.result()
            if self.reader is not None:
                # A cancel's stop() cancels the reader: waited for, not awaited, so that is no error here.
                await asyncio.wait({self.reader})
                if not self.reader.cancelled():
                    self.reader.result()
        finally:
            await self.stop()
        return 1 if self.reader is not None else 0

    async def _take(self, spoken: SpokenText, voice: str | None, event: TextIn) -> None:
        try:
            step = await self.service.pool.run(_add_job, spoken, event.text, event.done)
        except ValueError as exc:
            raise bad_request(str(exc), param="input") from exc
        self.text += event.text
        if step.opening is not None:
            audio = self.service.engine.front_end.audio
            first = max(1, round(FIRST_CHUNK_S / audio.frame_s)) if audio is not None else None
            request = self.service.inputs.speak(self.body, step.opening, spoken.max_frames(step.opening), voice,
                                                first_chunk_frames=first, open_input=not event.done)
            await self._open(request)
        if step.more is not None and self.request_id is not None:
            self.service.engine.feed(self.request_id, step.more)

    async def _open(self, request: OmniRequest) -> None:
        ticket = self.service.admission.admit()
        await self.dialect.segment_started(0, self.text, self.body)
        self.request_id = request.request_id
        self.reader = asyncio.create_task(self._read(request, ticket))
        # The engine submits a request when its stream is first advanced, before it first waits: one pass of the
        # loop runs the reader's first step, so what is fed next reaches the pipeline after the request.
        await asyncio.sleep(0)

    async def _read(self, request: OmniRequest, ticket: Ticket) -> None:
        size, usage = await stream_audio(self.service, request, self.body, ticket, partial(self.dialect.audio, 0),
                                         self.stopped)
        if usage is not None:
            self.usage = [usage.prompt_tokens, usage.completion_tokens]
        if not self.stopped.is_set():
            await self.dialect.segment_done(0, self.text.strip(), size)

    async def stop(self) -> None:
        """Ends the audio now (a cancel, or the session going): the reader's stream closes, aborting the request."""
        reader = self.reader
        if reader is not None and not reader.done():
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader
