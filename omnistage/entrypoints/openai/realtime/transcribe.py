"""Input audio transcription for a realtime session, by a speech recogniser or the thinker itself.

A committed user audio item is written down by a text-only request
(``common/transcriber.py``, shared with ``/v1/audio/transcriptions``). The
transcript streams as ``conversation.item.input_audio_transcription.delta``
events and ends with ``.completed`` (or ``.failed``); it runs beside the
session's responses under the same admission bound. When the turn was written
down while it was spoken (``live_transcript.py``), this run continues what was
sent then, so every delta of the item joins into its ``.completed`` transcript.
"""

from __future__ import annotations

from contextlib import aclosing
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from omnistage.entrypoints.openai.common.admission import Admission, Overloaded
from omnistage.entrypoints.openai.common.transcriber import (
    TRANSCRIBE_INSTRUCTIONS,
    TRANSCRIPTION_MODALITIES,
    TranscriptDone,
    TranscriptionAsk,
    render_transcription,
    reply_reader,
    transcript_events,
    transcription_request,
)
from omnistage.entrypoints.openai.engine_protocol import OmniEngine
from omnistage.entrypoints.openai.realtime.items import Item
from omnistage.entrypoints.openai.realtime.protocol import new_id, server_event, transcript_usage

if TYPE_CHECKING:
    from omnistage.entrypoints.openai.realtime.session_loop import RealtimeSession

__all__ = ["TRANSCRIBE_INSTRUCTIONS", "Opening", "ask_for", "transcribe", "writer_of"]


def _failed(ids: dict[str, object], error_type: str, code: str, message: str) -> str:
    return server_event("conversation.item.input_audio_transcription.failed", **ids,
                        error={"type": error_type, "code": code, "message": message})


@dataclass(frozen=True)
class Opening:
    """A turn's transcript as sent while it was spoken (``live_transcript.py``), and the language it was written
    in (a recogniser's, once it named one): the turn's later runs continue it."""

    text: str = ""
    language: str | None = None


def writer_of(session: RealtimeSession) -> tuple[OmniEngine, Admission]:
    """The model that writes the session's turns down, and its admission: the recogniser served beside the model
    (``serve --transcription-model``) when the session's transcription ``model`` names it, else the session's own
    model (a recogniser's own sessions, or the thinker asked for a transcript)."""
    settings = session.state.config.transcription or {}
    recogniser = session.service.recogniser
    if recogniser is not None and recogniser.serves(settings.get("model")):
        return recogniser.engine, recogniser.admission
    return session.engine, session.service.admission


def ask_for(session: RealtimeSession, audio: np.ndarray, opening: Opening = Opening()) -> TranscriptionAsk:
    """The session's transcription settings: a recogniser takes its ``language`` and ``prompt`` in its own prompt;
    ``opening``: what the reply continues (in its language, unless the session forces one)."""
    settings = session.state.config.transcription or {}
    language, context = settings.get("language"), settings.get("prompt")
    language = language if isinstance(language, str) else opening.language
    return TranscriptionAsk(audio, TRANSCRIBE_INSTRUCTIONS, language=language,
                            context=context if isinstance(context, str) else None, prefix=opening.text)


async def transcribe(session: RealtimeSession, item: Item, opening: Opening = Opening()) -> None:
    """Writes down the committed ``item``, continuing ``opening`` (its deltas already sent): the deltas, then
    ``.completed`` with the whole transcript."""
    ids: dict[str, object] = {"item_id": item.id, "content_index": 0}
    engine, admission = writer_of(session)
    try:
        ticket = admission.admit(TRANSCRIPTION_MODALITIES)
    except Overloaded as exc:
        await session.send(_failed(ids, "server_error", exc.detail.code or "overloaded", exc.detail.message))
        return
    try:
        audio = item.audio if item.audio is not None else np.zeros(0, np.float32)
        ask = ask_for(session, audio, opening)
        prompt = await session.service.pool.run(render_transcription, engine.front_end, ask)
        request = transcription_request(engine, prompt, ask, new_id("transcribe"), param="audio")
    except Exception as exc:  # noqa: BLE001 - reported to the client; the session goes on
        ticket.release()
        await session.send(_failed(ids, "server_error", "transcription_failed", str(exc)))
        return
    events = transcript_events(engine, request, timeout_s=session.limits.request_timeout, ticket=ticket,
                               reader=reply_reader(engine.front_end, ask))
    texts = [opening.text]
    async with aclosing(events):
        async for event in events:
            if not isinstance(event, TranscriptDone):
                delta = event.text if "".join(texts) else event.text.lstrip()
                if not delta:
                    continue
                texts.append(delta)
                await session.send(server_event("conversation.item.input_audio_transcription.delta", **ids,
                                                delta=delta))
            elif event.failure is not None:
                await session.send(_failed(ids, "server_error", "transcription_failed",
                                           event.failure.detail.message))
            else:
                item.transcript = "".join(texts).strip()
                await session.send(server_event("conversation.item.input_audio_transcription.completed", **ids,
                                                transcript=item.transcript, usage=transcript_usage(event.usage)))
