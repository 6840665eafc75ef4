"""``POST /v1/realtime/calls``: OpenAI's WebRTC entry (SDP offer in, SDP answer out), and hanging up.

The body is the offer as ``application/sdp``, or OpenAI's multipart form
with an ``sdp`` part and a ``session`` part (the session's settings as
JSON, applied as ``session.update`` before ``session.created``). An
ephemeral key's settings come first, the form's on top. The answer is a 201
with ``Location: /v1/realtime/calls/{call_id}``; ``DELETE`` on that URL (or
OpenAI's ``POST .../hangup``) ends the call.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from aiortc import RTCIceServer
from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse, Response

from omnistage.entrypoints.openai.common.ephemeral_keys import claimed_session
from omnistage.entrypoints.openai.common.errors import APIError
from omnistage.entrypoints.openai.common.request_checks import NO_CHAT
from omnistage.entrypoints.openai.server_config import IceServer
from omnistage.entrypoints.openai.webrtc.calls import Calls, TooManyCalls

logger = logging.getLogger(__name__)
CALLS_PATH = "/v1/realtime/calls"
router = APIRouter()


def _calls(request: Request) -> Calls:
    return request.app.state.webrtc_calls


async def _offer(request: Request) -> tuple[str, dict[str, Any] | None]:
    """The SDP offer and the form's session settings (None without a form)."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind == "multipart/form-data":
        form = await request.form()
        sdp, session = form.get("sdp"), form.get("session")
        if not isinstance(sdp, str):
            raise APIError(400, "the form needs an 'sdp' part (the SDP offer as text)", param="sdp")
        try:
            settings = json.loads(session) if isinstance(session, str) else None
        except json.JSONDecodeError as exc:
            raise APIError(400, f"the 'session' part is not JSON: {exc}", param="session") from exc
        if settings is not None and not isinstance(settings, dict):
            raise APIError(400, "the 'session' part must be a JSON object", param="session")
        return sdp, settings
    if kind != "application/sdp":
        raise APIError(400, "send the SDP offer as application/sdp, or a multipart form with 'sdp' and 'session'",
                       code="unsupported_content_type")
    return (await request.body()).decode("utf-8", "replace"), None


@router.post(CALLS_PATH, status_code=201, response_class=Response,
             responses={201: {"content": {"application/sdp": {"schema": {"type": "string"}}},
                              "description": "the SDP answer; Location names the call"}})
async def create_call(request: Request) -> Response:
    calls = _calls(request)
    if calls.service.engine.front_end.processor is None:
        raise APIError(400, NO_CHAT, param="model", code="chat_not_supported")
    sdp, form_settings = await _offer(request)
    if not sdp.lstrip().startswith("v=0"):
        raise APIError(400, "the body is not an SDP offer (it must start with 'v=0')", param="sdp")
    settings = {**(claimed_session(request.scope) or {}), **(form_settings or {})} or None
    try:
        call, answer = await calls.start(sdp, settings)
    except TooManyCalls as exc:
        raise APIError(429, f"{exc}; try again later", type="server_error", code="too_many_calls") from exc
    except Exception as exc:  # aiortc raises several kinds for an offer it cannot take
        logger.info("webrtc offer refused: %s", exc)
        raise APIError(400, f"could not answer the SDP offer: {exc}", param="sdp", code="invalid_offer") from exc
    return Response(answer, status_code=201, media_type="application/sdp",
                    headers={"Location": f"{CALLS_PATH}/{call.id}"})


async def _hang_up(call_id: str, request: Request) -> JSONResponse:
    if not await _calls(request).hang_up(call_id):
        raise APIError(404, f"no call {call_id!r} is in progress", param="call_id", code="call_not_found")
    return JSONResponse({"id": call_id, "object": "realtime.call", "status": "ended"})


@router.delete(CALLS_PATH + "/{call_id}")
async def delete_call(call_id: str, request: Request) -> JSONResponse:
    return await _hang_up(call_id, request)


@router.post(CALLS_PATH + "/{call_id}/hangup")
async def hangup_call(call_id: str, request: Request) -> JSONResponse:
    return await _hang_up(call_id, request)


def install_webrtc(app: FastAPI, ice_servers: tuple[IceServer, ...] = ()) -> None:
    """After ``install_realtime`` (the calls run its service). ``ice_servers``: STUN/TURN for peers beyond one
    network (``--webrtc-stun/turn``; none: host candidates only)."""
    servers = tuple(RTCIceServer(s.url, s.username, s.credential) for s in ice_servers)
    app.state.webrtc_calls = Calls(app.state.realtime, servers)
    app.include_router(router)
