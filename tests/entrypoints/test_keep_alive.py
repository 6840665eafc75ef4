"""An idle keep-alive connection is closed by the client, not by the server (``--keep-alive-timeout``).

A server that closes an idle connection while a client sends its next request on it resets that request (httpx's
``ReadError('')``). Clients stop reusing a connection after their own idle expiry (httpx, and so OpenAI's SDK:
5 s), so the server must hold one longer: at uvicorn's own 5 s, one of the soak's WebRTC hang-ups, sent ~5 s
after its offer on the same connection, was reset (issue 50).
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx

from omnistage.entrypoints.cli import build_parser
from omnistage.entrypoints.openai.api_server import build_app
from omnistage.entrypoints.openai.serve_command import uvicorn_options
from omnistage.entrypoints.openai.server_config import limits_from_args
from omnistage.entrypoints.serve_config import ServeConfig
from tests.entrypoints.fake_engine import FakeEngine, RecordingProcessor, fake_front_end
from tests.entrypoints.server_thread import ServerThread

HEALTH = b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n"


@contextmanager
def _served(processor: RecordingProcessor, *flags: str) -> Iterator[tuple[str, int]]:
    """A server with the serve command's uvicorn settings for ``flags``: its address while the block runs."""
    args = build_parser().parse_args(["serve", *flags])
    thread = ServerThread(build_app(FakeEngine(fake_front_end(processor)), limits_from_args(args)),
                          **uvicorn_options(ServeConfig.from_args(args)))
    host, port = thread.start().removeprefix("http://").split(":")
    try:
        yield host, int(port)
    finally:
        thread.stop()


def _answered(sock: socket.socket) -> bool:
    """Whether a request sent on ``sock`` gets a response (not the connection closed or reset)."""
    try:
        sock.sendall(HEALTH)
        data = b""
        while b"\r\n\r\n" not in data:
            data += (piece := sock.recv(65536))
            if not piece:
                return False
        head, _, body = data.partition(b"\r\n\r\n")
        length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length")))
        while len(body) < length:  # the whole response, so that the next one starts at its head
            body += sock.recv(65536)
        return head.startswith(b"HTTP/1.1 200")
    except ConnectionError:
        return False


def test_a_connection_idle_as_long_as_a_client_may_reuse_it_is_still_open(processor: RecordingProcessor) -> None:
    expiry = httpx.Limits().keepalive_expiry  # httpx's default; OpenAI's SDK keeps it
    assert expiry is not None
    with _served(processor) as address, socket.create_connection(address, timeout=10) as sock:
        assert _answered(sock)
        time.sleep(expiry + 0.5)  # past it the client itself no longer reuses the connection
        assert _answered(sock), "the server closed an idle connection its client could still reuse"


def test_an_idle_connection_is_closed_after_the_keep_alive_timeout(processor: RecordingProcessor) -> None:
    with _served(processor, "--keep-alive-timeout", "0.5") as address, \
            socket.create_connection(address, timeout=10) as sock:
        assert _answered(sock)
        time.sleep(0.3)
        assert _answered(sock)  # each request starts the idle time again
        started = time.monotonic()
        assert sock.recv(1024) == b"", "the idle connection was not closed"
        assert time.monotonic() - started < 3
