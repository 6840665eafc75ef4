"""``/v1/audio/speech`` and ``/v1/audio/voices`` bodies (pydantic), as the official client sends them."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from omnistage.audio.formats import AudioFormat
from omnistage.entrypoints.openai.common.protocol import StrictBody, VoiceRef


# ---- speech -----------------------------------------------------------------------------------------


class SpeechRequest(StrictBody):
    model: str
    input: str = Field(min_length=1)
    voice: str | VoiceRef
    instructions: str | None = None
    response_format: Literal["mp3", "opus", "aac", "flac", "wav", "pcm", "pcm16"] = "mp3"
    speed: float = Field(1.0, ge=0.25, le=4.0, description="playback speed; the pitch is kept (WSOLA)")
    stream_format: Literal["sse", "audio"] = "audio"

    @property
    def voice_name(self) -> str:
        return self.voice if isinstance(self.voice, str) else self.voice.id

    @property
    def audio_format(self) -> AudioFormat:
        return AudioFormat.parse(self.response_format)


class SpeechUsage(BaseModel):
    input_tokens: int
    output_tokens: int
    total_tokens: int


class SpeechAudioDelta(BaseModel):
    type: Literal["speech.audio.delta"] = "speech.audio.delta"
    audio: str  # base64 of the next bytes of one file in response_format


class SpeechAudioDone(BaseModel):
    type: Literal["speech.audio.done"] = "speech.audio.done"
    usage: SpeechUsage



# ---- voices -----------------------------------------------------------------------------------------


class VoiceAudio(StrictBody):
    data: str = Field(description="base64 of the reference recording (mono or not; any common container)")
    format: str | None = Field(None, description="wav, mp3, flac, ogg...; None: detected")


class VoiceCreateRequest(StrictBody):
    """A voice cloned from a reference recording (a Qwen3-TTS Base checkpoint): ``transcript`` (what the
    recording says) clones in context, without it from the speaker embedding alone."""

    name: str
    audio: VoiceAudio
    transcript: str | None = None


class VoiceObject(BaseModel):
    id: str
    object: Literal["audio.voice"] = "audio.voice"
    created_at: int
    mode: Literal["in_context", "x_vector"]


class VoiceList(BaseModel):
    object: Literal["list"] = "list"
    data: list[VoiceObject]


class VoiceDeleted(BaseModel):
    id: str
    object: Literal["audio.voice.deleted"] = "audio.voice.deleted"
    deleted: bool = True
