"""``/v1/responses`` request bodies, and the response object and stream events, mirroring the ``openai`` package's
``openai.types.responses`` field for field (the tests validate every one against them).

Input items are typed by their ``type`` (a message may leave it out, as ``EasyInputMessage`` does); their unknown
fields are dropped as read, never stored with the response (``IgnoringBody``). Known fields this server cannot
honour (``background``, ``conversation``, ``prompt``, ``truncation: "auto"``, a JSON ``text``
format, ``top_logprobs``) are refused with a 400 naming them; unknown top-level fields (``service_tier``,
``prompt_cache_key``, ``safety_identifier``...) are ignored, as chat ignores them.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Discriminator, Field, Tag, model_validator

from omnistage.entrypoints.openai.common.protocol import IgnoringBody, LenientBody, StrictBody
from omnistage.sampling_params import SEED_MAX

# ---- request: input content and items ----------------------------------------------------------------------


class InputText(StrictBody):
    type: Literal["input_text"]
    text: str


class InputImage(IgnoringBody):
    type: Literal["input_image"]
    image_url: str | None = Field(None, description="data: URL, file:// under --allowed-local-media-path, http(s)")
    file_id: str | None = None  # the Files API is not served: refused when set
    detail: Literal["low", "high", "auto"] | None = None  # accepted, not used


class InputAudioData(StrictBody):
    data: str = Field(description="base64-encoded audio file bytes")
    format: Literal["wav", "mp3", "flac"]


class InputAudio(StrictBody):
    type: Literal["input_audio"]
    input_audio: InputAudioData


class InputFile(IgnoringBody):
    """Declared so that it is refused by name (the Files API is not served)."""

    type: Literal["input_file"]


class OutputTextIn(IgnoringBody):
    """An earlier answer's text, sent back as input (annotations and logprobs are not read)."""

    type: Literal["output_text"]
    text: str


class RefusalIn(IgnoringBody):
    type: Literal["refusal"]
    refusal: str


InputPart = Annotated[InputText | InputImage | InputAudio | InputFile | OutputTextIn | RefusalIn,
                      Field(discriminator="type")]


class MessageItem(IgnoringBody):
    """An ``EasyInputMessage``, an input ``message`` item, or an earlier ``ResponseOutputMessage``."""

    type: Literal["message"] | None = None
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[InputPart]
    id: str | None = None


class FunctionCallItem(IgnoringBody):
    """An earlier answer's call, sent back with its output."""

    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str
    id: str | None = None


class FunctionCallOutputItem(IgnoringBody):
    type: Literal["function_call_output"]
    call_id: str
    output: str | list[InputPart]
    id: str | None = None


def _item_type(value: object) -> str:
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    return kind or "message"


InputItem = Annotated[Annotated[MessageItem, Tag("message")] | Annotated[FunctionCallItem, Tag("function_call")]
                      | Annotated[FunctionCallOutputItem, Tag("function_call_output")], Discriminator(_item_type)]

# ---- request: tools and the body -----------------------------------------------------------------------------


class FunctionTool(LenientBody):
    type: Literal["function"]
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.:-]+$")
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON Schema object, shown to the model as given
    strict: bool | None = None


class FunctionChoice(StrictBody):
    type: Literal["function"]
    name: str


ToolChoice = Literal["none", "auto", "required"] | FunctionChoice


class TextFormat(LenientBody):
    type: str = "text"


class TextConfig(LenientBody):
    format: TextFormat | None = None
    verbosity: str | None = None  # a hint this server does not read


class AudioOutput(StrictBody):
    voice: str | None = None  # None: the server's default voice; the audio is PCM16 at 24 kHz


