"""The two multipart routes, read into a ``TranscriptionForm`` and served by one ``TranscriptionService``.

The openai SDK sends list fields with brackets (``timestamp_granularities[]``, ``include[]``); curl users
often leave them off, so both spellings are read.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, File, Form, Request, UploadFile
from fastapi.responses import Response

from omnistage.entrypoints.openai.common.admission import Admission
from omnistage.entrypoints.openai.common.decode_pool import DecodePool
from omnistage.entrypoints.openai.common.metrics import ServerMetrics
from omnistage.entrypoints.openai.common.protocol import ErrorResponse
from omnistage.entrypoints.openai.common.recogniser import ServedRecogniser
from omnistage.entrypoints.openai.common.served_model import ServedModel
from omnistage.entrypoints.openai.engine_protocol import OmniEngine
from omnistage.entrypoints.openai.server_config import ServerLimits
from omnistage.entrypoints.openai.transcription.protocol import (
    Granularity,
    ResponseFormat,
    Transcription,
    TranscriptionForm,
    TranscriptionVerbose,
    TranscriptTextDelta,
    TranscriptTextDone,
    Translation,
    TranslationVerbose,
)
from omnistage.entrypoints.openai.transcription.service import TranscriptionService

_ERRORS: dict[int | str, dict[str, object]] = {
    status: {"model": ErrorResponse, "description": why} for status, why in (
        (400, "invalid request: bad field, not audio, over a limit (the message names the flag), or a "
              "text-to-speech checkpoint"),
        (401, "missing or wrong API key (--api-key)"), (404, "unknown model"),
        (413, "request body over --max-request-bytes"), (429, "over --max-queued-requests (see Retry-After)"),
        (500, "engine failure"), (503, "a stage has no healthy replica, or aborted"),
        (504, "over --request-timeout"))}
_REF = "#/components/schemas/{model}"
_TEXT = {"text/plain": {"schema": {"type": "string", "description": "text, srt or vtt"}}}


def _event_schema(model: type[TranscriptTextDelta | TranscriptTextDone]) -> dict[str, object]:
    schema = model.model_json_schema(ref_template=_REF, mode="serialization")
    schema.pop("$defs", None)  # its nested models are components already (the json response's usage)
    return schema


_SSE = {"text/event-stream": {"schema": {"oneOf": [_event_schema(TranscriptTextDelta),
                                                   _event_schema(TranscriptTextDone)]}}}

File_ = Annotated[UploadFile, File(description="the audio: wav, flac, mp3, ogg, webm, m4a, mp4...")]
Model = Annotated[str, Form()]
Prompt = Annotated[str | None, Form(description="earlier text whose spelling and style to follow")]
Format = Annotated[ResponseFormat, Form()]
Temperature = Annotated[float | None, Form(ge=0.0, le=1.0, description="0 (default): greedy")]
Granularities = Annotated[list[Granularity] | None, Form(alias="timestamp_granularities[]")]
GranularitiesPlain = Annotated[list[Granularity] | None, Form(alias="timestamp_granularities")]
Include = Annotated[list[str] | None, Form(alias="include[]")]


def transcription_router(engine: OmniEngine, limits: ServerLimits, admission: Admission, pool: DecodePool,
                         served: ServedModel, metrics: ServerMetrics,
                         recogniser: ServedRecogniser | None = None) -> APIRouter:
    """``recogniser``: a speech recogniser served beside the model, which a request takes by naming it."""
    services = [TranscriptionService(engine, limits, admission, pool, served, metrics)]
    if recogniser is not None:
        services.append(TranscriptionService(recogniser.engine, limits, recogniser.admission, pool,
                                             recogniser.served, metrics))

    def service_for(model: str) -> TranscriptionService:
        """The service of the model a request names (the main one's, which answers an unknown name)."""
        return next((s for s in services[1:] if model in s.served.names), services[0])

    router = APIRouter(tags=["audio"])

    @router.post("/v1/audio/transcriptions", response_model=Transcription | TranscriptionVerbose,
                 responses={**_ERRORS, 200: {"content": {**_TEXT, **_SSE},
                                             "description": "json or verbose_json; text, srt or vtt as text; "
                                                            "SSE transcript.text events when stream=true"}})
    async def create_transcription(
            request: Request, file: File_, model: Model, language: Annotated[str | None, Form()] = None,
            prompt: Prompt = None, response_format: Format = "json", temperature: Temperature = None,
            timestamp_granularities: Granularities = None, granularities_plain: GranularitiesPlain = None,
            stream: Annotated[bool, Form()] = False, include: Include = None,
            chunking_strategy: Annotated[str | None, Form()] = None) -> Response:
        form = TranscriptionForm(model=model, language=language, prompt=prompt, response_format=response_format,
                                 temperature=temperature, stream=stream, include=tuple(include or ()),
                                 granularities=tuple(timestamp_granularities or granularities_plain or ()),
                                 chunking_strategy=chunking_strategy)
        return await service_for(model).create(form, file, request)

    @router.post("/v1/audio/translations", response_model=Translation | TranslationVerbose,
                 responses={**_ERRORS, 200: {"content": _TEXT, "description": "json or verbose_json; text, srt "
                                                                             "or vtt as text"}})
    async def create_translation(request: Request, file: File_, model: Model, prompt: Prompt = None,
                                 response_format: Format = "json", temperature: Temperature = None) -> Response:
        form = TranscriptionForm(model=model, translate=True, prompt=prompt, response_format=response_format,
                                 temperature=temperature)
        return await service_for(model).create(form, file, request)

    return router
