"""The ``WS /v1/realtime`` route and its installation: checks the model and the chat template, then hands the
socket to a :class:`~omnistage.entrypoints.openai.realtime.session_loop.RealtimeSession`."""

from __future__ import annotations

from fastapi import APIRouter, FastAPI, WebSocket

from omnistage.audio.vad_backend import VadBackend, vad_backend
from omnistage.entrypoints.openai.common.admission import Admission
from omnistage.entrypoints.openai.common.decode_pool import DecodePool
from omnistage.entrypoints.openai.common.ephemeral_keys import EphemeralKeys, claimed_session, ephemeral_claim
from omnistage.entrypoints.openai.common.errors import no_such_model
from omnistage.entrypoints.openai.common.recogniser import ServedRecogniser
from omnistage.entrypoints.openai.common.request_checks import no_chat
from omnistage.entrypoints.openai.common.served_model import ServedModel
from omnistage.entrypoints.openai.engine_protocol import OmniEngine
from omnistage.entrypoints.openai.realtime.beta import wants_beta
from omnistage.entrypoints.openai.realtime.client_secrets import router as client_secrets_router
from omnistage.entrypoints.openai.realtime.protocol import EventError, error_event
from omnistage.entrypoints.openai.realtime.service import VAD_WORKERS, RealtimeService
from omnistage.entrypoints.openai.realtime.session_loop import RealtimeSession
from omnistage.entrypoints.openai.realtime.speculation import CountOutcome, ignore_outcome
from omnistage.entrypoints.openai.realtime.transport import WebSocketTransport
from omnistage.entrypoints.openai.server_config import ServerLimits
from omnistage.entrypoints.openai.webrtc.route import CALLS_PATH

router = APIRouter()
REALTIME_PATH = "/v1/realtime"
# Where an ephemeral key opens a session (the access middleware's (scope type, path) pairs).
EPHEMERAL_ROUTES = frozenset({("websocket", REALTIME_PATH), ("http", CALLS_PATH)})


@router.websocket(REALTIME_PATH)
async def realtime(ws: WebSocket) -> None:
    service: RealtimeService = ws.app.state.realtime
    # OpenAI's browser SDKs offer "realtime" beside the key subprotocol and expect it back, as OpenAI answers.
    await ws.accept(subprotocol="realtime" if "realtime" in ws.scope.get("subprotocols", ()) else None)
    model = ws.query_params.get("model")
    # ?model= naming the recogniser served beside the model: a transcription session written down by it.
    recognised = service.recogniser is not None and service.recogniser.serves(model)
    if model is not None and model not in service.served.names and not recognised:
        await ws.send_json(error_event(EventError("model_not_found", no_such_model(model), "model")))
        await ws.close(code=1008)
        return
    front = service.engine.front_end
    if front.processor is None and front.transcriber is None:
        await ws.send_json(error_event(EventError("chat_not_supported", no_chat(service.engine), "model")))
        await ws.close(code=1008)
        return
    claim = ephemeral_claim(ws.scope)
    if claim is not None:
        claim.spend()  # the session is set up: its key is used (a handshake refused above left it usable)
    # OpenAI's transcription sessions are opened with ?intent=transcription (or turned into one by session.update);
    # a speech recogniser's sessions are nothing else.
    recogniser = front.processor is None
    kind = "transcription" if recogniser or recognised or ws.query_params.get("intent") == "transcription" \
        else "realtime"
    settings = claimed_session(ws.scope)
    if settings is None and recognised:
        settings = {"type": "transcription", "audio": {"input": {"transcription": {"model": model}}}}
    await RealtimeSession(WebSocketTransport(ws), service, beta=wants_beta(dict(ws.headers)), kind=kind,
                          settings=settings).run()


def install_realtime(app: FastAPI, engine: OmniEngine, limits: ServerLimits,
                     admission: Admission | None = None, pool: DecodePool | None = None,
                     served: ServedModel | None = None, vad: VadBackend | None = None, streaming_input: bool = True,
                     speculative_reply_ms: int = 0, count_speculation: CountOutcome = ignore_outcome,
                     first_chunk_frames: int | None = None, recogniser: ServedRecogniser | None = None) -> None:
    """``admission`` and ``pool``: the bound and the decode pool the HTTP endpoints share (a realtime response
    takes a place like a request, its prompt is built in the same pool). ``vad``: the server_vad detector
    (default: Silero, or the energy detector when its model cannot load). Ephemeral keys are minted into
    ``app.state.ephemeral_keys`` (``POST /v1/realtime/client_secrets``); ``install_webrtc`` then runs the same
    sessions over WebRTC.
    ``streaming_input``: sessions prefill a turn while it is spoken unless they say otherwise;
    ``speculative_reply_ms``: and start its reply at a pause that long (0: never), unless they say otherwise;
    ``count_speculation``: told each speculative reply's outcome (``/metrics``); ``first_chunk_frames``: codec
    frames in a reply's first code2wav chunk (None: the stage's choice); ``recogniser``: a speech recogniser served
    beside the model, which a session's ``transcription.model`` may name."""
    app.state.realtime = RealtimeService(engine, limits, admission or Admission(engine, limits.max_queued_requests),
                                         pool or DecodePool(limits.decode_workers), served or ServedModel.of(engine),
                                         vad or vad_backend(), DecodePool(VAD_WORKERS, "vad"), streaming_input,
                                         speculative_reply_ms, count_speculation, first_chunk_frames, recogniser)
    app.state.ephemeral_keys = EphemeralKeys()
    app.include_router(router)
    app.include_router(client_secrets_router)
