"""OpenAI's GPT-Live API: ``WS /v1/live/sessions`` (the SDK's ``client.live.connect()``), ``POST
/v1/live/sessions`` (a WebRTC session: the SDK's ``client.live.create``, JSON ``{session, transport: {type:
"webrtc", sdp}}`` → ``{session: {id}, transport: {type: "webrtc", sdp}}``) and ``POST
/v1/live/sessions/{id}/hangup``.

Both run :class:`~omnistage.entrypoints.openai.live.session.LiveSession` over the realtime API's transports and
its service: the same auth (API key, or an ephemeral key from ``/v1/realtime/client_secrets``, spent once the
session is set up), admission, budgets and timeouts as ``/v1/realtime``, and a WebRTC session is a call under
``--webrtc-max-calls`` (``webrtc/calls.py``). :func:`backend_for` picks what a session runs on: a turn-based
family's realtime machinery (``turn_backend.py``), or a duplex family's engine (``duplex_backend.py``), whose
calibrated capacity bounds the sessions: the next one is refused (an ``error`` event on the WebSocket, a 503
with ``Retry-After`` for a WebRTC creation).
"""

from __future__ import annotations

import json
from typing import Any

from aiortc import RTCPeerConnection
from fastapi import APIRouter, FastAPI, Request, WebSocket
from fastapi.responses import JSONResponse

from omnistage.engine.duplex.engine import SessionRefused
from omnistage.entrypoints.openai.common.admission import RETRY_UNHEALTHY_S, Overloaded
from omnistage.entrypoints.openai.common.auth import Unauthorized
from omnistage.entrypoints.openai.common.ephemeral_keys import ephemeral_claim, key_owner
from omnistage.entrypoints.openai.common.errors import APIError, model_not_found
from omnistage.entrypoints.openai.common.request_checks import no_chat
from omnistage.entrypoints.openai.live.backend import LiveBackend
from omnistage.entrypoints.openai.live.duplex_backend import CAPACITY_CODE, DuplexBackend
from omnistage.entrypoints.openai.live.events import StartConfig, start_config
from omnistage.entrypoints.openai.live.key_settings import keyed
from omnistage.entrypoints.openai.live.session import LiveSession
from omnistage.entrypoints.openai.live.turn_backend import TurnBackend
from omnistage.entrypoints.openai.realtime.event_error import EventError
from omnistage.entrypoints.openai.realtime.protocol import SessionConfig
from omnistage.entrypoints.openai.realtime.service import RealtimeService
from omnistage.entrypoints.openai.realtime.transport import WebSocketTransport
from omnistage.entrypoints.openai.webrtc.calls import Calls, CallSession, SessionFactory, TooManyCalls
from omnistage.entrypoints.openai.webrtc.offer import read_body
from omnistage.entrypoints.openai.webrtc.offer_screen import screen_offer
from omnistage.entrypoints.openai.webrtc.route import check_room, too_many
from omnistage.entrypoints.openai.webrtc.transport import WebRtcTransport
from omnistage.pipeline.duplex_omni import DuplexOmni

LIVE_PATH = "/v1/live/sessions"
LIVE_PREFIX = LIVE_PATH + "/"  # a session's own URL: where the ephemeral key that opened it may hang it up
EPHEMERAL_LIVE_ROUTES = frozenset({("websocket", LIVE_PATH), ("http", LIVE_PATH)})
router = APIRouter()


def backend_for(service: RealtimeService) -> LiveBackend:
    """What a Live session runs on for the served model: its duplex engine's session, else a turn-based one."""
    if isinstance(service.engine, DuplexOmni):
        return DuplexBackend(service, service.engine)
    return TurnBackend(service)


def _takes_live(service: RealtimeService) -> bool:
    """A chat model (its turns) or a duplex model (its sessions); a TTS checkpoint or a recogniser is neither."""
    return service.engine.front_end.processor is not None or service.engine.front_end.duplex


def _check_duplex_room(service: RealtimeService) -> None:
    """A WebRTC creation on a duplex engine at capacity: 503 before the offer is answered."""
    if isinstance(service.engine, DuplexOmni):
        try:
            service.engine.sessions.check_room()
        except SessionRefused as exc:
            raise Overloaded(503, f"{exc}; try again later", CAPACITY_CODE, RETRY_UNHEALTHY_S) from None


@router.websocket(LIVE_PATH)
async def live_socket(ws: WebSocket) -> None:
    service: RealtimeService = ws.app.state.realtime
    await ws.accept()
    if not _takes_live(service):
        error = {"type": "invalid_request_error", "code": "chat_not_supported", "message": no_chat(service.engine),
                 "param": "model"}
        await ws.send_json({"type": "error", "event_id": "event_refused", "error": error})
        await ws.close(code=1008)
        return
    claim = ephemeral_claim(ws.scope)
    if claim is not None:
        claim.spend()  # the session is set up: its key is used
    await LiveSession(WebSocketTransport(ws), service, lambda: backend_for(service),
                      key_session=None if claim is None else claim.key.session).run()


