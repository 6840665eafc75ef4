"""Graceful drain: once the server is told to stop, it takes no new work and finishes the work it holds.

A rolling restart sends SIGTERM and waits (``--shutdown-timeout``) before it kills. From the first signal on
(:class:`Draining` started by ``entrypoints/openai/draining_server.py``) the readiness route answers 503, so a
load balancer stops sending here, while liveness (``/health``) stays as it was: the process is alive and
finishing its streams. A request or WebSocket session that still arrives gets a 503 with ``Retry-After`` (the
OpenAI clients retry it, on another replica behind the balancer); what was in flight goes on. The middleware
counts what is in flight, so the server can stop as soon as nothing is.
"""

from __future__ import annotations

import time

from starlette.types import ASGIApp, Receive, Scope, Send

from omnistage.entrypoints.openai.common.admission import Overloaded

# Probes and scrapes keep answering while the server drains: they are how an operator watches it.
PROBE_PATHS = frozenset({"/health", "/ready", "/metrics"})
RETRY_ELSEWHERE_S = 5  # Retry-After of a request refused while draining: by then a balancer has moved on
SHUTTING_DOWN = "the server is shutting down; retry shortly (another replica takes the request)"


class Draining:
    """Whether the server drains, since when, and how many requests and sessions it still holds. Runs on the event
    loop only (the signal handler that starts it runs there too), so no locks."""

    def __init__(self) -> None:
        self.since: float | None = None  # monotonic time of the first stop signal
        self.in_flight = 0

    @property
    def draining(self) -> bool:
        return self.since is not None

    def begin(self, now: float | None = None) -> None:
        if self.since is None:
            self.since = time.monotonic() if now is None else now

    def refusal(self) -> Overloaded:
        return Overloaded(503, SHUTTING_DOWN, "shutting_down", RETRY_ELSEWHERE_S)


class DrainingMiddleware:
    """Counts the requests and sessions in flight; refuses new ones while the server drains (probes excepted)."""

    def __init__(self, app: ASGIApp, draining: Draining) -> None:
        self.app = app
        self.draining = draining

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or scope["path"] in PROBE_PATHS:
            await self.app(scope, receive, send)
            return
        if self.draining.draining:
            await self._refuse(scope, receive, send)
            return
        self.draining.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.draining.in_flight -= 1

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = self.draining.refusal().response()
        if scope["type"] == "http":
            await response(scope, receive, send)
            return
        await receive()  # the handshake's websocket.connect comes first
        if "websocket.http.response" in scope.get("extensions", {}):
            # The handshake is answered with the same 503 an HTTP request gets (ASGI's denial response).
            await send({"type": "websocket.http.response.start", "status": response.status_code,
                        "headers": response.raw_headers})
            await send({"type": "websocket.http.response.body", "body": response.body})
        else:
            await send({"type": "websocket.close", "code": 1013, "reason": "server shutting down"})  # try again later
