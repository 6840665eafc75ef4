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

    def wire_rate(self, source_rate: int) -> int:
        """The rate audio made at ``source_rate`` is written at: raw PCM at the 24 kHz OpenAI documents for it
        (clients assume it), a codec at the source's rate where it takes that rate, else at its usual one."""
        if self is AudioFormat.PCM16:
            return PCM_RATE
        rates, usual = _CODEC_RATES.get(self, ((), 0))
        return source_rate if not rates or source_rate in rates else usual


_MEDIA_TYPES: dict[AudioFormat, str] = {
    AudioFormat.WAV: "audio/wav",
    AudioFormat.MP3: "audio/mpeg",
    AudioFormat.FLAC: "audio/flac",
    AudioFormat.OPUS: "audio/ogg",
    AudioFormat.AAC: "audio/aac",
    AudioFormat.PCM16: "audio/pcm",
}

PCM_RATE = 24000  # OpenAI's raw PCM output rate (chat pcm16, speech pcm, realtime audio/pcm)
# The rates each codec's encoder takes, and the one used for a source at another rate (WAV and FLAC take any).
_CODEC_RATES: dict[AudioFormat, tuple[tuple[int, ...], int]] = {
    AudioFormat.OPUS: ((8000, 12000, 16000, 24000, 48000), 48000),
    AudioFormat.MP3: ((8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000), 24000),
    AudioFormat.AAC: ((8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000, 64000, 88200, 96000), 48000),
}

# Formats the input side decodes (OpenAI's input_audio takes wav and mp3; flac is a cheap extra).
INPUT_FORMATS: tuple[str, ...] = ("wav", "mp3", "flac")
