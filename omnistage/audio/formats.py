"""Audio container/codec names as the OpenAI API spells them, and their HTTP media types."""

from __future__ import annotations

import enum


class AudioFormat(str, enum.Enum):
    WAV = "wav"
    MP3 = "mp3"
    FLAC = "flac"
    OPUS = "opus"  # Ogg-encapsulated, as OpenAI returns it
    AAC = "aac"  # ADTS stream
    PCM16 = "pcm16"  # raw little-endian 16-bit mono, no header

    @classmethod
    def parse(cls, name: str) -> AudioFormat:
        """Case-insensitive; the speech API's ``pcm`` is the chat API's ``pcm16``."""
        key = name.strip().lower()
        if key == "pcm":
            key = "pcm16"
        try:
            return cls(key)
        except ValueError:
            known = ", ".join(f.value for f in cls)
            raise ValueError(f"unknown audio format {name!r} (supported: {known}, pcm)") from None

    @property
    def media_type(self) -> str:
        return _MEDIA_TYPES[self]


_MEDIA_TYPES: dict[AudioFormat, str] = {
    AudioFormat.WAV: "audio/wav",
    AudioFormat.MP3: "audio/mpeg",
    AudioFormat.FLAC: "audio/flac",
    AudioFormat.OPUS: "audio/ogg",
    AudioFormat.AAC: "audio/aac",
    AudioFormat.PCM16: "audio/pcm",
}

# Formats the input side decodes (OpenAI's input_audio takes wav and mp3; flac is a cheap extra).
INPUT_FORMATS: tuple[str, ...] = ("wav", "mp3", "flac")
