"""One response's events in OpenAI's order, built from the engine's outputs; the response object they describe.

The same writer serves both shapes: a streamed request sends every event as it is made, a whole one answers with
the final ``response``. Text opens a ``message`` item (``output_item.added``, ``content_part.added``) and each
delta is an ``output_text.delta``; a tool call (parsed as the chat endpoint parses it, whole once its closing tag
arrives) closes the open message and is a ``function_call`` item of its own, its arguments in one delta. At the
end the open message closes (``output_text.done``, ``content_part.done``, ``output_item.done``) and the last
event says how it ended: ``response.completed``, ``response.incomplete`` (``max_output_tokens`` reached) or
``response.failed``.
"""

from __future__ import annotations

import time
import uuid

from omnistage.audio.pcm16 import pcm16_base64
from omnistage.core import FinishReason, OmniOutput, Usage
from omnistage.entrypoints.openai.common.tool_calls import ParsedCall, ToolCallParser
from omnistage.entrypoints.openai.responses.events import (
    ArgumentsDelta,
    ArgumentsDone,
    AudioDelta,
    AudioDone,
    ContentPartEvent,
    OutputItemEvent,
    ResponseEvent,
    ResponseLifecycle,
    TextDelta,
    TextDone,
)
from omnistage.entrypoints.openai.responses.protocol import (
    FunctionCallOut,
    IncompleteDetails,
    InputTokensDetails,
    OutputMessage,
    OutputText,
    ResponseErrorInfo,
    ResponseObject,
    ResponseUsage,
)


def sse(event: ResponseEvent) -> str:
    """OpenAI's framing: the event's type as the SSE event name, the event as its data."""
    return f"event: {event.type}\ndata: {event.model_dump_json()}\n\n"


def response_usage(usage: Usage) -> ResponseUsage:
    return ResponseUsage(input_tokens=usage.prompt_tokens, output_tokens=usage.completion_tokens,
                         input_tokens_details=InputTokensDetails(cached_tokens=usage.cached_tokens),
                         total_tokens=usage.total_tokens)


class ResponseWriter:
    """``response``: the in-progress object, filled as events are made. ``audio``: speech was asked for."""

    def __init__(self, response: ResponseObject, parser: ToolCallParser | None, audio: bool = False) -> None:
        self.response = response
        self.parser = parser
        self.audio = audio
        self._seq = 0
        self._message: OutputMessage | None = None

    def start(self) -> list[ResponseEvent]:
        return [self._lifecycle("response.created"), self._lifecycle("response.in_progress")]

    def output(self, out: OmniOutput) -> list[ResponseEvent]:
        """One engine output's events (its text, the calls it completes, its audio)."""
        text, calls = self.parser.feed(out.text) if self.parser is not None else (out.text, [])
        events = self._text(text)
        for call in calls:
            events += self._call(call)
        if self.audio and out.audio is not None and out.audio.size:
            data = pcm16_base64(out.audio).decode("ascii")
            events.append(AudioDelta(type="response.audio.delta", delta=data, sequence_number=self._next()))
        return events

    def finish(self, final: OmniOutput, usage: Usage) -> list[ResponseEvent]:
        """The answer's end: held-back text and a last call, the open message closed, the ending event."""
        events: list[ResponseEvent] = []
        if self.parser is not None:
            text, calls = self.parser.finish()
            events += self._text(text)
            for call in calls:
                events += self._call(call)
        cut = final.finish_reason is FinishReason.LENGTH
        if not self.response.output:  # an empty answer is still one (empty) message
            events += self._open_message()
        events += self._close_message("incomplete" if cut else "completed")
        if self.audio:
            events += [AudioDone(type=t, sequence_number=self._next())
                       for t in ("response.audio.transcript.done", "response.audio.done")]
        self.response.usage = response_usage(usage)
        self.response.status = "incomplete" if cut else "completed"
        self.response.incomplete_details = IncompleteDetails() if cut else None
        self.response.completed_at = None if cut else int(time.time())
        return [*events, self._lifecycle(f"response.{self.response.status}")]

    def fail(self, message: str) -> list[ResponseEvent]:
        events = self._close_message("incomplete")
        self.response.status = "failed"
        self.response.error = ResponseErrorInfo(message=message)
        return [*events, self._lifecycle("response.failed")]

    # -- items ----------------------------------------------------------------------------------------
    def _text(self, text: str) -> list[ResponseEvent]:
        if not text:
            return []
        events = self._open_message() if self._message is None else []
        assert self._message is not None
        self._message.content[0].text += text
        events.append(TextDelta(item_id=self._message.id, output_index=len(self.response.output) - 1, delta=text,
                                sequence_number=self._next()))
        if self.audio:
            events.append(AudioDelta(type="response.audio.transcript.delta", delta=text,
                                     sequence_number=self._next()))
        return events

    def _open_message(self) -> list[ResponseEvent]:
        message = OutputMessage(id=f"msg_{uuid.uuid4().hex}", status="in_progress", content=[])
        self._message = message
        self.response.output.append(message)
        index = len(self.response.output) - 1
        added = OutputItemEvent(type="response.output_item.added", output_index=index,
                                item=message.model_copy(deep=True), sequence_number=self._next())
        message.content.append(OutputText(text=""))
        part = ContentPartEvent(type="response.content_part.added", item_id=message.id, output_index=index,
                                part=OutputText(text=""), sequence_number=self._next())
        return [added, part]

    def _close_message(self, status: str) -> list[ResponseEvent]:
        message, self._message = self._message, None
        if message is None:
            return []
        index = self.response.output.index(message)
        part = message.content[0]
        message.status = "completed" if status == "completed" else "incomplete"
        return [TextDone(item_id=message.id, output_index=index, text=part.text, sequence_number=self._next()),
                ContentPartEvent(type="response.content_part.done", item_id=message.id, output_index=index,
                                 part=part.model_copy(), sequence_number=self._next()),
                OutputItemEvent(type="response.output_item.done", output_index=index,
                                item=message.model_copy(deep=True), sequence_number=self._next())]

    def _call(self, call: ParsedCall) -> list[ResponseEvent]:
        events = self._close_message("completed")
        item = FunctionCallOut(id=f"fc_{uuid.uuid4().hex}", call_id=call.id, name=call.name, arguments="",
                               status="in_progress")
        index = len(self.response.output)
        self.response.output.append(item)
        events.append(OutputItemEvent(type="response.output_item.added", output_index=index,
                                      item=item.model_copy(), sequence_number=self._next()))
        item.arguments, item.status = call.arguments, "completed"
        return [*events,
                ArgumentsDelta(item_id=item.id, output_index=index, delta=call.arguments, sequence_number=self._next()),
                ArgumentsDone(item_id=item.id, output_index=index, arguments=call.arguments,
                              sequence_number=self._next()),
                OutputItemEvent(type="response.output_item.done", output_index=index, item=item.model_copy(),
                                sequence_number=self._next())]

    def _lifecycle(self, kind: str) -> ResponseLifecycle:
        """The response as it stands. Only its output items change after ``response.created``: they are copied,
        the rest (tools, metadata, instructions) shared, not deep-copied on the event loop at every event."""
        snapshot = self.response.model_copy(update={"output": [item.model_copy(deep=True)
                                                               for item in self.response.output]})
        return ResponseLifecycle(type=kind, response=snapshot, sequence_number=self._next())  # type: ignore[arg-type]

    def _next(self) -> int:
        self._seq += 1
        return self._seq - 1