class ResponsesRequest(LenientBody):
    model: str
    input: str | list[InputItem]
    instructions: str | None = None
    previous_response_id: str | None = None
    store: bool | None = True
    stream: bool | None = False
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    tools: list[FunctionTool] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    metadata: dict[str, str] | None = None
    include: list[str] | None = None  # extra output (encrypted reasoning, logprobs...) this server has none of
    reasoning: dict[str, Any] | None = None  # effort hints: Qwen3-Omni's Instruct thinker does not reason
    text: TextConfig | None = None
    seed: int | None = Field(None, ge=0, le=SEED_MAX, description="extension (as vLLM's)")
    modalities: list[Literal["text", "audio"]] | None = Field(
        None, description="extension (vLLM-Omni's): with 'audio' and stream: true the spoken answer streams as "
                          "response.audio.* events (OpenAI's Response object has no place for audio)")
    audio: AudioOutput | None = Field(None, description="extension: the voice of the spoken answer")
    # Known fields honoured only at their no-op value (a 400 otherwise).
    background: bool | None = None
    conversation: str | dict[str, Any] | None = None
    prompt: dict[str, Any] | None = None
    truncation: Literal["auto", "disabled"] | None = None
    top_logprobs: int | None = Field(None, ge=0)
    context_management: list[dict[str, Any]] | None = None

    @model_validator(mode="after")
    def _honourable(self) -> ResponsesRequest:
        refused = {
            "background": bool(self.background),
            "conversation": self.conversation is not None,
            "prompt": self.prompt is not None,
            "truncation": self.truncation == "auto",
            "text": self.text is not None and self.text.format is not None and self.text.format.type != "text",
            "top_logprobs": bool(self.top_logprobs),
            "context_management": bool(self.context_management),
        }
        for name, bad in refused.items():
            if bad:
                raise ValueError(f"{name} is not supported by this server")
        if self.speaks and not self.stream:
            raise ValueError("audio output needs stream: true (OpenAI's Response object has no place for audio)")
        return self

    @property
    def speaks(self) -> bool:
        return "audio" in (self.modalities or ())


# ---- the response object ------------------------------------------------------------------------------------

Status = Literal["completed", "failed", "in_progress", "incomplete"]


class OutputText(BaseModel):
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[dict[str, Any]] = Field(default_factory=list)
    logprobs: list[dict[str, Any]] = Field(default_factory=list)


class OutputMessage(BaseModel):
    type: Literal["message"] = "message"
    id: str
    role: Literal["assistant"] = "assistant"
    status: Literal["in_progress", "completed", "incomplete"]
    content: list[OutputText]


class FunctionCallOut(BaseModel):
    type: Literal["function_call"] = "function_call"
    id: str
    call_id: str
    name: str
    arguments: str
    status: Literal["in_progress", "completed", "incomplete"]


OutputItem = Annotated[OutputMessage | FunctionCallOut, Field(discriminator="type")]


class InputTokensDetails(BaseModel):
    cached_tokens: int = 0  # prompt tokens served from the prefix cache
    cache_write_tokens: int = 0


class OutputTokensDetails(BaseModel):
    reasoning_tokens: int = 0


class ResponseUsage(BaseModel):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails = Field(default_factory=OutputTokensDetails)
    total_tokens: int


class IncompleteDetails(BaseModel):
    reason: Literal["max_output_tokens"] = "max_output_tokens"


class ResponseErrorInfo(BaseModel):
    code: Literal["server_error"] = "server_error"
    message: str


class TextConfigOut(BaseModel):
    format: dict[str, str] = Field(default_factory=lambda: {"type": "text"})


class FunctionToolOut(BaseModel):
    type: Literal["function"] = "function"
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ResponseObject(BaseModel):
    """OpenAI's ``Response``."""

    id: str
    object: Literal["response"] = "response"
    created_at: int
    completed_at: int | None = None
    status: Status
    model: str
    output: list[OutputItem] = Field(default_factory=list)
    instructions: str | None = None
    previous_response_id: str | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    tools: list[FunctionToolOut] = Field(default_factory=list)
    tool_choice: Literal["none", "auto", "required"] | FunctionChoice = "auto"
    parallel_tool_calls: bool = True
    metadata: dict[str, str] | None = None
    text: TextConfigOut = Field(default_factory=TextConfigOut)
    truncation: Literal["disabled"] = "disabled"
    background: bool = False
    store: bool = True
    usage: ResponseUsage | None = None
    incomplete_details: IncompleteDetails | None = None
    error: ResponseErrorInfo | None = None


class ResponseDeleted(BaseModel):
    id: str
    object: Literal["response"] = "response"  # as OpenAI answers a DELETE
    deleted: bool = True
