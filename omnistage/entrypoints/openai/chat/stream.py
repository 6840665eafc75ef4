"""The SSE chunks of one streamed chat completion, choice by choice.

Streaming speech: OpenAI only streams ``pcm16``, so a request for ``wav`` or
``pcm16`` streams raw base64 PCM16 (24 kHz mono) chunks in ``delta.audio.data``,
as OpenAI does; a client wanting a WAV file wraps the concatenation in a header.
``mp3``, ``flac``, ``opus`` and ``aac`` stream successive pieces of one encoded
file, so the concatenated chunks decode as that format. Text goes in
``delta.content``; when speech is requested it is repeated in
``delta.audio.transcript``, where OpenAI's audio clients read it. Tool calls go in
``delta.tool_calls`` (never in the transcript, never spoken). Each chunk says
what it carries in ``modality`` ("text" or "audio"), as vLLM-Omni's clients read.
"""

from __future__ import annotations

import base64
import json
import time
import uuid

import msgspec

from omnistage.audio import AudioFormat, StreamingAudioEncoder
from omnistage.core import FinishReason, OmniOutput
from omnistage.core import Usage
from omnistage.entrypoints.openai.chat.logprobs import LogprobWriter
from omnistage.entrypoints.openai.chat.protocol import (
    ChatCompletionChunk,
    ChoiceDelta,
    ChunkChoice,
    DeltaAudio,
    DeltaFunctionCall,
    DeltaToolCall,
    FinishReasonName,
    PromptTokensDetails,
    UsageInfo,
)
from omnistage.entrypoints.openai.chat.request import ChatPlan
from omnistage.entrypoints.openai.common.errors import SERVER_ERROR, APIError
from omnistage.entrypoints.openai.common.protocol import ErrorDetail, ErrorResponse
from omnistage.entrypoints.openai.common.streaming import sse_event
from omnistage.entrypoints.openai.common.tool_calls import ParsedCall, ToolCallParser

# Audio is not kept, but OpenAI's clients expect an expiry; an hour is what OpenAI gives.
AUDIO_TTL_S = 3600
_TEXT_TAIL = '}],"modality":"text"}\n\n'
_AUDIO_TAIL = '}],"modality":"audio"}\n\n'


def _json_string(text: str) -> str:
    """A string as JSON, as ``_json`` writes it (msgspec: the per-token path; ``json.dumps``' Python layers cost
    several times the encoding)."""
    return msgspec.json.encode(text).decode()


def _json(value: object) -> str:
    """Compact JSON as pydantic writes it (UTF-8 kept, no spaces)."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def finish_reason_name(reason: FinishReason | None, called_tools: bool = False) -> FinishReasonName:
    if reason is FinishReason.LENGTH:
        return "length"
    return "tool_calls" if called_tools else "stop"


def usage_info(usage: Usage) -> UsageInfo:
    return UsageInfo(prompt_tokens=usage.prompt_tokens, completion_tokens=usage.completion_tokens,
                     total_tokens=usage.total_tokens,
                     prompt_tokens_details=PromptTokensDetails(cached_tokens=usage.cached_tokens))


def delta_calls(calls: list[ParsedCall]) -> list[DeltaToolCall]:
    return [DeltaToolCall(index=c.index, id=c.id, type="function",
                          function=DeltaFunctionCall(name=c.name, arguments=c.arguments)) for c in calls]


class _Choice:
    """One choice's stream state: its tool-call parser, audio encoder and audio id."""

    def __init__(self, index: int, plan: ChatPlan) -> None:
        self.index = index
        self.parser: ToolCallParser | None = plan.tools.parser()
        self.audio_id = f"audio_{uuid.uuid4().hex}"
        self.head: str | None = None  # the start of its chunks up to the delta (``ChunkWriter._head``)
        self.audio_frame: tuple[bytes, bytes] | None = None  # around an audio chunk's data (``_audio_frame``)
        self.encoder: StreamingAudioEncoder | None = None
        if plan.audio is not None:
            streamed = AudioFormat.PCM16 if plan.audio.format in (AudioFormat.WAV, AudioFormat.PCM16) \
                else plan.audio.format
            self.encoder = StreamingAudioEncoder(streamed, plan.audio.source_rate)

    @property
    def called_tools(self) -> bool:
        return bool(self.parser and self.parser.calls)


