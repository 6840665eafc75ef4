"""The ``/v1/responses`` routes: create (whole or SSE), retrieve and delete a stored response.

The create body is counted from its raw bytes before it is validated (``BudgetedRoute``'s prescan for this path),
as a chat body is; auth, the body cap, admission and the request timeout are the server's, shared with chat.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from omnistage.entrypoints.openai.common.admission import Admission
from omnistage.entrypoints.openai.common.auth import caller
from omnistage.entrypoints.openai.common.metrics import ServerMetrics
from omnistage.entrypoints.openai.common.protocol import ErrorResponse
from omnistage.entrypoints.openai.common.prescan import BudgetedRoute
from omnistage.entrypoints.openai.common.served_model import ServedModel
from omnistage.entrypoints.openai.engine_protocol import OmniEngine
from omnistage.entrypoints.openai.media.prompt_builder import PromptBuilder
from omnistage.entrypoints.openai.responses.protocol import ResponseDeleted, ResponseObject, ResponsesRequest
from omnistage.entrypoints.openai.responses.service import ResponsesService
from omnistage.entrypoints.openai.responses.store import ResponseStore

_ERRORS: dict[int | str, dict[str, object]] = {
    status: {"model": ErrorResponse, "description": why} for status, why in (
        (400, "invalid request: a bad field, an unsupported one (named), or over a limit (the message names the "
              "flag)"),
        (401, "missing or wrong API key (--api-key)"),
        (404, "unknown model, or a response id the server does not hold (never stored, expired, deleted, or "
              "stored under another API key)"),
        (413, "request body over --max-request-bytes"), (429, "over --max-queued-requests (see Retry-After)"),
        (500, "engine failure"), (503, "a stage has no healthy replica, or aborted"),
        (504, "over --request-timeout"))}
_SSE = {"text/event-stream": {"schema": {"type": "string", "description": "response.* events (OpenAI's "
                                                                          "ResponseStreamEvent)"}}}


def responses_router(engine: OmniEngine, builder: PromptBuilder, admission: Admission, served: ServedModel,
                     metrics: ServerMetrics) -> APIRouter:
    limits = builder.limits
    store = ResponseStore(limits.max_stored_responses, limits.stored_response_ttl, limits.max_stored_response_bytes)
    service = ResponsesService(engine, builder, admission, served, metrics, store)
    router = APIRouter(route_class=BudgetedRoute, tags=["responses"])

    @router.post("/v1/responses", response_model=ResponseObject,
                 responses={**_ERRORS, 200: {"content": _SSE, "description": "the response, or SSE events when "
                                                                             "stream=true"}})
    async def create_response(body: ResponsesRequest, request: Request) -> Response:
        return await service.create(body, request)

    @router.get("/v1/responses/{response_id}", response_model=ResponseObject, responses=_ERRORS)
    async def retrieve_response(response_id: str, request: Request) -> ResponseObject:
        return service.retrieve(response_id, caller(request.scope))

    @router.delete("/v1/responses/{response_id}", response_model=ResponseDeleted, responses=_ERRORS)
    async def delete_response(response_id: str, request: Request) -> ResponseDeleted:
        return service.delete(response_id, caller(request.scope))

    return router
