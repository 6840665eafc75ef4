"""Bodies every endpoint shares (pydantic): the error body, models and health, and the request bases.

Nested request objects forbid unknown fields (``StrictBody``), so a misspelt field
is a 400 naming it; a chat request and its messages keep unknown top-level fields
aside (``LenientBody``). Responses mirror the ``openai`` package's types field for
field.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict


class StrictBody(BaseModel):
    # Python's JSON parser reads NaN and Infinity: no number a client sends may be either.
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class LenientBody(BaseModel):
    """Unknown fields are kept aside (``model_extra``) for a debug log, never acted on."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False)


class IgnoringBody(BaseModel):
    """Unknown fields are dropped as they are read: for what the server keeps (a stored response's input items,
    which a client sends back with the fields of the output it read), so nothing it did not count is kept."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)


# ---- errors ---------------------------------------------------------------------------------------


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorDetail


# ---- voices ---------------------------------------------------------------------------------------


# A voice by id (``{"id": ...}``), OpenAI's other spelling of a voice: chat audio and speech bodies take it.
class VoiceRef(StrictBody):
    id: str


# ---- models and health ------------------------------------------------------------------------------


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "omnistage"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ReplicaHealthInfo(BaseModel):
    replica: int
    healthy: bool
    detail: str = ""
    kv_blocks_total: int = 0
    kv_cache_bytes: int = 0


class StageHealthInfo(BaseModel):
    stage: str
    healthy: bool
    replicas: list[ReplicaHealthInfo]


class HealthResponse(BaseModel):
    status: Literal["ok", "degraded", "unhealthy"]
    stages: list[StageHealthInfo]


class ReadinessResponse(BaseModel):
    """``/ready``: whether to send this server work (a load balancer's readiness probe)."""

    status: Literal["ready", "draining", "degraded", "unhealthy"]
