"""``/v1/chat/completions`` request and response bodies (pydantic), as the official client sends them.

Nested request objects forbid unknown fields, so a misspelt field is a 400 naming
it. A chat request and its messages accept unknown top-level fields, as OpenAI
and vLLM do (clients send ``metadata``, ``store``, ``service_tier``...): they are
ignored and logged at debug. Known fields this server cannot honour are declared
and refused with a 400 when set to anything but their no-op value. Responses
mirror the ``openai`` package's types field for field.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, field_validator, model_validator

from omnistage.entrypoints.openai.common.protocol import LenientBody, StrictBody, VoiceRef
from omnistage.sampling_params import (
    MAX_LOGPROBS,
    OPENAI_PENALTY_MAX,
    REPETITION_PENALTY_MAX,
    REPETITION_PENALTY_MIN,
    SEED_MAX,
    TOP_K_MAX,
)

MAX_CHOICES = 16  # n: each choice is a request of its own in the pipeline


# ---- chat requests ----------------------------------------------------------------------------------


class TextPart(StrictBody):
    type: Literal["text"]
    text: str


class InputAudio(StrictBody):
    data: str = Field(description="base64-encoded audio file bytes")
    format: Literal["wav", "mp3", "flac"]


class InputAudioPart(StrictBody):
    type: Literal["input_audio"]
    input_audio: InputAudio


class MediaURL(StrictBody):
    url: str = Field(description="data: URL, file:// URL under --allowed-local-media-path, or http(s) URL")
    detail: Literal["auto", "low", "high"] | None = None  # accepted for compatibility; not used


class ImageURLPart(StrictBody):
    type: Literal["image_url"]
    image_url: MediaURL


class AudioURLPart(StrictBody):
    type: Literal["audio_url"]
    audio_url: MediaURL


class VideoURLPart(StrictBody):
    type: Literal["video_url"]
    video_url: MediaURL


ContentPart = Annotated[
    TextPart | InputAudioPart | ImageURLPart | AudioURLPart | VideoURLPart, Field(discriminator="type")
]


class AudioReference(StrictBody):
    """An earlier assistant turn's audio, by id. This server keeps no audio, so the turn's ``content`` is used."""

    id: str


class FunctionCall(LenientBody):
    name: str
    arguments: str = Field(description="the arguments as a JSON object, in a string")


class ToolCall(LenientBody):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(LenientBody):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    audio: AudioReference | None = None
    tool_calls: list[ToolCall] | None = None  # an assistant turn's calls
    tool_call_id: str | None = None  # a tool turn: the call it answers

    @model_validator(mode="after")
    def _tool_fields(self) -> ChatMessage:
        if self.tool_calls and self.role != "assistant":
            raise ValueError("only assistant messages carry tool_calls")
        if self.role == "tool" and not self.tool_call_id:
            raise ValueError("a tool message needs tool_call_id")
        return self


class FunctionDefinition(LenientBody):
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.:-]+$")
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON Schema object, shown to the model as given
    strict: bool | None = None


class ToolDefinition(LenientBody):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(StrictBody):
    name: str


class NamedToolChoice(StrictBody):
    type: Literal["function"]
    function: NamedFunction


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


class MMProcessorKwargs(StrictBody):
    """vLLM's ``mm_processor_kwargs``: what the Qwen3-Omni processor takes per request."""

    use_audio_in_video: bool = False


class StageSamplingParams(LenientBody):
    """One entry of vLLM-Omni's ``sampling_params_list`` (entry 0: the thinker)."""

    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=-1, le=TOP_K_MAX)
    repetition_penalty: float | None = Field(None, ge=REPETITION_PENALTY_MIN, le=REPETITION_PENALTY_MAX)
    max_tokens: int | None = Field(None, ge=1)
    seed: int | None = Field(None, ge=0, le=SEED_MAX)
    ignore_eos: bool | None = None


class AudioOutputParams(StrictBody):
    voice: str | VoiceRef | None = None  # None: the server's default voice
    format: Literal["wav", "mp3", "flac", "opus", "aac", "pcm16"] = "wav"

    @property
    def voice_name(self) -> str | None:
        return self.voice.id if isinstance(self.voice, VoiceRef) else self.voice


