"""The OpenAI-compatible HTTP server: routes, app assembly, and ``omnistage serve``.

``build_app(engine)`` wires the services to an ``OmniEngine`` (``serve_command.py`` runs it for
``omnistage serve``). The OpenAPI schema is the
one FastAPI derives from the routes, with its 422 entries swapped for the 400
``ErrorResponse`` this server really answers with.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response
from fastapi.telemetry import TelemetryConfig
from prometheus_client import CONTENT_TYPE_LATEST

from omnistage.audio.vad_backend import vad_backend
from omnistage.entrypoints.openai.chat.inputs import ChatPromptBuilder
from omnistage.entrypoints.openai.chat.protocol import (
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
)
from omnistage.entrypoints.openai.chat.service import ChatService
from omnistage.entrypoints.openai.chat.spoken import spoken_chat
from omnistage.entrypoints.openai.common.admission import Admission
from omnistage.entrypoints.openai.common.auth import AccessMiddleware
from omnistage.entrypoints.openai.common.body_limit import BodyLimitMiddleware
from omnistage.entrypoints.openai.common.decode_pool import DecodePool
from omnistage.entrypoints.openai.common.draining import Draining, DrainingMiddleware
from omnistage.entrypoints.openai.common.errors import install_error_handlers
from omnistage.entrypoints.openai.common.http_spans import ResponseBytes, untraced
from omnistage.entrypoints.openai.common.loop_lag import loop_lag_watcher
from omnistage.entrypoints.openai.common.metrics import ServerMetrics
from omnistage.entrypoints.openai.common.protocol import (
    ErrorResponse,
    HealthResponse,
    ModelCard,
    ReadinessResponse,
    ModelList,
    ReplicaHealthInfo,
    StageHealthInfo,
)
from omnistage.entrypoints.openai.common.prescan import BudgetedRoute
from omnistage.entrypoints.openai.common.recogniser import ServedRecogniser
from omnistage.entrypoints.openai.common.served_model import ServedModel
from omnistage.entrypoints.openai.engine_protocol import OmniEngine
from omnistage.entrypoints.openai.landing import PUBLIC_PATHS, PUBLIC_PREFIX, install_landing
from omnistage.entrypoints.openai.live.route import EPHEMERAL_LIVE_ROUTES, LIVE_PREFIX, install_live
from omnistage.entrypoints.openai.media.loaders import MediaFetcher
from omnistage.entrypoints.openai.realtime.route import EPHEMERAL_ROUTES, install_realtime
from omnistage.entrypoints.openai.responses.route import responses_router
from omnistage.entrypoints.openai.server_config import (
    AccessPolicy,
    MediaPolicy,
    ServerLimits,
    ServingOptions,
    WebRtcPolicy,
)
from omnistage.entrypoints.openai.speech.protocol import (
    SpeechAudioDelta,
    SpeechAudioDone,
    SpeechRequest,
    VoiceCreateRequest,
    VoiceDeleted,
    VoiceList,
    VoiceObject,
)
from omnistage.entrypoints.openai.speech.service import SpeechService
from omnistage.entrypoints.openai.speech.stream import router as speech_stream_router
from omnistage.entrypoints.openai.speech.voice_store import VoiceStore
from omnistage.entrypoints.openai.speech.voices_service import VoiceService
from omnistage.entrypoints.openai.transcription.route import transcription_router
from omnistage.entrypoints.openai.webrtc.route import CALL_PREFIX, install_webrtc
from omnistage.pipeline.reports import HealthReport

if TYPE_CHECKING:
    from omnistage.tracing.otel import Tracing


@dataclass
class Services:
    engine: OmniEngine
    served: ServedModel
    chat: ChatService
    speech: SpeechService
    voices: VoiceService
    metrics: ServerMetrics
    recogniser: ServedRecogniser | None = None  # serve --transcription-model: a speech recogniser beside the model
    draining: Draining = field(default_factory=Draining)
    created: int = field(default_factory=lambda: int(time.time()))

    def health(self) -> HealthReport:
        """The model's pipeline's health, and the recogniser's beside it: its stages join the report, so a
        recogniser that cannot serve leaves the server degraded (the model's outputs still served)."""
        report = self.engine.health()
        if self.recogniser is None:
            return report
        return replace(report, stages=report.stages + self.recogniser.engine.health().stages)


async def _services(request: Request) -> Services:
    # async: FastAPI runs a plain ``def`` dependency in its thread pool, a thread hop on every request for an
    # attribute read.
    return request.app.state.services


_ERRORS: dict[int | str, dict[str, object]] = {
    400: {"model": ErrorResponse, "description": "invalid request"},
    401: {"model": ErrorResponse, "description": "missing or wrong API key (--api-key)"},
    404: {"model": ErrorResponse, "description": "unknown model"},
    413: {"model": ErrorResponse, "description": "request body over --max-request-bytes"},
    429: {"model": ErrorResponse, "description": "over --max-queued-requests (see Retry-After)"},
    500: {"model": ErrorResponse, "description": "engine failure"},
    503: {"model": ErrorResponse, "description": "a stage has no healthy replica (see Retry-After), or aborted"},
    504: {"model": ErrorResponse, "description": "over --request-timeout"},
}
_SSE_DOC = {"text/event-stream": {"schema": {"$ref": "#/components/schemas/ChatCompletionChunk"}}}
_AUDIO_DOC = {t: {"schema": {"type": "string", "format": "binary"}}
              for t in ("audio/mpeg", "audio/ogg", "audio/aac", "audio/flac", "audio/wav", "audio/pcm")}
_SPEECH_SSE_DOC = {"text/event-stream": {"schema": {"$ref": "#/components/schemas/SpeechAudioDelta"}}}

api = APIRouter(route_class=BudgetedRoute)  # chat bodies are counted before FastAPI validates them


@api.post("/v1/chat/completions", response_model=ChatCompletionResponse,
          responses={**_ERRORS, 200: {"content": _SSE_DOC, "description": "JSON, or SSE chunks when stream=true"}})
async def chat_completions(body: ChatCompletionRequest, request: Request,
                           services: Services = Depends(_services)) -> Response:
    return await services.chat.create(body, request)


@api.post("/v1/audio/speech", response_class=Response,
          responses={**_ERRORS, 200: {"content": {**_AUDIO_DOC, **_SPEECH_SSE_DOC}, "description": "audio bytes"}})
async def audio_speech(body: SpeechRequest, request: Request, services: Services = Depends(_services)) -> Response:
    return await services.speech.create(body, request)


@api.post("/v1/audio/voices", response_model=VoiceObject,
          responses={**_ERRORS, 409: {"model": ErrorResponse, "description": "a voice of that name exists"}})
async def create_voice(body: VoiceCreateRequest, services: Services = Depends(_services)) -> VoiceObject:
    return await services.voices.create(body)


@api.get("/v1/audio/voices", response_model=VoiceList, responses=_ERRORS)
async def list_voices(services: Services = Depends(_services)) -> VoiceList:
    return services.voices.list()


@api.delete("/v1/audio/voices/{name}", response_model=VoiceDeleted, responses=_ERRORS)
async def delete_voice(name: str, services: Services = Depends(_services)) -> VoiceDeleted:
    return services.voices.delete(name)


@api.get("/v1/models", response_model=ModelList)
async def list_models(services: Services = Depends(_services)) -> ModelList:
    names = services.served.names + (services.recogniser.served.names if services.recogniser is not None else ())
    return ModelList(data=[ModelCard(id=name, created=services.created) for name in names])


@api.get("/v1/models/{model:path}", response_model=ModelCard, responses={404: _ERRORS[404]})
async def get_model(model: str, services: Services = Depends(_services)) -> ModelCard:
    if services.recogniser is None or not services.recogniser.serves(model):
        services.served.check(model)
    return ModelCard(id=model, created=services.created)


def _health_body(report: HealthReport) -> HealthResponse:
    stages = [StageHealthInfo(stage=s.stage, healthy=s.healthy,
                              replicas=[ReplicaHealthInfo(replica=r.replica, healthy=r.healthy, detail=r.detail,
                                                          kv_blocks_total=r.kv_blocks_total,
                                                          kv_cache_bytes=r.kv_cache_bytes)
                                        for r in s.replicas])
              for s in report.stages]
    return HealthResponse(status=report.status, stages=stages)


@api.get("/health", response_model=HealthResponse,
         responses={503: {"model": HealthResponse, "description": "no output can be served: a stage it needs "
                                                                 "has no healthy replica"}})
async def health(services: Services = Depends(_services)) -> JSONResponse:
    """Liveness: 200 while the server can serve something, ``degraded`` when only some outputs (text without the
    lost talker's node); restarting this process would not bring a lost node back."""
    report = services.health()
    return JSONResponse(_health_body(report).model_dump(), status_code=503 if report.status == "unhealthy" else 200)


@api.get("/ready", response_model=ReadinessResponse,
         responses={503: {"model": ReadinessResponse,
                          "description": "draining (stopping), or a stage is down (degraded or unhealthy)"}})
async def ready(services: Services = Depends(_services)) -> JSONResponse:
    """Readiness, apart from liveness (``/health``): false at once when the server starts to stop, while it still
    finishes the streams it holds."""
    health = services.health().status
    status = "draining" if services.draining.draining else "ready" if health == "ok" else health
    return JSONResponse(ReadinessResponse(status=status).model_dump(), status_code=200 if status == "ready" else 503)


@api.get("/metrics", response_class=Response,
         responses={200: {"content": {CONTENT_TYPE_LATEST: {"schema": {"type": "string"}}}}})
async def metrics(services: Services = Depends(_services)) -> Response:
    return Response(services.metrics.render(), media_type=CONTENT_TYPE_LATEST)


def _openapi_schema(app: FastAPI, keyed: bool) -> dict[str, object]:
    """FastAPI's schema, minus the 422s this server never sends (they leave as 400s), plus the
    models only streamed responses use (FastAPI sees no return type for those); behind ``--api-key``, the bearer
    scheme every route needs (so /docs' "Authorize" button sends the key)."""
    if app.openapi_schema is None:
        schema = FastAPI.openapi(app)
        if keyed:
            schema.setdefault("components", {})["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
            schema["security"] = [{"bearer": []}]
        for path in schema.get("paths", {}).values():
            for operation in path.values():
                operation.get("responses", {}).pop("422", None)
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        for name in ("HTTPValidationError", "ValidationError"):
            components.pop(name, None)
        for model in (ChatCompletionChunk, SpeechAudioDelta, SpeechAudioDone):
            model_schema = model.model_json_schema(ref_template="#/components/schemas/{model}", mode="serialization")
            for name, definition in model_schema.pop("$defs", {}).items():
                components.setdefault(name, definition)
            components.setdefault(model.__name__, model_schema)
        app.openapi_schema = schema
    return app.openapi_schema


def _telemetry(tracing: Tracing | None) -> TelemetryConfig | None:
    """FastAPI's native telemetry: when the server traces, a span per ``/v1/`` request made by the server's own
    tracer provider, and nothing else (its metrics and logs are Prometheus's and ours; no per-operation spans:
    a streamed reply's endpoint returns before its pipeline is done, and the pipeline's spans go under the
    request's). None keeps FastAPI's default: off, unless this process set up a global provider."""
    if tracing is None:
        return None
    return {"tracer_provider": tracing.provider, "metrics": False, "logs": False, "operation_spans": False,
            "auto_configure": False, "exclude": untraced}


def build_app(engine: OmniEngine, limits: ServerLimits | None = None, media: MediaPolicy | None = None,
              access: AccessPolicy | None = None, serving: ServingOptions | None = None,
              webrtc: WebRtcPolicy | None = None, tracing: Tracing | None = None,
              recogniser_engine: OmniEngine | None = None) -> FastAPI:
    """``recogniser_engine``: a speech recogniser's pipeline served beside ``engine`` (``serve
    --transcription-model``): listed by /v1/models, taken by the transcription routes and realtime input
    transcription that name it, under the same admission bound."""
    limits = limits or ServerLimits()
    serving = serving or ServingOptions()
    served = ServedModel.of(engine, serving)
    metrics = ServerMetrics(engine)
    pool = DecodePool(limits.decode_workers)  # decoding and preprocessing of every endpoint, bounded
    fetcher = MediaFetcher(media or MediaPolicy(), limits)  # one media policy for chat and speech references
    builder = ChatPromptBuilder(engine.front_end.processor, fetcher, limits, pool)
    access = access or AccessPolicy()
    # docs_url/redoc_url None: FastAPI's pages load from a CDN; install_landing serves them from local assets.
    app = FastAPI(title="omnistage", version="0.1.0", summary="OpenAI-compatible Qwen3-Omni server",
                  docs_url=None, redoc_url=None, lifespan=lambda _: loop_lag_watcher(metrics.loop_lag, serving.trace_loop_stalls_ms),
                  telemetry=_telemetry(tracing))
    admission = Admission(engine, limits.max_queued_requests)  # one bound shared by every endpoint
    recogniser = ServedRecogniser.beside(recogniser_engine, admission) if recogniser_engine is not None else None
    store = VoiceStore(serving.voices_dir, limits.max_voices) if serving.voices_dir is not None else None
    app.state.limits = limits
    app.state.pool = pool  # large JSON bodies are read there (common/prescan.py)
    speech = SpeechService(engine, metrics, limits, admission, pool, served, store, fetcher=fetcher)
    app.state.services = Services(engine=engine, served=served,
                                  chat=ChatService(engine, builder, metrics, admission, served,
                                                   spoken_chat(engine, served, speech.inputs, limits)),
                                  speech=speech,
                                  voices=VoiceService(engine, limits, store, admission, pool),
                                  metrics=metrics, recogniser=recogniser)
    app.include_router(api)
    app.include_router(speech_stream_router)  # WS /v1/audio/speech/stream
    app.include_router(transcription_router(engine, limits, admission, pool, served, metrics, recogniser))  # STT
    app.include_router(responses_router(engine, builder, admission, served, metrics))  # /v1/responses
    install_realtime(app, engine, limits, admission, pool, served, vad_backend(serving.vad),  # WS /v1/realtime
                     serving.streaming_input, serving.speculative_reply_ms, metrics.count_speculation,
                     serving.realtime_first_chunk_frames, recogniser)
    install_webrtc(app, serving.ice_servers, webrtc)  # the same sessions over WebRTC: POST /v1/realtime/calls
    install_live(app)  # OpenAI's GPT-Live API on the same sessions: WS and POST /v1/live/sessions
    app.add_middleware(BodyLimitMiddleware, max_bytes=limits.max_request_bytes)
    install_landing(app, served, keyed=bool(access.api_keys))  # /, /docs, /redoc and their assets
    # Outermost: refused before any read. The landing's pages (no secret in them) stay open.
    app.add_middleware(AccessMiddleware, policy=access, public_paths=PUBLIC_PATHS, public_prefix=PUBLIC_PREFIX,
                       ephemeral_keys=app.state.ephemeral_keys,
                       ephemeral_routes=EPHEMERAL_ROUTES | EPHEMERAL_LIVE_ROUTES,
                       ephemeral_owned_prefix=(CALL_PREFIX, LIVE_PREFIX))
    # Outside the key check: a request that comes while the server stops is told to go elsewhere, keyed or not.
    app.add_middleware(DrainingMiddleware, draining=app.state.services.draining)
    if tracing is not None:  # FastAPI made the request's span before any middleware runs
        app.add_middleware(ResponseBytes)
    install_error_handlers(app)
    app.openapi = lambda: _openapi_schema(app, bool(access.api_keys))  # type: ignore[method-assign]
    return app
