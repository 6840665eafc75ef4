"""``POST /v1/realtime/client_secrets``: mints an ephemeral key for one realtime session (OpenAI's shape).

The request's ``session`` is checked here as a ``session.update`` would be
(each bad field a 400 naming it), so a browser never learns at connect time
that its backend minted a key for settings the server refuses; the reply
describes the session as ``session.created`` will. The settings are applied
when the key opens its session (``session_loop.py``). The route is behind the
real API key: an ephemeral key opens realtime routes only, so it cannot mint more.
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field

from omnistage.entrypoints.openai.common.ephemeral_keys import DEFAULT_TTL_S, MAX_TTL_S, MIN_TTL_S, EphemeralKeys
from omnistage.entrypoints.openai.common.errors import APIError, model_not_found
from omnistage.entrypoints.openai.realtime.protocol import EventError, new_id
from omnistage.entrypoints.openai.realtime.service import RealtimeService
from omnistage.entrypoints.openai.realtime.session import SessionState

CLIENT_SECRETS_PATH = "/v1/realtime/client_secrets"


class ExpiresAfter(BaseModel):
    anchor: Literal["created_at"] = "created_at"
    seconds: int = Field(DEFAULT_TTL_S, ge=MIN_TTL_S, le=MAX_TTL_S)


class ClientSecretCreateRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    session: dict[str, Any] = Field(default_factory=lambda: {"type": "realtime"})
    expires_after: ExpiresAfter = Field(default_factory=ExpiresAfter)


class ClientSecretCreateResponse(BaseModel):
    value: str
    expires_at: int
    session: dict[str, Any]


router = APIRouter()


@router.post(CLIENT_SECRETS_PATH, response_model=ClientSecretCreateResponse)
async def create_client_secret(body: ClientSecretCreateRequest, request: Request) -> ClientSecretCreateResponse:
    service: RealtimeService = request.app.state.realtime
    keys: EphemeralKeys = request.app.state.ephemeral_keys
    described = check_settings(service, body.session)
    key = keys.mint(body.session, body.expires_after.seconds)
    return ClientSecretCreateResponse(value=key.value, expires_at=key.expires_at, session=described)


def check_settings(service: RealtimeService, session: dict[str, Any]) -> dict[str, Any]:
    """The session these settings open, described as ``session.created`` will; a 400 for the first bad field."""
    model = session.get("model")
    if model is not None and model not in service.served.names:
        raise model_not_found(str(model))
    front = service.engine.front_end
    if front.duplex:  # a key for a GPT-Live session on the duplex engine: the Live session checks its settings
        return duplex_settings(service, session)
    if front.processor is None and front.transcriber is None:
        raise APIError(400, "this checkpoint has no chat template: realtime sessions need one",
                       param="session.model", code="chat_not_supported")
    kind = "transcription" if front.processor is None else "realtime"  # a recogniser's sessions only transcribe
    state = SessionState(service.engine, service.served.voices, service.limits, beta=False, kind=kind)
    try:
        errors = state.update({"type": "session.update", "session": session}, buffered=False)
    except EventError as exc:
        errors = [exc]
    if errors:
        raise APIError(400, str(errors[0]), param=errors[0].param, code=errors[0].code)
    return state.config.describe(new_id("sess"), service.engine.model_name, False)


def duplex_settings(service: RealtimeService, session: dict[str, Any]) -> dict[str, Any]:
    """What a key minted on a duplex server holds for the Live session it opens: its instructions (the family's
    prompt where it takes one) and voice, described; turn settings have no meaning there and are not kept."""
    instructions = session.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise APIError(400, "'session.instructions' must be a string", param="session.instructions",
                       code="invalid_type")
    voice = ((session.get("audio") or {}).get("output") or {}).get("voice")
    return {"id": new_id("sess"), "object": "realtime.session", "type": "realtime",
            "model": service.engine.model_name, "instructions": instructions,
            "audio": {"output": {"voice": voice}}}
