"""The server events of one realtime response, in OpenAI's order.

``response.created``; then for each output item: ``response.output_item.added``,
``conversation.item.added``, for a message ``response.content_part.added``, the
deltas (``response.output_audio.delta`` + ``response.output_audio_transcript.delta``
when speaking, ``response.output_text.delta`` for text), their ``*.done`` events,
``response.content_part.done``; for a function call
``response.function_call_arguments.delta``/``.done``; then
``response.output_item.done`` and ``conversation.item.done``; last ``response.done``.
A message item is opened by its first text or audio, so an answer that only calls
a tool has only function-call items.

``response.done`` says how the response ended: ``completed``; ``incomplete`` at
``max_output_tokens``; ``cancelled`` with a reason: ``client_cancelled``
(``response.cancel``, ``output_audio_buffer.clear``), ``turn_detected`` (barge-in:
the server VAD heard the user start speaking) or ``server_aborted``; ``failed`` when
a stage failed or the request ran past ``--request-timeout`` (code ``timeout``). Its
usage counts the prompt tokens served from the thinker's prefix cache as
``input_token_details.cached_tokens``.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Awaitable, Callable
from typing import Any, Literal

from omnistage.core import FinishReason, OmniOutput, OmniRequest, Usage
from omnistage.entrypoints.openai.common.streaming import TIMED_OUT
from omnistage.entrypoints.openai.common.tool_calls import ParsedCall, ToolCallParser
from omnistage.entrypoints.openai.realtime.items import Conversation, Item
from omnistage.entrypoints.openai.realtime.protocol import OutputFormat, ResponseOptions, new_id, server_event

SendFn = Callable[[dict[str, Any]], Awaitable[None]]
CancelReason = Literal["client_cancelled", "turn_detected"]  # why the session cancelled a response (OpenAI's words)


class ResponseWriter:
    """``conversation``: where the response's items go (None: an out-of-band response)."""

    def __init__(self, send: SendFn, conversation_id: str, voice: str, request: OmniRequest,
                 options: ResponseOptions, output_format: OutputFormat, conversation: Conversation | None,
                 parser: ToolCallParser | None, source_rate: int) -> None:
        """``source_rate``: the rate of the engine's audio (the served family's)."""
        self.send, self.conversation_id, self.voice = send, conversation_id, voice
        self.request, self.options, self.output_format = request, options, output_format
        self.source_rate, self.encoder = source_rate, output_format.encoder(source_rate)
        self.conversation, self.parser = conversation, parser
        self.id = request.request_id
        self.items: list[Item] = []
        self.message: Item | None = None
        self.audio_samples = 0
        self.first_audio_at: float | None = None  # ``time.monotonic()`` of its first audio delta
        self.status = "in_progress"
        self.details: dict[str, Any] | None = None
        self.cancel_reason: CancelReason = "client_cancelled"  # set by the session before it cancels the task

    @property
    def speaks(self) -> bool:
        return "audio" in self.options.output_modalities

    def _body(self) -> dict[str, Any]:
        return {"id": self.id, "object": "realtime.response", "status": self.status, "status_details": self.details,
                "output_modalities": list(self.options.output_modalities),
                "conversation_id": self.conversation_id if self.conversation is not None else None,
                "output": [], "usage": None, "metadata": self.options.metadata,
                "audio": {"output": {"voice": self.voice, "format": self.output_format.describe(False)}}}

    def _ids(self, item: Item) -> dict[str, Any]:
        return {"response_id": self.id, "item_id": item.id, "output_index": self.items.index(item)}

    async def start(self) -> None:
        await self.send(server_event("response.created", response=self._body()))

    async def _add(self, item: Item) -> None:
        self.items.append(item)
        await self.send(server_event("response.output_item.added", response_id=self.id,
                                     output_index=len(self.items) - 1, item=item.describe()))
        if self.conversation is not None:
            previous = self.conversation.add(item, own=True)
            await self.send(server_event("conversation.item.added", previous_item_id=previous, item=item.describe()))

    async def _finish_item(self, item: Item) -> None:
        if item.status == "in_progress":
            item.status = "completed" if self.status in ("in_progress", "completed") else "incomplete"
        await self.send(server_event("response.output_item.done", response_id=self.id,
                                     output_index=self.items.index(item), item=item.describe()))
        if self.conversation is not None:
            await self.send(server_event("conversation.item.done", item=item.describe()))

    @staticmethod
    def _part(item: Item) -> dict[str, Any]:
        # The content_part events name a part "audio"/"text" in GA too (the SDK's Part type), unlike the item's
        # content, which says "output_audio"/"output_text".
        return {"type": "audio", "transcript": item.text} if item.spoken else {"type": "text", "text": item.text}

    def ahead_s(self, now: float) -> float | None:
        """Seconds of audio sent beyond what the caller has played by ``now`` (``time.monotonic()``), if it plays
        from the first delta in real time; None while no audio was sent (a player not started cannot run dry) and
        once nothing more will come (``speculation_gate.py``)."""
        if not self.speaks or self.status != "in_progress" or self.first_audio_at is None:
            return None
        return self.audio_samples / self.source_rate - (now - self.first_audio_at)

    async def _open_message(self) -> Item:
        if self.message is None:
            self.message = Item(new_id("item"), "message", role="assistant", status="in_progress", spoken=self.speaks)
            await self._add(self.message)
            await self.send(server_event("response.content_part.added", **self._ids(self.message), content_index=0,
                                         part=self._part(self.message)))
        return self.message

    async def delta(self, out: OmniOutput) -> None:
        text, calls = self.parser.feed(out.text) if self.parser is not None else (out.text, [])
        await self._text(text, calls)
        if out.audio is not None and out.audio.size and self.speaks:
            message = await self._open_message()
            if self.first_audio_at is None:
                self.first_audio_at = time.monotonic()
            self.audio_samples += out.audio.size
            message.audio_ms = self.audio_samples * 1000 // self.source_rate
            data = base64.b64encode(self.encoder.encode(out.audio)).decode("ascii")
            await self.send(server_event("response.output_audio.delta", **self._ids(message), content_index=0,
                                         delta=data))

    async def _text(self, text: str, calls: list[ParsedCall]) -> None:
        if text:
            message = await self._open_message()
            message.text += text
            kind = "response.output_audio_transcript.delta" if self.speaks else "response.output_text.delta"
            await self.send(server_event(kind, **self._ids(message), content_index=0, delta=text))
        for call in calls:
            await self._function_call(call)

    async def _function_call(self, call: ParsedCall) -> None:
        item = Item(new_id("item"), "function_call", call_id=call.id, name=call.name, status="in_progress")
        await self._add(item)
        ids = {**self._ids(item), "call_id": call.id}
        await self.send(server_event("response.function_call_arguments.delta", **ids, delta=call.arguments))
        item.arguments = call.arguments
        await self.send(server_event("response.function_call_arguments.done", **ids, name=call.name,
                                     arguments=call.arguments))
        await self._finish_item(item)

    def fail(self, code: str, message: str) -> None:
        self.status = "failed"
        self.details = {"type": "failed", "error": {"type": "server_error", "code": code, "message": message}}

    def cancel(self) -> None:
        self.status, self.details = "cancelled", {"type": "cancelled", "reason": self.cancel_reason}

    def _settle(self, final: OmniOutput | None) -> None:
        """The status from the engine's final output (a response still in progress when the stream ended)."""
        if final is None or not final.finished:
            self.fail("engine_error", "the engine ended the response without a final output")
        elif final.finish_reason is FinishReason.ERROR:
            self.fail("engine_error", final.error or "unknown error")
        elif final.finish_reason is FinishReason.ABORT and (final.error or "").startswith(TIMED_OUT):
            self.fail("timeout", f"{final.error} (--request-timeout)")
        elif final.finish_reason is FinishReason.ABORT:
            self.status, self.details = "cancelled", {"type": "cancelled", "reason": "server_aborted"}
        elif final.finish_reason is FinishReason.LENGTH:
            self.status, self.details = "incomplete", {"type": "incomplete", "reason": "max_output_tokens"}
        else:
            self.status = "completed"

    async def _close_message(self) -> None:
        message = self.message
        if message is None:
            return
        ids = {**self._ids(message), "content_index": 0}
        if message.spoken:
            await self.send(server_event("response.output_audio.done", **ids))
            await self.send(server_event("response.output_audio_transcript.done", **ids, transcript=message.text))
        else:
            await self.send(server_event("response.output_text.done", **ids, text=message.text))
        await self.send(server_event("response.content_part.done", **ids, part=self._part(message)))
        await self._finish_item(message)

    async def done(self, final: OmniOutput | None) -> None:
        if self.status == "in_progress":
            self._settle(final)
        if self.parser is not None and self.status != "cancelled":
            await self._text(*self.parser.finish())
        await self._close_message()
        body = self._body()
        body["output"] = [item.describe() for item in self.items]
        usage = final.usage if final is not None else None
        if usage is not None:
            body["usage"] = usage_body(usage)
        await self.send(server_event("response.done", response=body))


def usage_body(usage: Usage) -> dict[str, Any]:
    return {"input_tokens": usage.prompt_tokens, "output_tokens": usage.completion_tokens,
            "total_tokens": usage.total_tokens, "input_token_details": {"cached_tokens": usage.cached_tokens}}
