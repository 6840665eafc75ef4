"""Input audio transcription for a realtime session, by the thinker itself.

There is no separate speech recogniser: the thinker hears audio, so a committed
user audio item is transcribed by a text-only request asking it to write the
audio down verbatim (greedy, its length bounded by the audio's). The transcript
streams as ``conversation.item.input_audio_transcription.delta`` events and ends
with ``.completed`` (or ``.failed``); it runs beside the session's responses
under the same admission bound.
"""

from __future__ import annotations

from contextlib import aclosing
from typing import TYPE_CHECKING

from omnistage.core import Modality, OmniRequest
from omnistage.entrypoints.openai.common.request_checks import completion_budget, engine_failure, make_sampling
from omnistage.entrypoints.openai.common.streaming import engine_outputs
from omnistage.entrypoints.openai.realtime.conversation import PromptSpec, render_prompt_job
from omnistage.entrypoints.openai.realtime.items import Item
from omnistage.entrypoints.openai.realtime.protocol import EventError, new_id, server_event
from omnistage.processing.prompt import AUDIO_SAMPLE_RATE

if TYPE_CHECKING:
    from omnistage.entrypoints.openai.realtime.session_loop import RealtimeSession

TRANSCRIBE_INSTRUCTIONS = "Transcribe the user's audio verbatim. Reply with the transcript only."
TOKENS_PER_SECOND = 8  # generous for speech (about 3 words a second)


async def transcribe(session: RealtimeSession, item: Item) -> None:
    ids = {"item_id": item.id, "content_index": 0}
    try:
        ticket = session.admit(None)
    except EventError as exc:
        await session.send(server_event("conversation.item.input_audio_transcription.failed", **ids,
                                        error={"type": exc.error_type, "code": exc.code, "message": str(exc)}))
        return
    try:
        user = Item(item.id, "message", role="user", audio=item.audio)
        spec = PromptSpec(TRANSCRIBE_INSTRUCTIONS, (user,))
        prompt = await session.service.pool.run(render_prompt_job, session.engine.processor, spec)
        seconds = 0.0 if item.audio is None else len(item.audio) / AUDIO_SAMPLE_RATE
        budget = completion_budget(int(16 + TOKENS_PER_SECOND * seconds), len(prompt.token_ids),
                                   session.engine.max_model_len, "audio")
        request = OmniRequest(new_id("transcribe"), prompt, frozenset({Modality.TEXT}),
                              make_sampling(max_tokens=budget, temperature=0.0))
    except Exception as exc:  # noqa: BLE001 - reported to the client; the session goes on
        ticket.release()
        await session.send(server_event("conversation.item.input_audio_transcription.failed", **ids,
                                        error={"type": "server_error", "code": "transcription_failed",
                                               "message": str(exc)}))
        return
    texts: list[str] = []
    final = None
    async with aclosing(engine_outputs(session.engine, request, timeout_s=session.limits.request_timeout,
                                       ticket=ticket)) as outputs:
        async for out in outputs:
            final = out
            if out.text:
                texts.append(out.text)
                await session.send(server_event("conversation.item.input_audio_transcription.delta", **ids,
                                                delta=out.text))
    failure = engine_failure(final)
    if failure is not None:
        await session.send(server_event("conversation.item.input_audio_transcription.failed", **ids,
                                        error={"type": "server_error", "code": "transcription_failed",
                                               "message": failure.detail.message}))
        return
    item.transcript = "".join(texts).strip()
    await session.send(server_event("conversation.item.input_audio_transcription.completed", **ids,
                                    transcript=item.transcript))
