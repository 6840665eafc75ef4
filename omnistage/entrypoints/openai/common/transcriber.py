"""Speech to text: one text-only request per piece of audio, to a speech recogniser or to the thinker itself.

A family whose model is a recogniser (Qwen3-ASR) gives a ``FrontEnd.transcriber`` that makes the prompt as its
model was trained (the language forced, the caller's context) and reads its reply (markup held back). Otherwise
the thinker hears audio, so a piece of
audio is written down by a request whose system turn asks for the transcript (or
an English translation) and whose user turn is the audio alone. The request asks
for text only, so the talker and code2wav never see it; it is greedy unless the
caller sets a temperature, and its length is bounded by the audio's. The realtime
session's input transcription and ``/v1/audio/transcriptions`` share this core.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncGenerator
from contextlib import aclosing
from dataclasses import dataclass

import numpy as np

from omnistage.core import Modality, OmniRequest, Usage
from omnistage.entrypoints.openai.common.admission import Ticket
from omnistage.entrypoints.openai.common.decode_pool import CancelToken
from omnistage.entrypoints.openai.common.errors import APIError
from omnistage.entrypoints.openai.common.http_spans import traced
from omnistage.entrypoints.openai.common.request_checks import completion_budget, engine_failure, make_sampling
from omnistage.entrypoints.openai.common.streaming import engine_outputs
from omnistage.entrypoints.openai.engine_protocol import OmniEngine
from omnistage.families.base import FrontEnd
from omnistage.processing.prompt import AUDIO_SAMPLE_RATE, ProcessedPrompt
from omnistage.processing.transcription import PlainReply, ReplyReader

TRANSCRIBE_INSTRUCTIONS = "Transcribe the user's audio verbatim. Reply with the transcript only."
TRANSLATE_INSTRUCTIONS = ("Translate the speech in the user's audio into English. "
                          "Reply with the English translation only.")
TOKENS_PER_SECOND = 8  # generous for speech (about 3 words a second)
BASE_TOKENS = 16  # room for a short piece's words and the end of turn


def instructions(translate: bool = False, language: str | None = None, context: str | None = None) -> str:
    """The system turn: the task, the audio's language when the caller knows it, and the caller's context
    (OpenAI's ``prompt``: earlier text whose spelling and style the transcript should follow)."""
    text = TRANSLATE_INSTRUCTIONS if translate else TRANSCRIBE_INSTRUCTIONS
    if language:
        text += f" The audio is in the language with ISO-639-1 code '{language}'."
    if context:
        text += f" Follow the spelling and style of this earlier text: {context}"
    return text


@dataclass(frozen=True)
class TranscriptionAsk:
    """One piece of audio to write down (16 kHz mono float32) and how."""

    audio: np.ndarray
    instructions: str = TRANSCRIBE_INSTRUCTIONS
    temperature: float = 0.0
    logprobs: bool = False  # the sampled tokens' log-probabilities (a segment's ``avg_logprob``)
    language: str | None = None  # the caller's (a recogniser forces it; the thinker reads it in ``instructions``)
    context: str | None = None  # OpenAI's ``prompt`` (a recogniser's context; the thinker's is in ``instructions``)
    prefix: str = ""  # the transcript's opening, already sent to the client: the reply continues it

    @property
    def seconds(self) -> float:
        return len(self.audio) / AUDIO_SAMPLE_RATE


def render_transcription(front_end: FrontEnd, ask: TranscriptionAsk, token: CancelToken) -> ProcessedPrompt:
    """The prompt (the recogniser's, or the thinker's chat template; audio features) as a ``DecodePool`` job."""
    token.check()
    if front_end.transcriber is not None:
        return front_end.transcriber.transcription_prompt(ask.audio, ask.language, ask.context, ask.prefix)
    processor = front_end.processor
    if processor is None:
        raise TypeError("this model has neither a transcriber nor a chat processor")
    messages: list[dict[str, object]] = [{"role": "system", "content": ask.instructions},
                                         {"role": "user", "content": [{"type": "audio"}]}]
    ids = processor.apply_chat_template(messages, assistant_prefix=ask.prefix)
    return processor.process(ids, audios=[ask.audio])


TRANSCRIPTION_MODALITIES = frozenset({Modality.TEXT})  # a transcript is the thinker's text alone


def transcription_request(engine: OmniEngine, prompt: ProcessedPrompt, ask: TranscriptionAsk,
                          request_id: str | None = None, param: str = "file") -> OmniRequest:
    """A text-only thinker request for ``prompt``, its completion bounded by the audio's length (``param``: the
    request field a context overflow is blamed on)."""
    budget = completion_budget(int(BASE_TOKENS + TOKENS_PER_SECOND * ask.seconds), len(prompt.token_ids),
                               engine.max_model_len, param)
    sampling = make_sampling(max_tokens=budget, temperature=ask.temperature, logprobs=0 if ask.logprobs else None)
    # Under the HTTP request's span when traced (a realtime session's transcription has none: a trace of its own).
    return traced(OmniRequest(request_id or f"transcribe-{uuid.uuid4().hex}", prompt, TRANSCRIPTION_MODALITIES,
                              sampling))


@dataclass(frozen=True)
class TranscriptDelta:
    text: str


@dataclass(frozen=True)
class TranscriptDone:
    """How one piece ended: its whole text (stripped), the thinker's tokens and their log-probabilities,
    the usage, or the failure to answer with instead."""

    text: str
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    usage: Usage
    failure: APIError | None = None
    language: str | None = None  # the language the reply named (a recogniser's detection), if it named one


def reply_reader(front_end: FrontEnd, ask: TranscriptionAsk) -> ReplyReader:
    """How one reply is read: the recogniser's reader (its markup held back), or as it stands."""
    if front_end.transcriber is not None:
        return front_end.transcriber.reader(forced=ask.language is not None)
    return PlainReply()


async def transcript_events(engine: OmniEngine, request: OmniRequest, *, timeout_s: float | None,
                            ticket: Ticket | None = None, reader: ReplyReader | None = None,
                            ) -> AsyncGenerator[TranscriptDelta | TranscriptDone, None]:
    """The request's text deltas as they come (through ``reader``), then one ``TranscriptDone``."""
    reader = reader or PlainReply()
    texts: list[str] = []
    token_ids: list[int] = []
    logprobs: list[float] = []
    final = None
    async with aclosing(engine_outputs(engine, request, timeout_s=timeout_s, ticket=ticket)) as outputs:
        async for out in outputs:
            final = out
            token_ids.extend(out.token_ids)
            logprobs.extend(lp.logprob for lp in out.logprobs)
            if out.text and (text := reader.feed(out.text)):
                texts.append(text)
                yield TranscriptDelta(text)
    failure = engine_failure(final)
    usage = final.usage if final is not None and final.usage is not None else \
        Usage(len(request.prompt.token_ids), len(token_ids))
    yield TranscriptDone("".join(texts).strip(), tuple(token_ids), tuple(logprobs), usage, failure, reader.language)
