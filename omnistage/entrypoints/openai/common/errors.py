"""OpenAI-shaped errors: every failure leaves as ``{"error": {message, type, param, code}}``.

FastAPI's own 422 validation errors become 400s, as OpenAI answers bad
parameters, and Starlette's 404/405 keep their status but take the same body.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from omnistage.entrypoints.openai.common.protocol import ErrorDetail, ErrorResponse

logger = logging.getLogger(__name__)

INVALID_REQUEST = "invalid_request_error"
SERVER_ERROR = "server_error"


_OBJECT_REPR = re.compile(r"<([\w.]+) object at 0x[0-9a-fA-F]+>")


def scrub_reprs(message: str) -> str:
    """``message`` without heap addresses: a library's ``<_io.BytesIO object at 0x7f...>`` becomes ``the data``."""
    return _OBJECT_REPR.sub("the data", message)


ECHO_CHARS = 64  # of a client's value an error quotes back


def quoted(value: object, limit: int = ECHO_CHARS) -> str:
    """A client's value as an error message quotes it: its repr, cut after ``limit`` characters (a 1 MB model name
    is not sent back; the message says how long it was)."""
    text = value if isinstance(value, str) else repr(value)
    if len(text) <= limit:
        return repr(text) if isinstance(value, str) else text
    return f"{text[:limit]!r}... ({len(text)} characters)"


class APIError(Exception):
    """An error the server answers with; raised anywhere below a route. Its message never shows an object repr."""

    def __init__(self, status_code: int, message: str, *, type: str = INVALID_REQUEST,
                 param: str | None = None, code: str | None = None) -> None:
        message = scrub_reprs(message)
        super().__init__(message)
        self.status_code = status_code
        self.detail = ErrorDetail(message=message, type=type, param=param, code=code)

    def response(self) -> JSONResponse:
        return error_response(self.status_code, self.detail)


class MediaError(ValueError):
    """A media item that cannot be used, with an OpenAI error ``code``; the chat layer adds the parameter path
    and answers 400."""

    def __init__(self, message: str, code: str = "invalid_media") -> None:
        super().__init__(message)
        self.code = code


class BodyTooLarge(APIError):
    """Raised while the body is read; FastAPI re-raises it as its own 400, which the handler unwraps."""

    def __init__(self, max_bytes: int) -> None:
        super().__init__(413, f"the request body is larger than {max_bytes} bytes", code="request_too_large")


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


def no_such_model(name: str) -> str:
    return f"The model {quoted(name)} does not exist"


def model_not_found(name: str) -> APIError:
    return APIError(404, no_such_model(name), param="model", code="model_not_found")


def error_response(status_code: int, detail: ErrorDetail) -> JSONResponse:
    return JSONResponse(status_code=status_code, content=ErrorResponse(error=detail).model_dump())


def _is_union_label(part: str) -> bool:
    # pydantic names the union member it tried: "str", "VoiceRef", "list[tagged-union[...]]".
    return "[" in part or part[:1].isupper() or part in ("str", "int", "float", "bool")


def param_path(loc: Sequence[str | int]) -> str | None:
    """``("body", "messages", 0, "content", <union label>, 0, "text", "text")`` → ``messages[0].content[0].text``."""
    parts = list(loc[1:] if loc and loc[0] in ("body", "query", "path") else loc)
    out = ""
    in_tagged_list = skip_tag = False
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
            skip_tag = in_tagged_list  # a tagged union's element is followed by its tag
            continue
        if skip_tag or _is_union_label(part):
            in_tagged_list = "tagged-union" in part
            skip_tag = False
            continue
        out += f".{part}" if out else part
    return out or None


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    errors = exc.errors()
    if not errors:
        return "invalid request", None
    # Of a union's failed alternatives, the deepest error names the field the client got wrong.
    first = max(errors, key=lambda e: len(e.get("loc", ())))
    if first.get("type") == "json_invalid":
        return "the request body is not valid JSON", None
    param = param_path(tuple(first.get("loc", ())))
    message = str(first.get("msg", "invalid value"))
    if first.get("type") == "extra_forbidden":
        message = f"Unrecognized request argument supplied: {param}"
    if len(errors) > 1:
        message += f" (and {len(errors) - 1} more error(s))"
    return (f"{param}: {message}" if param else message), param


def _count(request: Request, outcome: str) -> None:
    # Requests refused before reaching the engine still show in omnistage_requests_total. The label is
    # the route's template, not the URL, so /v1/models/<anything> cannot grow the label set.
    services = getattr(request.app.state, "services", None)
    route = getattr(request.scope.get("route"), "path", None)
    if services is not None and route is not None:
        services.metrics.requests.labels(route, outcome).inc()


async def _on_api_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, APIError)
    if exc.status_code < 500:  # engine failures are counted by the request's timer
        _count(request, "client_error")
    return exc.response()


async def _on_validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    _count(request, "client_error")
    message, param = _validation_message(exc)
    return error_response(400, ErrorDetail(message=message, type=INVALID_REQUEST, param=param))


async def _on_http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    if isinstance(exc.__cause__, APIError):  # raised while FastAPI read the body
        return await _on_api_error(request, exc.__cause__)
    kind = INVALID_REQUEST if exc.status_code < 500 else SERVER_ERROR
    return error_response(exc.status_code, ErrorDetail(message=str(exc.detail), type=kind))


async def _on_unexpected(request: Request, exc: Exception) -> JSONResponse:
    # The client gets no internals; the log gets the traceback.
    logger.exception("unhandled error serving %s", request.url.path, exc_info=exc)
    return error_response(500, ErrorDetail(message="internal server error", type=SERVER_ERROR))


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(APIError, _on_api_error)
    app.add_exception_handler(RequestValidationError, _on_validation_error)
    app.add_exception_handler(StarletteHTTPException, _on_http_error)
    app.add_exception_handler(Exception, _on_unexpected)
