"""Request and response bodies of the OpenAI-compatible API (pydantic), as the official client sends them.

Requests forbid unknown fields, as OpenAI does, so a misspelt parameter is a
400 naming it rather than a silently ignored knob. Responses mirror the
``openai`` package's types field for field.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from omnistage.audio.formats import AudioFormat
from omnistage.engine.sampling_params import REPETITION_PENALTY_MAX, REPETITION_PENALTY_MIN, SEED_MAX, TOP_K_MAX


class _Strict(BaseModel):
    # Python's JSON parser reads NaN and Infinity: no number a client sends may be either.
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


# ---- errors ---------------------------------------------------------------------------------------


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorDetail


# ---- chat requests ----------------------------------------------------------------------------------


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class InputAudio(_Strict):
    data: str = Field(description="base64-encoded audio file bytes")
    format: Literal["wav", "mp3", "flac"]


class InputAudioPart(_Strict):
    type: Literal["input_audio"]
    input_audio: InputAudio


class MediaURL(_Strict):
    url: str = Field(description="data: URL, file:// URL under --allowed-local-media-path, or http(s) URL")
    detail: Literal["auto", "low", "high"] | None = None  # accepted for compatibility; not used


class ImageURLPart(_Strict):
    type: Literal["image_url"]
    image_url: MediaURL


class AudioURLPart(_Strict):
    type: Literal["audio_url"]
    audio_url: MediaURL


class VideoURLPart(_Strict):
    type: Literal["video_url"]
    video_url: MediaURL


ContentPart = Annotated[
    TextPart | InputAudioPart | ImageURLPart | AudioURLPart | VideoURLPart, Field(discriminator="type")
]


class AudioReference(_Strict):
    """An earlier assistant turn's audio, by id. This server keeps no audio, so the turn's ``content`` is used."""

    id: str


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    audio: AudioReference | None = None


class VoiceRef(_Strict):
    id: str


class AudioOutputParams(_Strict):
    voice: str | VoiceRef
    format: Literal["wav", "mp3", "flac", "opus", "aac", "pcm16"] = "wav"

    @property
    def voice_name(self) -> str:
        return self.voice if isinstance(self.voice, str) else self.voice.id


class StreamOptions(_Strict):
    include_usage: bool = False


class ChatCompletionRequest(_Strict):
    model: str
    messages: list[ChatMessage] = Field(min_length=1)
    modalities: list[Literal["text", "audio"]] | None = None
    audio: AudioOutputParams | None = None
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=-1, le=TOP_K_MAX,
                              description="extension: 0 or -1 = off; at most the model's vocabulary size")
    repetition_penalty: float | None = Field(None, ge=REPETITION_PENALTY_MIN, le=REPETITION_PENALTY_MAX,
                                             description="extension (as vLLM's); 1 = off")
    max_tokens: int | None = Field(None, ge=1, description="deprecated by OpenAI; max_completion_tokens wins")
    max_completion_tokens: int | None = Field(None, ge=1)
    seed: int | None = Field(None, ge=0, le=SEED_MAX)
    stop: str | list[str] | None = None
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    initial_codec_chunk_frames: int | None = Field(
        None, ge=1, le=300, description="extension: codec frames (12.5 Hz) in the first audio chunk; "
                                        "smaller starts audio sooner. Default: chosen by load")

    @field_validator("n")
    @classmethod
    def _one_choice(cls, n: int) -> int:
        if n != 1:
            raise ValueError("only n=1 is supported")
        return n

    @field_validator("stop")
    @classmethod
    def _few_stops(cls, stop: str | list[str] | None) -> str | list[str] | None:
        if isinstance(stop, list) and len(stop) > 4:
            raise ValueError("at most 4 stop sequences")
        return stop

    @property
    def stop_sequences(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)


# ---- chat responses ---------------------------------------------------------------------------------

FinishReasonName = Literal["stop", "length"]


class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0  # prompt tokens served from the prefix cache


class UsageInfo(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None


class ChatCompletionAudio(BaseModel):
    id: str
    data: str  # base64 of one file in the requested format
    expires_at: int
    transcript: str


class ChatCompletionMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    refusal: str | None = None
    audio: ChatCompletionAudio | None = None


class ChatCompletionChoice(BaseModel):
    index: int = 0
    message: ChatCompletionMessage
    finish_reason: FinishReasonName
    logprobs: None = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatCompletionChoice]
    usage: UsageInfo


class DeltaAudio(BaseModel):
    """One streamed audio update: an id with data and/or transcript, or (last) only ``expires_at``."""

    id: str | None = None
    data: str | None = None
    transcript: str | None = None
    expires_at: int | None = None


class ChoiceDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    audio: DeltaAudio | None = None


class ChunkChoice(BaseModel):
    index: int = 0
    delta: ChoiceDelta
    finish_reason: FinishReasonName | None = None
    logprobs: None = None


class ChatCompletionChunk(BaseModel):
    """One ``data:`` event of a streamed chat completion (served as text/event-stream)."""

    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: UsageInfo | None = None


# ---- speech -----------------------------------------------------------------------------------------


class SpeechRequest(_Strict):
    model: str
    input: str = Field(min_length=1)
    voice: str | VoiceRef
    instructions: str | None = None
    response_format: Literal["mp3", "opus", "aac", "flac", "wav", "pcm", "pcm16"] = "mp3"
    speed: float = Field(1.0, ge=0.25, le=4.0, description="only 1.0 is supported")
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


# ---- models and health ------------------------------------------------------------------------------


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "omnistage"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ReplicaHealthInfo(BaseModel):
    replica: int
    healthy: bool
    detail: str = ""
    kv_blocks_total: int = 0
    kv_cache_bytes: int = 0


class StageHealthInfo(BaseModel):
    stage: str
    healthy: bool
    replicas: list[ReplicaHealthInfo]


class HealthResponse(BaseModel):
    status: Literal["ok", "unhealthy"]
    stages: list[StageHealthInfo]
