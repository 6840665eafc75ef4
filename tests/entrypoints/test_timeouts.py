"""Connections that do not play along are cut off: a stream whose client stops reading (``--send-timeout``),
headers that never finish (``--header-timeout``), a body trickled too slowly (``--body-timeout``,
``--body-min-rate``), a silent realtime socket (``--ws-idle-timeout``)."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import socket
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace

import pytest
from websockets.asyncio.client import connect

from omnistage.entrypoints.openai.api_server import build_app
from omnistage.entrypoints.openai.common.admission import Admission
from omnistage.entrypoints.openai.common.connection_guard import guarded_http_protocol
from tests.entrypoints.conftest import TEST_LIMITS
from tests.entrypoints.fake_engine import FakeEngine, RecordingProcessor, fake_front_end
from tests.entrypoints.server_thread import ServerThread
from tests.waiting import wait_until

LIMITS = replace(TEST_LIMITS, send_timeout=1.0, header_timeout=1.0, ws_idle_timeout=1.0, body_timeout=2.0)
MANY_WORDS = tuple(f" w{i}" for i in range(10_000))


@dataclass
class Guarded:
    url: str
    engine: FakeEngine
    admission: Admission

    @property
    def address(self) -> tuple[str, int]:
        host, port = self.url.removeprefix("http://").split(":")
        return host, int(port)


@pytest.fixture()
def guarded(processor: RecordingProcessor) -> Iterator[Guarded]:
    engine = FakeEngine(fake_front_end(processor))
    app = build_app(engine, LIMITS)
    thread = ServerThread(app, http=guarded_http_protocol(LIMITS.header_timeout, LIMITS.send_timeout,
                                                          LIMITS.body_timeout))
    url = thread.start()
    yield Guarded(url, engine, app.state.services.chat.admission)
    thread.stop()



def _reader_that_stalls(server: Guarded) -> socket.socket:
    """A client socket with a small receive window that will never be read."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(10)
    sock.connect(server.address)
    return sock


def _post(path: str, body: dict[str, object]) -> bytes:
    data = json.dumps(body).encode()
    return (b"POST %s HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
            % (path.encode(), len(data), data))


def test_a_stream_nobody_reads_is_aborted_and_its_place_freed(guarded: Guarded) -> None:
    guarded.engine.words, guarded.engine.chunk_seconds = MANY_WORDS, 1.0  # 64 kB of base64 audio per event
    body = {"model": "fake-omni", "messages": [{"role": "user", "content": "talk"}], "stream": True,
            "modalities": ["text", "audio"], "audio": {"voice": "Ethan", "format": "pcm16"}}
    with _reader_that_stalls(guarded) as sock:
        sock.sendall(_post("/v1/chat/completions", body))
        assert wait_until(lambda: guarded.admission.admitted == 1 and len(guarded.engine.requests) == 1)
        started = time.monotonic()
        assert wait_until(lambda: guarded.admission.admitted == 0, 15), "the slot is still held"
        held = time.monotonic() - started
        request_id = guarded.engine.requests[0].request_id
        assert wait_until(lambda: request_id in guarded.engine.aborted and request_id in guarded.engine.closed)
    assert held < 8, f"freed after {held:.1f} s (send timeout {LIMITS.send_timeout:g} s)"


def test_headers_that_never_finish_are_cut_off(guarded: Guarded) -> None:
    sockets = [socket.create_connection(guarded.address, timeout=10) for _ in range(20)]
    try:
        for sock in sockets:
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\nX-Slow: ")
        started = time.monotonic()
        for sock in sockets:
            assert sock.recv(1024) == b""  # closed by the server
        assert time.monotonic() - started < 8
    finally:
        for sock in sockets:
            sock.close()


