"""A realtime session's audio formats: what ``input_audio_buffer.append`` carries (PCM16 at 16/24 kHz, G.711 at
8 kHz, base64) and what output audio is sent as."""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from typing import Any

import numpy as np

from omnistage.audio import float_to_pcm16, resample
from omnistage.audio.formats import PCM_RATE
from omnistage.audio.g711 import G711_RATE, decode_g711, encode_g711
from omnistage.audio.resample_stream import StreamResampler
from omnistage.entrypoints.openai.realtime.event_error import EventError, event_id
from omnistage.processing.prompt import AUDIO_SAMPLE_RATE

PCM_RATES = (16000, 24000)  # PCM16 mono rates accepted by input_audio_buffer.append
DEFAULT_INPUT_RATE = 24000  # OpenAI's pcm16 rate
OUTPUT_RATE = PCM_RATE  # OpenAI's pcm16 output rate


def decode_base64_audio(event: dict[str, Any]) -> bytes:
    data = event.get("audio")
    if not isinstance(data, str):
        raise EventError("invalid_event", "input_audio_buffer.append needs 'audio' (base64)", "audio",
                         event_id(event))
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise EventError("invalid_audio", "'audio' is not valid base64", "audio", event_id(event)) from exc


@dataclass(frozen=True)
class InputFormat:
    """``pcm16`` at 16 or 24 kHz, or G.711 ``pcmu``/``pcma`` at 8 kHz."""

    kind: str = "pcm16"
    rate: int = DEFAULT_INPUT_RATE

    def decode(self, raw: bytes) -> np.ndarray:
        if self.kind == "pcm16":
            if len(raw) % 2:
                raise EventError("invalid_audio", "'audio' must be 16-bit PCM (an even number of bytes)", "audio")
            return np.frombuffer(raw, dtype="<i2").astype(np.float32) / 32768.0
        return decode_g711(raw, "ulaw" if self.kind == "pcmu" else "alaw")

    def seconds(self, encoded_bytes: int) -> float:
        """How long ``encoded_bytes`` of this format play."""
        return encoded_bytes / (2 if self.kind == "pcm16" else 1) / self.rate

    def to_16k(self, samples: np.ndarray) -> np.ndarray:
        return resample(samples, self.rate, AUDIO_SAMPLE_RATE)

    def describe(self, beta: bool) -> dict[str, Any] | str:
        if beta:
            return {"pcm16": "pcm16", "pcmu": "g711_ulaw", "pcma": "g711_alaw"}[self.kind]
        return {"type": "audio/pcm", "rate": self.rate} if self.kind == "pcm16" else {"type": f"audio/{self.kind}"}


@dataclass(frozen=True)
class OutputFormat:
    """``pcm16`` at 24 kHz, or G.711 at 8 kHz, whatever the model's own rate (resampled, then encoded)."""

    kind: str = "pcm16"

    @property
    def rate(self) -> int:
        return OUTPUT_RATE if self.kind == "pcm16" else G711_RATE

    def encoder(self, source_rate: int) -> OutputEncoder:
        """One response's encoder from audio at ``source_rate`` (the served family's)."""
        return OutputEncoder(self.kind, StreamResampler(source_rate, self.rate))

    @property
    def bytes_per_ms(self) -> float:
        return OUTPUT_RATE * 2 / 1000 if self.kind == "pcm16" else G711_RATE / 1000

    def describe(self, beta: bool) -> dict[str, Any] | str:
        return InputFormat(self.kind, self.rate).describe(beta)


@dataclass
class OutputEncoder:
    """A response's audio chunks in its output format, resampled as a stream (chunked = whole: no click at
    each chunk's edge)."""

    kind: str
    resample: StreamResampler

    def encode(self, samples: np.ndarray) -> bytes:
        wire = self.resample(samples)
        if self.kind == "pcm16":
            return float_to_pcm16(wire)
        return encode_g711(wire, "ulaw" if self.kind == "pcmu" else "alaw")


_BETA_FORMATS = {"pcm16": "pcm16", "g711_ulaw": "pcmu", "g711_alaw": "pcma"}


def format_kind(value: Any, param: str) -> tuple[str, int | None]:  # noqa: ANN401 - client JSON
    if isinstance(value, str) and value in _BETA_FORMATS:
        return _BETA_FORMATS[value], None
    if isinstance(value, dict) and value.get("type", "audio/pcm") in ("audio/pcm", "audio/pcmu", "audio/pcma"):
        kind = {"audio/pcm": "pcm16", "audio/pcmu": "pcmu", "audio/pcma": "pcma"}[value.get("type", "audio/pcm")]
        return kind, value.get("rate")
    raise EventError("invalid_value", f"{param} must be audio/pcm, audio/pcmu or audio/pcma", param)
