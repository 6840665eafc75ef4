"""One request's audio on a speech stream: its engine outputs encoded in the session's format as they come, each
piece told to the client (``send``); what both of the stream's modes (a sentence, an utterance) speak with."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from contextlib import aclosing

from omnistage.audio import StreamingAudioEncoder, TimeStretcher
from omnistage.core import OmniRequest, Usage
from omnistage.entrypoints.openai.common.admission import Ticket
from omnistage.entrypoints.openai.common.request_checks import engine_failure
from omnistage.entrypoints.openai.common.served_model import audio_rate
from omnistage.entrypoints.openai.common.streaming import engine_outputs
from omnistage.entrypoints.openai.speech.protocol import SpeechRequest
from omnistage.entrypoints.openai.speech.service import SpeechService


async def stream_audio(service: SpeechService, request: OmniRequest, body: SpeechRequest, ticket: Ticket,
                       send: Callable[[bytes], Awaitable[None]], stopped: asyncio.Event | None = None,
                       ) -> tuple[int, Usage | None]:
    """Bytes sent and the request's usage. A failed request raises its error; once ``stopped`` is set nothing more
    is sent and the stream is closed, which aborts the request."""
    encoder = StreamingAudioEncoder(body.audio_format, audio_rate(service.engine))
    stretcher = TimeStretcher(body.speed)
    size, usage = 0, None
    async with aclosing(engine_outputs(service.engine, request, timeout_s=service.limits.request_timeout,
                                       ticket=ticket)) as outputs:
        async for out in outputs:
            if stopped is not None and stopped.is_set():
                break
            pieces = [encoder.feed(stretcher.feed(out.audio))] if out.audio is not None and out.audio.size else []
            if out.finished:
                failure = engine_failure(out)
                if failure is not None:
                    raise failure
                pieces.append(encoder.feed(stretcher.finish()) + encoder.finish())
                usage = out.usage
            for piece in filter(None, pieces):
                size += len(piece)
                await send(piece)
    return size, usage