class StreamOptions(StrictBody):
    include_usage: bool = False
    include_obfuscation: bool | None = None  # OpenAI's stream padding: nothing to pad here


class ChatCompletionRequest(LenientBody):
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
    n: int | None = Field(None, ge=1, le=MAX_CHOICES)
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    presence_penalty: float | None = Field(None, ge=-OPENAI_PENALTY_MAX, le=OPENAI_PENALTY_MAX)
    frequency_penalty: float | None = Field(None, ge=-OPENAI_PENALTY_MAX, le=OPENAI_PENALTY_MAX)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    tools: list[ToolDefinition] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    # Known fields honoured only at their no-op value (a 400 otherwise).
    logit_bias: dict[str, float] | None = None
    response_format: dict[str, Any] | None = None
    prediction: dict[str, Any] | None = None
    web_search_options: dict[str, Any] | None = None
    functions: list[dict[str, Any]] | None = None
    function_call: str | dict[str, Any] | None = None
    # vLLM / vLLM-Omni extensions.
    ignore_eos: bool = False
    min_tokens: int | None = Field(None, ge=0)
    stop_token_ids: list[int] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    mm_processor_kwargs: MMProcessorKwargs | None = None
    sampling_params_list: list[StageSamplingParams] | None = None
    speaker: str | None = Field(None, description="vLLM-Omni: the voice (an alias of audio.voice)")
    choice_per_modality: bool | None = Field(
        None, description="extension: vLLM-Omni's response shape, the text in choices[0] and the audio in choices[1] "
                          "(not streamed). None: on when sampling_params_list (vLLM-Omni's own field) is given")
    initial_codec_chunk_frames: int | None = Field(
        None, ge=1, le=300, description="extension: codec frames (the model's; 80 ms each for Qwen3-Omni) in the "
                                        "first audio chunk; smaller starts audio sooner. Default: chosen by load")

    @model_validator(mode="after")
    def _honourable(self) -> ChatCompletionRequest:
        """Fields set to something this server cannot do are refused, naming the field."""
        refused = {
            "logit_bias": bool(self.logit_bias),
            "response_format": self.response_format is not None and self.response_format.get("type") != "text",
            "prediction": self.prediction is not None,
            "web_search_options": self.web_search_options is not None,
            "functions": bool(self.functions),
            "function_call": self.function_call is not None,
        }
        for name, bad in refused.items():
            if bad:
                hint = "; use tools/tool_choice" if name.startswith("function") else ""
                raise ValueError(f"{name} is not supported by this server{hint}")
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs: true")
        return self

    @property
    def choices(self) -> int:
        return self.n or 1

    @property
    def split_modalities(self) -> bool:
        """vLLM-Omni's clients read one choice per modality; they say who they are with sampling_params_list."""
        return self.choice_per_modality if self.choice_per_modality is not None \
            else self.sampling_params_list is not None

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

FinishReasonName = Literal["stop", "length", "tool_calls"]


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


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None


class TokenLogprobInfo(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChoiceLogprobs(BaseModel):
    content: list[TokenLogprobInfo] | None
    refusal: None = None


class ChatCompletionMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    refusal: str | None = None
    audio: ChatCompletionAudio | None = None
    tool_calls: list[ToolCall] | None = None


class ChatCompletionChoice(BaseModel):
    index: int = 0
    message: ChatCompletionMessage
    finish_reason: FinishReasonName
    logprobs: ChoiceLogprobs | None = None


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


class DeltaFunctionCall(BaseModel):
    name: str | None = None
    arguments: str | None = None


class DeltaToolCall(BaseModel):
    """A tool call's first delta carries ``id``, ``type`` and the name; later ones argument text."""

    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: DeltaFunctionCall


class ChoiceDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    audio: DeltaAudio | None = None
    tool_calls: list[DeltaToolCall] | None = None


class ChunkChoice(BaseModel):
    index: int = 0
    delta: ChoiceDelta
    finish_reason: FinishReasonName | None = None
    logprobs: ChoiceLogprobs | None = None


class ChatCompletionChunk(BaseModel):
    """One ``data:`` event of a streamed chat completion (served as text/event-stream). ``modality`` says what
    the chunk carries ("text" or "audio"), as vLLM-Omni's clients read it."""

    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: UsageInfo | None = None
    modality: Literal["text", "audio"] | None = "text"