class ChunkWriter:
    def __init__(self, request_id: str, model: str, plan: ChatPlan, logprobs: LogprobWriter | None) -> None:
        self.request_id, self.model, self.plan = request_id, model, plan
        self.created = int(time.time())
        self.logprobs = logprobs
        self.choices = [_Choice(i, plan) for i in range(plan.choices)]

    def _chunk(self, index: int, delta: ChoiceDelta, finish: str | None = None, modality: str = "text",
               out: OmniOutput | None = None) -> str:
        logprobs = self.logprobs.choice(out.logprobs) if self.logprobs and out is not None and out.logprobs else None
        chunk = ChatCompletionChunk(id=self.request_id, created=self.created, model=self.model, modality=modality,
                                    choices=[ChunkChoice(index=index, delta=delta, finish_reason=finish,
                                                         logprobs=logprobs)])
        return sse_event(chunk)

    def start(self) -> list[str]:
        return [self._chunk(c.index, ChoiceDelta(role="assistant", content="")) for c in self.choices]

    def output(self, index: int, out: OmniOutput) -> list[str | bytes]:
        choice = self.choices[index]
        text, calls = choice.parser.feed(out.text) if choice.parser is not None else (out.text, [])
        events = self._text(choice, text, calls, out)
        if choice.encoder is not None and out.audio is not None and out.audio.size:
            # Encoding a chunk takes milliseconds; a thread hop would cost about as much. Its event is written
            # around the base64 text as it is made (no copy of the long string per step).
            event = choice.encoder.feed_base64(out.audio, *self._audio_frame(choice))
            if event:
                events.append(event)
        return events

    def _plain_text(self, choice: _Choice, text: str) -> str:
        """A text delta's chunk (no logprobs, no tool call), the one a stream sends per token: the same JSON as
        ``_chunk`` writes, without building its models (the text encoded once, the rest written around it; a
        chunk's models cost several times that, every token of every stream)."""
        quoted = _json_string(text)
        content = f'"content":{quoted}' if self.plan.text else ""
        if not self.plan.audio:
            return f"{self._head(choice)}{{{content}}}{_TEXT_TAIL}"
        comma = "," if content else ""
        return (f'{self._head(choice)}{{{content}{comma}"audio":{{"id":{_json_string(choice.audio_id)},'
                f'"transcript":{quoted}}}}}{_TEXT_TAIL}')

    def _head(self, choice: _Choice) -> str:
        """The start of a choice's chunks up to its delta, the same every time."""
        if choice.head is None:
            choice.head = (f'data: {{"id":{_json(self.request_id)},"object":"chat.completion.chunk",'
                           f'"created":{self.created},"model":{_json(self.model)},'
                           f'"choices":[{{"index":{choice.index},"delta":')
        return choice.head

    def _text(self, choice: _Choice, text: str, calls: list[ParsedCall],
              out: OmniOutput | None = None) -> list[str | bytes]:
        events: list[str | bytes] = []
        if text and not calls and not (out is not None and out.logprobs and self.logprobs):
            return [self._plain_text(choice, text)]
        if text or (out is not None and out.logprobs and self.logprobs):
            transcript = DeltaAudio(id=choice.audio_id, transcript=text) if self.plan.audio and text else None
            content = text if self.plan.text else None
            events.append(self._chunk(choice.index, ChoiceDelta(content=content, audio=transcript), out=out))
        if calls:
            events.append(self._chunk(choice.index, ChoiceDelta(tool_calls=delta_calls(calls))))
        return events

    def end(self, index: int, out: OmniOutput) -> list[str | bytes]:
        """A choice's closing events after its final output (checked for failure by the caller)."""
        choice = self.choices[index]
        events: list[str | bytes] = self._text(choice, *choice.parser.finish()) if choice.parser is not None else []
        if choice.encoder is not None:
            events += self._audio_data(choice, choice.encoder.finish())
            expiry = DeltaAudio(id=choice.audio_id, expires_at=int(time.time()) + AUDIO_TTL_S)
            events.append(self._chunk(index, ChoiceDelta(audio=expiry), modality="audio"))
        reason = finish_reason_name(out.finish_reason, choice.called_tools)
        events.append(self._chunk(index, ChoiceDelta(), finish=reason))
        return events

    def usage(self, usage: Usage) -> str:
        return sse_event(ChatCompletionChunk(id=self.request_id, created=self.created, model=self.model,
                                             choices=[], usage=usage_info(usage)))

    @staticmethod
    def error(failure: APIError | None) -> str:
        detail = failure.detail if failure is not None else ErrorDetail(message="unknown error", type=SERVER_ERROR)
        return sse_event(ErrorResponse(error=detail))

    def _audio_data(self, choice: _Choice, data: bytes) -> list[bytes]:
        """An audio piece's chunk, written directly as ``_plain_text`` writes text (base64 needs no JSON escaping,
        and the models would copy and scan each piece's long string)."""
        if not data:
            return []
        head, tail = self._audio_frame(choice)
        return [b"".join((head, base64.b64encode(data), tail))]

    def _audio_frame(self, choice: _Choice) -> tuple[bytes, bytes]:
        """What an audio chunk's event holds before and after its base64 data, the same every time."""
        if choice.audio_frame is None:
            head = f'{self._head(choice)}{{"audio":{{"id":{_json(choice.audio_id)},"data":"'
            choice.audio_frame = (head.encode(), f'"}}}}{_AUDIO_TAIL}'.encode())
        return choice.audio_frame
