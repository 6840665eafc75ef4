"""The events of a speech-stream session, apart from the session: what a client's event means (typed), and how
each step of the session is told to the client. :class:`StreamDialect` is this server's own protocol; another
protocol for the same route is a subclass that translates (``vllm_omni.py``)."""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

from fastapi import WebSocket

from omnistage.entrypoints.openai.common.errors import quoted
from omnistage.entrypoints.openai.common.protocol import ErrorDetail
from omnistage.entrypoints.openai.speech.protocol import SpeechRequest, SpeechUsage

TEXT_INPUTS = ("deltas", "sentences")  # how the session's text is spoken: as it is written, or cut in sentences


@dataclass(frozen=True)
class Configure:
    """Session settings: the fields of ``settings`` the client set (its ``input`` is a placeholder), and how its
    text is spoken (``text_input``, one of :data:`TEXT_INPUTS`; None: unchanged)."""

    settings: SpeechRequest
    text_input: str | None = None


@dataclass(frozen=True)
class TextIn:
    text: str
    done: bool = False


@dataclass(frozen=True)
class Cancel:
    """Stop speaking: no audio after the chunk in flight; the session ends as at the end of its text."""


ClientEvent = Configure | TextIn | Cancel


def text_field(event: dict[str, Any], key: str) -> str:
    """An event's text (absent or null: none); a number or an object there is a client's mistake, not text."""
    value = event.get(key)
    if value is not None and not isinstance(value, str):
        raise ValueError(f"'{key}' must be a string")
    return value or ""


class StreamDialect:
    """This server's own events. A client speaking another protocol gets a subclass that translates both ways
    (:mod:`omnistage.entrypoints.openai.speech.vllm_omni`); the session itself is the same."""

    response_format = "pcm"  # what each segment is encoded as, unless the session sets response_format

    def __init__(self, ws: WebSocket) -> None:
        self.ws = ws

    def parse(self, event: dict[str, Any]) -> ClientEvent:
        kind = event.get("type")
        if kind == "session.update":
            fields = {"instructions": event.get("instructions"), **({"voice": event["voice"]} if "voice" in event
                                                                     else {})}
            mode = event.get("text_input")
            if mode is not None and mode not in TEXT_INPUTS:
                raise ValueError(f"text_input must be one of {', '.join(TEXT_INPUTS)}")
            return Configure(SpeechRequest.model_validate({"input": " ", **fields}), mode)
        if kind in ("input_text.delta", "input_text.done"):
            return TextIn(text_field(event, "delta"), done=kind == "input_text.done")
        if kind == "input_text.cancel":
            return Cancel()
        raise ValueError(f"unknown event type {quoted(kind)} (session.update, input_text.delta, input_text.done, "
                         f"input_text.cancel)")

    async def segment_started(self, index: int, text: str, body: SpeechRequest) -> None:
        pass

    async def audio(self, index: int, piece: bytes) -> None:
        await self.ws.send_json({"type": "speech.audio.delta", "segment": index,
                                 "audio": base64.b64encode(piece).decode("ascii")})

    async def segment_done(self, index: int, text: str, size: int) -> None:
        await self.ws.send_json({"type": "speech.segment.done", "segment": index, "text": text})

    async def finished(self, usage: SpeechUsage, segments: int) -> None:
        await self.ws.send_json({"type": "speech.audio.done", "usage": usage.model_dump()})

    async def failed(self, detail: ErrorDetail) -> None:
        await self.ws.send_json({"type": "error", "error": detail.model_dump()})