class _Errors(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def test_a_body_trickled_too_slowly_is_cut_off_and_a_whole_one_is_served(guarded: Guarded) -> None:
    """The issue's probe, scaled: connections declaring a 3 MB body and sending a byte every 0.5 s are closed after
    --body-timeout (2 s here), each well before its body could finish; a prompt request on the same server works.
    No cut body is logged as an application error (a traceback each, formatted on the event loop)."""
    head = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            b"Content-Length: 3000000\r\n\r\n")
    sockets = [socket.create_connection(guarded.address, timeout=10) for _ in range(10)]
    errors = _Errors()
    logging.getLogger("uvicorn.error").addHandler(errors)
    try:
        for sock in sockets:
            sock.sendall(head + b"{")
        started, closed = time.monotonic(), set()
        while len(closed) < len(sockets) and time.monotonic() - started < 10:
            for i, sock in enumerate(sockets):
                if i in closed:
                    continue
                try:
                    sock.sendall(b" ")
                except OSError:  # reset: the server closed it
                    closed.add(i)
            time.sleep(0.5)
            for i, sock in enumerate(sockets):
                sock.setblocking(False)
                try:
                    if sock.recv(1024) == b"":
                        closed.add(i)
                except BlockingIOError:
                    pass
                except OSError:
                    closed.add(i)
                sock.setblocking(True)
        assert len(closed) == len(sockets) and time.monotonic() - started < 8
    finally:
        for sock in sockets:
            sock.close()
        logging.getLogger("uvicorn.error").removeHandler(errors)
    assert errors.messages == []
    with socket.create_connection(guarded.address, timeout=10) as sock:
        sock.sendall(_post("/v1/chat/completions", {"model": "fake-omni", "messages": [{"role": "user",
                                                                                          "content": "hi"}]}))
        assert _response(sock).startswith(b"HTTP/1.1 200")


