"""A call's request read into its offer: the SDP, and the form's ``session`` part.

The body is the offer as ``application/sdp``, or OpenAI's multipart form with an ``sdp`` part and a ``session``
part (the session's settings as JSON). Its content type is checked before anything is read, and the body is read
up to ``--webrtc-max-offer-bytes`` (a 413 past it, with the rest unread). Each fault is a 400 naming the part;
the session part's JSON may be deep (a 400, not a ``RecursionError``) but holds no lone surrogate.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from fastapi import Request
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException
from starlette.formparsers import MultiPartException
from starlette.requests import ClientDisconnect
from starlette.types import Message

from omnistage.entrypoints.openai.common.errors import APIError
from omnistage.entrypoints.openai.common.json_text import LONE_SURROGATE, lone_surrogate

SDP, FORM = "application/sdp", "multipart/form-data"
_PARTS = 4  # fields the form may hold (sdp and session; a client's extras are read and ignored)


@dataclass(frozen=True)
class CallOffer:
    sdp: str
    session: dict[str, Any] | None  # the form's session settings (None without a form, or without that part)


async def read_offer(request: Request, max_bytes: int) -> CallOffer:
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind not in (SDP, FORM):
        raise APIError(400, "send the SDP offer as application/sdp, or a multipart form with 'sdp' and 'session'",
                       code="unsupported_content_type")
    body = await read_body(request, max_bytes)
    if kind == SDP:
        return CallOffer(body.decode("utf-8", "replace"), None)
    form = await _form(request, body)
    sdp, session = await _text(form.get("sdp")), await _text(form.get("session"))
    if sdp is None:
        raise APIError(400, "the form needs an 'sdp' part (the SDP offer as text)", param="sdp")
    return CallOffer(sdp, None if session is None else _settings(session))


async def read_body(request: Request, max_bytes: int) -> bytes:
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > max_bytes:
        raise _too_large(max_bytes)
    body = bytearray()
    try:
        async for chunk in request.stream():
            body += chunk
            if len(body) > max_bytes:
                raise _too_large(max_bytes)
    except ClientDisconnect:
        raise APIError(400, "the request body did not arrive in full", code="incomplete_body") from None
    return bytes(body)


def _too_large(max_bytes: int) -> APIError:
    return APIError(413, f"the call's request body is larger than {max_bytes} bytes (--webrtc-max-offer-bytes)",
                    code="request_too_large")


async def _form(request: Request, body: bytes) -> Any:
    async def replay() -> Message:  # the body as read, for Starlette's multipart parser
        return {"type": "http.request", "body": body, "more_body": False}

    try:
        return await Request(request.scope, replay).form(max_files=_PARTS, max_fields=_PARTS, max_part_size=len(body))
    except (HTTPException, MultiPartException, ValueError):
        raise APIError(400, "the multipart form could not be read (it takes an 'sdp' part and a 'session' part)",
                       code="invalid_form") from None


async def _text(part: str | UploadFile | None) -> str | None:
    """A part as text, sent as a field or as a file (a Blob in a browser's FormData)."""
    if isinstance(part, UploadFile):
        return (await part.read()).decode("utf-8", "replace")
    return part


def _settings(text: str) -> dict[str, Any]:
    try:
        settings = json.loads(text)
    except json.JSONDecodeError as exc:
        raise APIError(400, f"the 'session' part is not JSON: {exc.msg} (at character {exc.pos})",
                       param="session", code="invalid_json") from None
    except RecursionError:
        raise APIError(400, "the 'session' part is nested too deep to read", param="session",
                       code="invalid_json") from None
    if lone_surrogate(text):
        raise APIError(400, LONE_SURROGATE, param="session", code="invalid_json")
    if not isinstance(settings, dict):
        raise APIError(400, "the 'session' part must be a JSON object", param="session", code="invalid_json")
    return settings
