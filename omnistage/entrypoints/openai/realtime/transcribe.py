"""Input audio transcription for a realtime session, by the thinker itself.

A committed user audio item is written down by a text-only thinker request
(``common/transcriber.py``, shared with ``/v1/audio/transcriptions``). The
transcript streams as ``conversation.item.input_audio_transcription.delta``
events and ends with ``.completed`` (or ``.failed``); it runs beside the
session's responses under the same admission bound.
"""

from __future__ import annotations

from contextlib import aclosing
from typing import TYPE_CHECKING

import numpy as np

from omnistage.entrypoints.openai.common.transcriber import (
    TRANSCRIBE_INSTRUCTIONS,
    TranscriptDone,
    TranscriptionAsk,
    render_transcription,
    reply_reader,
    transcript_events,
    transcription_request,
)
from omnistage.entrypoints.openai.realtime.items import Item
from omnistage.entrypoints.openai.realtime.protocol import EventError, new_id, server_event, transcript_usage

if TYPE_CHECKING:
    from omnistage.entrypoints.openai.realtime.session_loop import RealtimeSession

__all__ = ["TRANSCRIBE_INSTRUCTIONS", "transcribe"]


def _failed(ids: dict[str, object], error_type: str, code: str, message: str) -> str:
    return server_event("conversation.item.input_audio_transcription.failed", **ids,
                        error={"type": error_type, "code": code, "message": message})


def _ask(session: RealtimeSession, audio: np.ndarray) -> TranscriptionAsk:
    """The session's transcription settings: a recogniser takes its ``language`` and ``prompt`` in its own prompt."""
    settings = session.state.config.transcription or {}
    language, context = settings.get("language"), settings.get("prompt")
    return TranscriptionAsk(audio, TRANSCRIBE_INSTRUCTIONS, language=language if isinstance(language, str) else None,
                            context=context if isinstance(context, str) else None)


async def transcribe(session: RealtimeSession, item: Item) -> None:
    ids: dict[str, object] = {"item_id": item.id, "content_index": 0}
    try:
        ticket = session.admit(None)
    except EventError as exc:
        await session.send(_failed(ids, exc.error_type, exc.code, str(exc)))
        return
    try:
        audio = item.audio if item.audio is not None else np.zeros(0, np.float32)
        ask = _ask(session, audio)
        prompt = await session.service.pool.run(render_transcription, session.engine.front_end, ask)
        request = transcription_request(session.engine, prompt, ask, new_id("transcribe"), param="audio")
    except Exception as exc:  # noqa: BLE001 - reported to the client; the session goes on
        ticket.release()
        await session.send(_failed(ids, "server_error", "transcription_failed", str(exc)))
        return
    events = transcript_events(session.engine, request, timeout_s=session.limits.request_timeout, ticket=ticket,
                               reader=reply_reader(session.engine.front_end, ask))
    async with aclosing(events):
        async for event in events:
            if not isinstance(event, TranscriptDone):
                await session.send(server_event("conversation.item.input_audio_transcription.delta", **ids,
                                                delta=event.text))
            elif event.failure is not None:
                await session.send(_failed(ids, "server_error", "transcription_failed",
                                           event.failure.detail.message))
            else:
                item.transcript = event.text
                await session.send(server_event("conversation.item.input_audio_transcription.completed", **ids,
                                                transcript=event.text, usage=transcript_usage(event.usage)))