def _response(sock: socket.socket) -> bytes:
    """One whole HTTP response (headers and a Content-Length body) from a keep-alive connection."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length")))
    while len(body) < length:
        body += sock.recv(65536)
    return head


def test_the_header_deadline_applies_to_each_request_of_a_connection(guarded: Guarded) -> None:
    with socket.create_connection(guarded.address, timeout=10) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
        assert _response(sock).startswith(b"HTTP/1.1 200")
        time.sleep(LIMITS.header_timeout * 1.5)  # idle between requests: keep-alive (5 s) governs that
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
        assert _response(sock).startswith(b"HTTP/1.1 200")
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: loc")
        assert sock.recv(1024) == b""


def test_websockets_outlive_the_header_deadline_but_not_idleness(guarded: Guarded) -> None:
    ws_url = guarded.url.replace("http://", "ws://") + "/v1/realtime"

    async def run() -> None:
        async with connect(ws_url, open_timeout=10) as ws:
            assert json.loads(await ws.recv())["type"] == "session.created"
            await asyncio.sleep(LIMITS.ws_idle_timeout * 0.6)
            await ws.send(json.dumps({"type": "session.update", "session": {"instructions": "be brief"}}))
            assert json.loads(await ws.recv())["type"] == "session.updated"
            await asyncio.sleep(LIMITS.ws_idle_timeout * 0.6)  # past the header timeout since connecting
            await ws.send(json.dumps({"type": "input_audio_buffer.clear"}))
            assert json.loads(await ws.recv())["type"] == "input_audio_buffer.cleared"
            started = time.monotonic()
            event = json.loads(await asyncio.wait_for(ws.recv(), 10))
            assert event["type"] == "error" and event["error"]["code"] == "idle_timeout"
            await asyncio.wait_for(ws.wait_closed(), 10)
            assert ws.close_code == 1000 and time.monotonic() - started < 5

    asyncio.run(run())


def test_a_running_response_is_not_idleness(guarded: Guarded) -> None:
    guarded.engine.words, guarded.engine.delay_s = tuple(f" w{i}" for i in range(60)), 0.05  # 3 s of answer
    ws_url = guarded.url.replace("http://", "ws://") + "/v1/realtime"

    async def run() -> str:
        async with connect(ws_url, open_timeout=10) as ws:
            await ws.recv()
            await ws.send(json.dumps({"type": "conversation.item.create", "item": {
                "type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}}))
            await ws.send(json.dumps({"type": "response.create", "response": {"output_modalities": ["text"]}}))
            while (event := json.loads(await asyncio.wait_for(ws.recv(), 10)))["type"] != "response.done":
                assert event["type"] != "error", event
            return event["response"]["status"]

    assert asyncio.run(run()) == "completed"


def _frame(payload: bytes) -> bytes:
    """One masked client text frame."""
    mask = os.urandom(4)
    size = len(payload)
    head = b"\x81" + (struct.pack("!B", 0x80 | size) if size < 126 else struct.pack("!BH", 0x80 | 126, size))
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


def test_a_realtime_client_that_stops_reading_is_closed_and_its_response_aborted(guarded: Guarded) -> None:
    guarded.engine.words, guarded.engine.chunk_seconds = MANY_WORDS, 1.0
    key = base64.b64encode(os.urandom(16)).decode()
    with _reader_that_stalls(guarded) as sock:
        sock.sendall(b"GET /v1/realtime HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                     b"Sec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\n\r\n" % key.encode())
        assert sock.recv(4096).startswith(b"HTTP/1.1 101")  # frames sent before the 101 would be lost
        item = {"type": "conversation.item.create", "item": {"type": "message", "role": "user",
                                                             "content": [{"type": "input_text", "text": "hi"}]}}
        sock.sendall(_frame(json.dumps(item).encode()) + _frame(b'{"type": "response.create"}'))
        assert wait_until(lambda: guarded.admission.admitted == 1 and len(guarded.engine.requests) == 1)
        assert wait_until(lambda: guarded.admission.admitted == 0, 15), "the response still holds its place"
        request_id = guarded.engine.requests[0].request_id
        assert wait_until(lambda: request_id in guarded.engine.aborted)


@pytest.fixture()
def rate_guarded(processor: RecordingProcessor) -> Iterator[Guarded]:
    """A long --body-timeout (60 s) and a least body rate of 2000 B/s judged over 1 s windows."""
    engine = FakeEngine(fake_front_end(processor))
    app = build_app(engine, LIMITS)
    thread = ServerThread(app, http=guarded_http_protocol(LIMITS.header_timeout, LIMITS.send_timeout, 60.0,
                                                          body_min_rate=2000.0, rate_window_s=1.0))
    url = thread.start()
    yield Guarded(url, engine, app.state.services.chat.admission)
    thread.stop()


def _closed_by_server(sock: socket.socket, within_s: float, trickle: bytes, every_s: float) -> bool:
    """Sends ``trickle`` every ``every_s`` until the server closes the connection or ``within_s`` passes."""
    deadline = time.monotonic() + within_s
    sock.settimeout(every_s)
    while time.monotonic() < deadline:
        try:
            sock.sendall(trickle)
            if sock.recv(1024) == b"":
                return True
        except TimeoutError:
            continue
        except OSError:  # reset: the server closed it
            return True
    return False


def test_a_body_under_the_least_rate_is_cut_long_before_the_body_timeout(rate_guarded: Guarded) -> None:
    """The issue's trickle (a byte every few seconds) would hold its place for the whole --body-timeout; under
    --body-min-rate it is cut after a window or two, while the 60 s body timeout is far away."""
    head = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            b"Content-Length: 3000000\r\n\r\n{")
    with socket.create_connection(rate_guarded.address, timeout=10) as sock:
        sock.sendall(head)
        assert _closed_by_server(sock, within_s=8.0, trickle=b" ", every_s=0.25)


def test_a_body_above_the_least_rate_is_served_however_long_it_takes(rate_guarded: Guarded) -> None:
    """A body brought at ~8 kB/s over three windows (above 2000 B/s) is read in full and answered."""
    body = {"model": "fake-omni", "messages": [{"role": "user", "content": "hi"}]}
    padded = b"{" + b" " * 24_000 + json.dumps(body).encode()[1:]  # JSON whitespace: a big body, a small prompt
    raw = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
           b"Content-Length: %d\r\n\r\n%s" % (len(padded), padded))
    with socket.create_connection(rate_guarded.address, timeout=10) as sock:
        for start in range(0, len(raw), 2000):
            sock.sendall(raw[start:start + 2000])
            time.sleep(0.25)
        assert _response(sock).startswith(b"HTTP/1.1 200")


def test_a_deadline_cancels_only_the_wait_it_interrupts() -> None:
    from omnistage.entrypoints.openai.common.streaming import _Deadline

    async def scenario() -> None:
        deadline = _Deadline(0.05)
        assert await deadline.wait(asyncio.sleep(0.01, "early")) == "early"
        with pytest.raises(TimeoutError):
            await deadline.wait(asyncio.sleep(5))  # the deadline passes while it waits
        with pytest.raises(TimeoutError):
            await deadline.wait(asyncio.sleep(0))  # and stays passed
        other = _Deadline(5.0)
        task = asyncio.ensure_future(other.wait(asyncio.sleep(5)))
        await asyncio.sleep(0.01)
        task.cancel()  # the caller's own cancellation is not a timeout
        with pytest.raises(asyncio.CancelledError):
            await task
        other.cancel()

    asyncio.run(scenario())
