"""The stream events of ``/v1/responses`` (``openai.types.responses.ResponseStreamEvent``'s members that this
server sends), each with its ``sequence_number``. ``response.audio.*`` carry the spoken answer when a request
asks for it with the ``modalities`` extension: OpenAI's stream union declares those events, its ``Response`` has
no place for audio."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

from omnistage.entrypoints.openai.responses.protocol import OutputItem, OutputText, ResponseObject


class _Event(BaseModel):
    sequence_number: int


class ResponseLifecycle(_Event):
    """created, in_progress, and the one that ends the stream: completed, incomplete or failed."""

    type: Literal["response.created", "response.in_progress", "response.completed", "response.incomplete",
                  "response.failed"]
    response: ResponseObject


class OutputItemEvent(_Event):
    type: Literal["response.output_item.added", "response.output_item.done"]
    output_index: int
    item: OutputItem


class ContentPartEvent(_Event):
    type: Literal["response.content_part.added", "response.content_part.done"]
    item_id: str
    output_index: int
    content_index: int = 0
    part: OutputText


class TextDelta(_Event):
    type: Literal["response.output_text.delta"] = "response.output_text.delta"
    item_id: str
    output_index: int
    content_index: int = 0
    delta: str
    logprobs: list[dict[str, object]] = []


class TextDone(_Event):
    type: Literal["response.output_text.done"] = "response.output_text.done"
    item_id: str
    output_index: int
    content_index: int = 0
    text: str
    logprobs: list[dict[str, object]] = []


class ArgumentsDelta(_Event):
    type: Literal["response.function_call_arguments.delta"] = "response.function_call_arguments.delta"
    item_id: str
    output_index: int
    delta: str


class ArgumentsDone(_Event):
    type: Literal["response.function_call_arguments.done"] = "response.function_call_arguments.done"
    item_id: str
    output_index: int
    arguments: str


class AudioDelta(_Event):
    type: Literal["response.audio.delta", "response.audio.transcript.delta"]
    delta: str  # base64 PCM16 at 24 kHz, or transcript text


class AudioDone(_Event):
    type: Literal["response.audio.done", "response.audio.transcript.done"]


ResponseEvent = (ResponseLifecycle | OutputItemEvent | ContentPartEvent | TextDelta | TextDone | ArgumentsDelta
                 | ArgumentsDone | AudioDelta | AudioDone)
