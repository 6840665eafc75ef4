"""vLLM-Omni's protocol for ``WS /v1/audio/speech/stream`` (its ``streaming_speech_client.py``), translated.

Client: ``session.config`` (once, first: any ``/v1/audio/speech`` field, plus ``stream_audio``), ``input.text``
(``text``), ``input.done``. Server: per sentence ``audio.start`` (``sentence_index``, ``sentence_text``,
``format``), the audio as binary frames (bytes of one file in ``response_format``, default wav; their
concatenation is the file), ``audio.done`` (``total_bytes``); then ``session.done`` (``total_sentences``); an
``error`` carries a ``message``. The speaking is :class:`~omnistage.entrypoints.openai.speech.stream.SpeechStream`'s.
"""

from __future__ import annotations

from typing import Any

from omnistage.audio.formats import PCM_RATE
from omnistage.entrypoints.openai.common.errors import quoted
from omnistage.entrypoints.openai.common.protocol import ErrorDetail
from omnistage.entrypoints.openai.speech.protocol import SpeechRequest, SpeechUsage
from omnistage.entrypoints.openai.speech.stream_dialect import (
    ClientEvent,
    Configure,
    StreamDialect,
    TextIn,
    text_field,
)

# session.config keys that are not SpeechRequest fields under the same name: stream_audio is ``stream``.
RENAMED = {"stream_audio": "stream"}
IGNORED = frozenset({"type", "split_granularity", "initial_codec_chunk_frames"})


def speaks_vllm_omni(event: object) -> bool:
    return isinstance(event, dict) and event.get("type") == "session.config"


class VllmOmniStreamDialect(StreamDialect):
    response_format = "wav"  # vLLM-Omni's default

    def parse(self, event: dict[str, Any]) -> ClientEvent:
        kind = event.get("type")
        if kind == "session.config":
            fields = {RENAMED.get(k, k): v for k, v in event.items() if k not in IGNORED}
            return Configure(SpeechRequest.model_validate({"input": " ", **fields}))
        if kind in ("input.text", "input.done"):
            return TextIn(text_field(event, "text"), done=kind == "input.done")
        raise ValueError(f"unknown message type {quoted(kind)} (session.config, input.text, input.done)")

    async def segment_started(self, index: int, text: str, body: SpeechRequest) -> None:
        start: dict[str, object] = {"type": "audio.start", "sentence_index": index, "sentence_text": text,
                                    "format": body.response_format}
        if body.response_format == "pcm":
            start["sample_rate"] = PCM_RATE  # raw PCM is sent at it, whatever the model's rate
        await self.ws.send_json(start)

    async def audio(self, index: int, piece: bytes) -> None:
        await self.ws.send_bytes(piece)

    async def segment_done(self, index: int, text: str, size: int) -> None:
        await self.ws.send_json({"type": "audio.done", "sentence_index": index, "total_bytes": size, "error": False})

    async def finished(self, usage: SpeechUsage, segments: int) -> None:
        await self.ws.send_json({"type": "session.done", "total_sentences": segments})

    async def failed(self, detail: ErrorDetail) -> None:
        await self.ws.send_json({"type": "error", "message": detail.message, "code": detail.code})
