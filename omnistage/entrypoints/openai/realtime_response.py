"""The server events of one realtime response: ``response.created``, the deltas, ``response.done``.

``response.done`` says how the response ended: ``completed``; ``incomplete``
at ``max_output_tokens``; ``cancelled`` by the client (``response.cancel``,
barge-in) or the server; ``failed`` when a stage failed or the request ran
past ``--request-timeout`` (error code ``timeout``; the request is aborted in
every stage by then). Its usage counts the prompt tokens served from the
thinker's prefix cache as ``input_token_details.cached_tokens``: the earlier
turns a new turn did not prefill again.
"""

from __future__ import annotations

import base64
from collections.abc import Awaitable, Callable
from typing import Any

from omnistage.audio import float_to_pcm16
from omnistage.core import FinishReason, OmniOutput, OmniRequest, Usage
from omnistage.entrypoints.openai.realtime_protocol import ResponseOptions, new_id, server_event
from omnistage.entrypoints.openai.streaming import TIMED_OUT

SendFn = Callable[[dict[str, Any]], Awaitable[None]]


class ResponseWriter:
    def __init__(self, send: SendFn, conversation_id: str, voice: str, request: OmniRequest,
                 options: ResponseOptions) -> None:
        self.send, self.conversation_id, self.voice = send, conversation_id, voice
        self.request, self.options = request, options
        self.id = request.request_id
        self.item_id = new_id("item")
        self.text: list[str] = []
        self.audio_bytes = 0
        self.status = "in_progress"
        self.details: dict[str, Any] | None = None

    def _body(self) -> dict[str, Any]:
        return {"id": self.id, "object": "realtime.response", "status": self.status,
                "status_details": self.details, "output_modalities": list(self.options.output_modalities),
                "conversation_id": self.conversation_id, "output": [], "usage": None,
                "audio": {"output": {"voice": self.voice, "format": {"type": "audio/pcm", "rate": 24000}}}}

    async def start(self) -> None:
        await self.send(server_event("response.created", response=self._body()))

    async def delta(self, out: OmniOutput) -> None:
        ids = {"response_id": self.id, "item_id": self.item_id, "output_index": 0, "content_index": 0}
        modalities = self.options.output_modalities
        if out.text:
            self.text.append(out.text)
            if "text" in modalities:
                await self.send(server_event("response.output_text.delta", **ids, delta=out.text))
            if "audio" in modalities:
                await self.send(server_event("response.output_audio_transcript.delta", **ids, delta=out.text))
        if out.audio is not None and out.audio.size and "audio" in modalities:
            pcm = float_to_pcm16(out.audio)
            self.audio_bytes += len(pcm)
            await self.send(server_event("response.output_audio.delta", **ids,
                                         delta=base64.b64encode(pcm).decode("ascii")))

    def fail(self, code: str, message: str) -> None:
        self.status = "failed"
        self.details = {"type": "failed", "error": {"type": "server_error", "code": code, "message": message}}

    def cancel(self) -> None:
        self.status = "cancelled"

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

    async def done(self, final: OmniOutput | None) -> None:
        if self.status == "in_progress":
            self._settle(final)
        elif self.status == "cancelled":
            self.details = {"type": "cancelled", "reason": "client_cancelled"}
        body = self._body()
        text = "".join(self.text)
        content = [{"type": "output_audio", "transcript": text} if "audio" in self.options.output_modalities
                   else {"type": "output_text", "text": text}]
        body["output"] = [{"id": self.item_id, "type": "message", "role": "assistant", "content": content}]
        usage = final.usage if final is not None else None
        if usage is not None:
            body["usage"] = usage_body(usage)
        await self.send(server_event("response.done", response=body))


def usage_body(usage: Usage) -> dict[str, Any]:
    return {"input_tokens": usage.prompt_tokens, "output_tokens": usage.completion_tokens,
            "total_tokens": usage.total_tokens, "input_token_details": {"cached_tokens": usage.cached_tokens}}