_CREATION = {"requestBody": {"required": True, "content": {"application/json": {"schema": {
    "type": "object", "required": ["session", "transport"], "properties": {
        "session": {"type": "object", "description": "as session.start's: model (required), instructions, "
                    "audio.output.voice, input (text history), delegation"},
        "transport": {"type": "object", "required": ["type", "sdp"], "properties": {
            "type": {"type": "string", "enum": ["webrtc"]}, "sdp": {"type": "string"}}}}}}}}}


@router.post(LIVE_PATH, status_code=201, openapi_extra=_CREATION)
async def create_live_session(request: Request) -> JSONResponse:
    calls: Calls = request.app.state.webrtc_calls
    service = calls.service
    if not _takes_live(service):
        raise APIError(400, no_chat(service.engine), param="model", code="chat_not_supported")
    check_room(calls)
    _check_duplex_room(service)
    config, sdp = _creation(await read_body(request, calls.policy.max_offer_bytes), service)
    claim = ephemeral_claim(request.scope)
    if claim is not None:
        config = _keyed(config, claim.key.session)
    sdp = screen_offer(sdp, calls.policy).sdp
    try:
        call, answer = await calls.start(sdp, None, None if claim is None else claim.key.owner,
                                         session=_live_call(service, config))
    except TooManyCalls as exc:
        raise too_many(exc) from None
    except Exception:  # noqa: BLE001 - aiortc raises several kinds for an offer it cannot take, none for a client
        raise APIError(400, "could not answer the SDP offer: it is malformed, or lacks what a call needs (an audio "
                       "section, ICE credentials, a DTLS fingerprint)", param="transport.sdp",
                       code="invalid_offer") from None
    if claim is not None:
        claim.spend()
    return JSONResponse({"session": {"id": call.id}, "transport": {"type": "webrtc", "sdp": answer}},
                        status_code=201)


@router.post(LIVE_PREFIX + "{session_id}/hangup")
async def hang_up_live_session(session_id: str, request: Request) -> JSONResponse:
    call = request.app.state.webrtc_calls.live.get(session_id)
    if call is None:
        raise APIError(404, "no such WebRTC Live session is in progress", param="session_id",
                       code="session_not_found")
    owner = key_owner(request.scope)
    if owner is not None and not call.opened_by(owner):
        raise Unauthorized("this ephemeral key did not open that session")
    await call.hang_up()
    return JSONResponse({})


def _creation(body: bytes, service: RealtimeService) -> tuple[StartConfig, str]:
    """The creation request's session (checked as ``session.start``'s) and SDP offer; a 400 naming the fault."""
    try:
        data = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
        raise APIError(400, "the body must be JSON: {session, transport: {type: 'webrtc', sdp}}",
                       code="invalid_json") from None
    if not isinstance(data, dict) or not isinstance(data.get("session"), dict):
        raise APIError(400, "the body needs 'session' (an object)", param="session",
                       code="missing_required_parameter")
    transport: Any = data.get("transport")
    if not isinstance(transport, dict) or transport.get("type") != "webrtc" or not isinstance(transport.get("sdp"),
                                                                                              str):
        raise APIError(400, "the body needs 'transport': {type: 'webrtc', sdp: the SDP offer}", param="transport",
                       code="missing_required_parameter")
    try:
        config = start_config(data["session"], "session")
    except EventError as exc:
        raise APIError(400, str(exc), param=exc.param, code=exc.code) from None
    if config.model not in service.served.names:
        raise model_not_found(config.model)
    return config, transport["sdp"]


def _keyed(config: StartConfig, key_session: dict[str, Any] | None) -> StartConfig:
    try:
        return keyed(config, key_session)
    except EventError as exc:
        raise APIError(400, str(exc), param=exc.param, code=exc.code) from None


def _live_call(service: RealtimeService, config: StartConfig) -> SessionFactory:
    def make(pc: RTCPeerConnection, call_id: str) -> tuple[WebRtcTransport, CallSession]:
        # The call's microphone comes as PCM16 at 24 kHz, the format a Live session over WebRTC hears.
        transport = WebRtcTransport(pc, SessionConfig)
        return transport, LiveSession(transport, service, lambda: backend_for(service), transport.reply, call_id,
                                      config)
    return make


def install_live(app: FastAPI) -> None:
    """After ``install_realtime`` and ``install_webrtc``: Live sessions run on their service and calls."""
    app.include_router(router)
