"""``/v1/audio/speech`` and ``/v1/audio/voices`` bodies (pydantic), as the official client sends them."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from omnistage.audio.formats import AudioFormat
from omnistage.entrypoints.openai.common.protocol import StrictBody, VoiceRef
from omnistage.families.speech import CloneMode

# ---- speech -----------------------------------------------------------------------------------------


TaskType = Literal["CustomVoice", "VoiceDesign", "Base"]


class SpeechContextTurn(StrictBody):
    """An earlier turn of the conversation (CSM's context segment, Sesame's ``Segment(speaker, text, audio)``):
    who said it, what was said, and its recording as ``ref_audio`` takes one."""

    speaker: str | int = Field(description="one of the checkpoint's speakers (CSM: 0 or 1)")
    text: str = Field(min_length=1, description="what the recording says")
    audio: str = Field(description="the recording: a data: URL (base64), file:// or http(s) URL")

    @property
    def speaker_name(self) -> str:
        return str(self.speaker)


class SpeechRequest(StrictBody):
    """OpenAI's body, plus vLLM-Omni's Qwen3-TTS fields (``language`` ... ``stream``) so its clients run as they
    are. ``model`` and ``voice`` may be left out: the served model, its default voice."""

    model: str | None = None
    input: str = Field(min_length=1)
    voice: str | VoiceRef | None = None
    instructions: str | None = None
    response_format: Literal["mp3", "opus", "aac", "flac", "wav", "pcm", "pcm16"] = "mp3"
    speed: float = Field(1.0, ge=0.25, le=4.0, description="playback speed; the pitch is kept (WSOLA)")
    stream_format: Literal["sse", "audio"] = "audio"
    language: str | None = Field(None, description="vLLM-Omni: Auto, English, Chinese... (None: auto)")
    task_type: TaskType | None = Field(None, description="vLLM-Omni: must be the served checkpoint's type")
    ref_audio: str | None = Field(None, description="vLLM-Omni: a recording to clone (data: or http(s) URL; Base)")
    ref_text: str | None = Field(None, description="vLLM-Omni: what ref_audio says (in-context cloning)")
    x_vector_only_mode: bool = Field(False, description="vLLM-Omni: clone from the speaker embedding alone")
    max_new_tokens: int | None = Field(None, ge=1, description="vLLM-Omni: at most this many codec frames")
    stream: bool = Field(False, description="vLLM-Omni: stream the audio; this server always streams it")
    context: list[SpeechContextTurn] | None = Field(None, description="earlier turns the input continues, oldest "
                                                    "first (a conversational checkpoint: CSM)")

    @property
    def voice_name(self) -> str | None:
        return self.voice if isinstance(self.voice, str) or self.voice is None else self.voice.id

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
    mode: CloneMode


class UploadedVoice(BaseModel):
    name: str
    created_at: int


class VoiceList(BaseModel):
    """``data``: the cloned voices (Base checkpoints). ``voices`` and ``uploaded_voices``: vLLM-Omni's shape, the
    built-in speakers (a CustomVoice checkpoint's) and the cloned voices by name."""

    object: Literal["list"] = "list"
    data: list[VoiceObject]
    voices: list[str] = []
    uploaded_voices: list[UploadedVoice] = []


class VoiceDeleted(BaseModel):
    id: str
    object: Literal["audio.voice.deleted"] = "audio.voice.deleted"
    deleted: bool = True
