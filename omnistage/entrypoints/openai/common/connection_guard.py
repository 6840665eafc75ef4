"""Connection timeouts uvicorn does not have, as its HTTP protocol class (``uvicorn.Config(http=...)``).

* ``--header-timeout``: a request's headers must be complete within this many
  seconds of the connection opening, or of the first byte of a later request
  on it (between requests uvicorn's keep-alive timeout applies, but it stops
  counting at that first byte). A slowloris client trickling header bytes is
  cut off instead of holding a connection for ever.
* ``--body-timeout``: once its headers are in, a request's body must arrive in
  full within this many seconds, or the connection is closed (the app sees
  the client gone). A client trickling a declared 200 MB body a byte every
  5 s would otherwise hold its connection, and its place, for ever.
* ``--body-min-rate``: a body must also bring at least this many bytes a
  second over every ``RATE_WINDOW_S`` window, so the trickle above is cut
  after one window, not after the whole ``--body-timeout``: a hundred such
  connections hold their places seconds, not a minute (a real upload, even
  over a slow mobile link, is far faster than the default).
* ``--send-timeout``: when the client stops reading a response, the socket's
  buffers fill and the transport pauses writing; if it stays paused this long
  the connection is aborted. The app then sees the client gone, so the stream
  is aborted in every stage and its admission place is freed.

It subclasses the protocol uvicorn would pick itself (httptools or h11) and
only adds timers around the hooks both implementations share; a WebSocket
upgrade hands the transport to uvicorn's WebSocket protocol and cancels them
(the realtime endpoint has its own idle and send timeouts).
"""

from __future__ import annotations

import asyncio
import logging

from uvicorn.protocols.http.auto import AutoHTTPProtocol

logger = logging.getLogger(__name__)

RATE_WINDOW_S = 10.0  # a body's arrival rate is judged over windows this long


class _ConnectionGuard:
    """Mixed in before uvicorn's HTTP protocol class; relies on its ``loop``, ``transport`` and ``cycle``."""

    header_timeout_s: float = 15.0
    send_timeout_s: float = 30.0
    body_timeout_s: float = 60.0
    body_min_rate: float = 8192.0
    rate_window_s: float = RATE_WINDOW_S
    loop: asyncio.AbstractEventLoop
    transport: asyncio.Transport
    cycle: object

    def connection_made(self, transport: asyncio.Transport) -> None:
        super().connection_made(transport)  # type: ignore[misc]
        self._header_timer: asyncio.TimerHandle | None = None
        self._send_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None
        self._rate_timer: asyncio.TimerHandle | None = None
        self._window_bytes = 0
        self._waiting_after: object = None
        self._await_headers()

    def data_received(self, data: bytes) -> None:
        if self._header_timer is None and self._between_requests():
            self._await_headers()  # the first bytes of the next request on this connection
        super().data_received(data)  # type: ignore[misc]
        if self._header_timer is not None and self.cycle is not self._waiting_after:
            self._cancel_header_timer()  # a new request's headers are complete
            if getattr(self.cycle, "more_body", False):
                self._body_timer = self.loop.call_later(self.body_timeout_s, self._body_late, self.cycle)
                self._watch_rate(self.cycle)
        elif self._rate_timer is not None:
            self._window_bytes += len(data)
        if self._body_timer is not None and not getattr(self.cycle, "more_body", False):
            self._cancel_body_timer()  # the body is complete

    def handle_websocket_upgrade(self, *args: object) -> None:
        self._cancel_timers()  # the transport now belongs to the WebSocket protocol
        super().handle_websocket_upgrade(*args)  # type: ignore[misc]

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timers()
        super().connection_lost(exc)  # type: ignore[misc]

    def pause_writing(self) -> None:
        super().pause_writing()  # type: ignore[misc]
        if self._send_timer is None:
            self._send_timer = self.loop.call_later(self.send_timeout_s, self._send_stalled)

    def resume_writing(self) -> None:
        super().resume_writing()  # type: ignore[misc]
        if self._send_timer is not None:
            self._send_timer.cancel()
            self._send_timer = None

    # -- timers ----------------------------------------------------------------------------------
    def _await_headers(self) -> None:
        self._cancel_header_timer()
        self._waiting_after = self.cycle  # the request before the one awaited (None on a new connection)
        self._header_timer = self.loop.call_later(self.header_timeout_s, self._headers_late)

    def _between_requests(self) -> bool:
        return self.cycle is None or bool(getattr(self.cycle, "response_complete", True))

    def _headers_late(self) -> None:
        self._header_timer = None
        if self.cycle is self._waiting_after and self._between_requests() and not self.transport.is_closing():
            logger.info("closing a connection that sent no complete request headers in %g s", self.header_timeout_s)
            self.transport.close()

    def _body_late(self, cycle: object) -> None:
        self._body_timer = None
        if self.cycle is cycle and getattr(cycle, "more_body", False) and not self.transport.is_closing():
            logger.info("closing a connection whose request body did not arrive in %g s (--body-timeout)",
                        self.body_timeout_s)
            self.transport.close()

    def _watch_rate(self, cycle: object) -> None:
        self._window_bytes = 0
        if self.body_min_rate > 0:
            self._rate_timer = self.loop.call_later(self.rate_window_s, self._rate_checked, cycle)

    def _rate_checked(self, cycle: object) -> None:
        self._rate_timer = None
        if self.cycle is not cycle or not getattr(cycle, "more_body", False) or self.transport.is_closing():
            return
        if self._window_bytes < self.body_min_rate * self.rate_window_s:
            logger.info("closing a connection whose request body came at %.0f B/s (--body-min-rate %g)",
                        self._window_bytes / self.rate_window_s, self.body_min_rate)
            self.transport.close()
        else:
            self._watch_rate(cycle)

    def _cancel_body_timer(self) -> None:
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None
        if self._rate_timer is not None:
            self._rate_timer.cancel()
            self._rate_timer = None

    def _send_stalled(self) -> None:
        self._send_timer = None
        if not self.transport.is_closing():
            logger.warning("aborting a response: its client read nothing for %g s (--send-timeout)",
                           self.send_timeout_s)
        self.transport.abort()  # the app sees the client gone: its request is aborted, its place freed

    def _cancel_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _cancel_timers(self) -> None:
        self._cancel_header_timer()
        self._cancel_body_timer()
        if self._send_timer is not None:
            self._send_timer.cancel()
            self._send_timer = None


def guarded_http_protocol(header_timeout_s: float, send_timeout_s: float, body_timeout_s: float = 60.0,
                          body_min_rate: float = 8192.0, rate_window_s: float = RATE_WINDOW_S
                          ) -> type[asyncio.Protocol]:
    """uvicorn's own HTTP protocol class with the timeouts and the body's least rate, for
    ``uvicorn.Config(http=...)``."""
    return type("GuardedHTTPProtocol", (_ConnectionGuard, AutoHTTPProtocol),
                {"header_timeout_s": header_timeout_s, "send_timeout_s": send_timeout_s,
                 "body_timeout_s": body_timeout_s, "body_min_rate": body_min_rate,
                 "rate_window_s": rate_window_s})
