"""What the API adds to each request's HTTP span when the server traces (``--otlp-traces-endpoint``).

FastAPI makes the span itself (its native telemetry, given the server's tracer provider by ``build_app``): a
``SERVER`` span per ``/v1/`` HTTP request (:func:`untraced` leaves out health probes, metrics scrapes and
WebSocket sessions, which last too long to be one span), under the caller's span when it sent a W3C
``traceparent`` header, current in the OpenTelemetry context while the request is served. This module adds
the bytes out (:class:`ResponseBytes`) and hands the span's ``traceparent`` to the pipeline (:func:`traced`).
Only the OpenTelemetry API is imported here (FastAPI imports it anyway); with tracing off no span exists, the
middleware is not installed, and :func:`traced` finds no span and returns its request as is.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from dataclasses import replace
from typing import Any

from opentelemetry import trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from omnistage.core import OmniRequest

TRACED_PREFIX = "/v1/"
BODY_SIZE = "http.response.body.size"  # OpenTelemetry's HTTP convention: the bytes out

_PROPAGATOR = TraceContextTextMapPropagator()  # W3C trace context only (stateless)


def untraced(scope: MutableMapping[str, Any]) -> bool:
    """FastAPI's ``exclude``: True for what gets no span."""
    return scope["type"] != "http" or not scope["path"].startswith(TRACED_PREFIX)


def traced(request: OmniRequest) -> OmniRequest:
    """``request`` under the HTTP span now current (its pipeline spans go there); itself when there is none."""
    span = trace.get_current_span()
    if not span.get_span_context().is_valid:
        return request
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier, context=trace.set_span_in_context(span))
    return replace(request, traceparent=carrier["traceparent"])


class ResponseBytes:
    """Counts a traced request's response body as it is sent (a stream's too) and sets it on the request's span
    just before the last piece goes: FastAPI ends the span once that piece is sent."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        span = trace.get_current_span()
        if scope["type"] != "http" or not span.is_recording():
            await self.app(scope, receive, send)
            return
        sent = 0

        async def counting_send(message: Message) -> None:
            nonlocal sent
            if message["type"] == "http.response.body":
                sent += len(message.get("body", b""))
                if not message.get("more_body", False):
                    span.set_attribute(BODY_SIZE, sent)
            await send(message)

        await self.app(scope, receive, counting_send)
