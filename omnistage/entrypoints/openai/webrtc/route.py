"""``POST /v1/realtime/calls``: OpenAI's WebRTC entry (SDP offer in, SDP answer out), and hanging up.

The offer is read (``offer.py``), its session settings checked (``realtime/call_settings.py``: an ephemeral key's
settings first, the form's on top, narrowing them only) and its SDP screened (``offer_screen.py``) before aiortc
sees any of it; each fault is a 400 naming its field or its bound. What aiortc still refuses is a 400 that says
what an offer needs, never aiortc's own words. The answer is a 201 with ``Location:
/v1/realtime/calls/{call_id}``; ``DELETE`` on that URL (or OpenAI's ``POST .../hangup``) ends the call, with the
API key or with the ephemeral key that opened it. That key is spent only once its call is set up.
"""

from __future__ import annotations

import logging

from aiortc import RTCIceServer
from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse, Response

from omnistage.entrypoints.openai.common.auth import Unauthorized
from omnistage.entrypoints.openai.common.ephemeral_keys import ephemeral_claim, key_owner
from omnistage.entrypoints.openai.common.errors import APIError
from omnistage.entrypoints.openai.common.request_checks import no_chat
from omnistage.entrypoints.openai.realtime.call_settings import call_settings
from omnistage.entrypoints.openai.server_config import IceServer, WebRtcPolicy
from omnistage.entrypoints.openai.webrtc.calls import Calls, TooManyCalls
from omnistage.entrypoints.openai.webrtc.offer import read_offer
from omnistage.entrypoints.openai.webrtc.offer_screen import screen_offer

logger = logging.getLogger(__name__)
CALLS_PATH = "/v1/realtime/calls"
CALL_PREFIX = CALLS_PATH + "/"  # a call's own URL: where the ephemeral key that opened it may hang it up
UNANSWERABLE = ("could not answer the SDP offer: it is malformed, or lacks what a call needs (an audio section, "
                "ICE credentials, a DTLS fingerprint)")
router = APIRouter()


def _calls(request: Request) -> Calls:
    return request.app.state.webrtc_calls


@router.post(CALLS_PATH, status_code=201, response_class=Response,
             responses={201: {"content": {"application/sdp": {"schema": {"type": "string"}}},
                              "description": "the SDP answer; Location names the call"}})
async def create_call(request: Request) -> Response:
    calls = _calls(request)
    front = calls.service.engine.front_end
    if front.processor is None and front.transcriber is None:  # a recogniser's calls transcribe (calls.py)
        raise APIError(400, no_chat(calls.service.engine), param="model", code="chat_not_supported")
    check_room(calls)  # a flood past the bound is refused before its bodies are read (and again at start)
    offer = await read_offer(request, calls.policy.max_offer_bytes)
    claim = ephemeral_claim(request.scope)
    settings = call_settings(calls.service, None if claim is None else claim.key.session, offer.session)
    sdp = screen_offer(offer.sdp, calls.policy).sdp
    try:
        call, answer = await calls.start(sdp, settings, None if claim is None else claim.key.owner)
    except TooManyCalls as exc:
        raise too_many(exc) from None
    except Exception as exc:  # noqa: BLE001 - aiortc raises several kinds for an offer it cannot take, none for a client
        logger.info("webrtc offer refused by aiortc: %s: %s", type(exc).__name__, str(exc)[:200])
        raise APIError(400, UNANSWERABLE, param="sdp", code="invalid_offer") from None
    if claim is not None:
        claim.spend()  # the call is up: the key has opened its one session
    return Response(answer, status_code=201, media_type="application/sdp",
                    headers={"Location": f"{CALLS_PATH}/{call.id}"})


def check_room(calls: Calls) -> None:
    try:
        calls.check_room()
    except TooManyCalls as exc:
        raise too_many(exc) from None


def too_many(exc: TooManyCalls) -> APIError:
    return APIError(429, f"{exc}; try again later", type="server_error", code="too_many_calls")


async def _hang_up(call_id: str, request: Request) -> JSONResponse:
    call = _calls(request).live.get(call_id)
    if call is None:
        raise APIError(404, "no such call is in progress", param="call_id", code="call_not_found")
    owner = key_owner(request.scope)
    if owner is not None and not call.opened_by(owner):  # an ephemeral key may end the call it opened, no other
        raise Unauthorized("this ephemeral key did not open that call")
    await call.hang_up()
    return JSONResponse({"id": call_id, "object": "realtime.call", "status": "ended"})


@router.delete(CALLS_PATH + "/{call_id}")
async def delete_call(call_id: str, request: Request) -> JSONResponse:
    return await _hang_up(call_id, request)


@router.post(CALLS_PATH + "/{call_id}/hangup")
async def hangup_call(call_id: str, request: Request) -> JSONResponse:
    return await _hang_up(call_id, request)


def install_webrtc(app: FastAPI, ice_servers: tuple[IceServer, ...] = (), policy: WebRtcPolicy | None = None) -> None:
    """After ``install_realtime`` (the calls run its service). ``ice_servers``: STUN/TURN for peers beyond one
    network (``--webrtc-stun/turn``; none: host candidates only); ``policy``: the calls' bounds and the addresses
    their ICE checks may reach (``--webrtc-*``)."""
    servers = tuple(RTCIceServer(s.url, s.username, s.credential) for s in ice_servers)
    app.state.webrtc_calls = Calls(app.state.realtime, servers, policy or WebRtcPolicy())
    app.include_router(router)
