"""A client that goes away mid-request gets its request aborted in the engine (and its stream closed)."""

from __future__ import annotations

import json
import socket
import time

import httpx
import pytest

from tests.entrypoints.conftest import LiveServer

SLOW_WORDS = tuple(f" w{i}" for i in range(200))  # 200 deltas x 20 ms: far longer than any test waits


def _wait_for(predicate, timeout_s: float = 5.0) -> bool:  # noqa: ANN001
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return False


@pytest.fixture()
def slow_server(server: LiveServer) -> LiveServer:
    server.engine.words = SLOW_WORDS
    server.engine.delay_s = 0.02
    return server


def _assert_aborted(server: LiveServer) -> None:
    assert _wait_for(lambda: len(server.engine.requests) == 1 and server.engine.aborted), \
        f"abort was not called: {len(server.engine.requests)} request(s), aborted {server.engine.aborted}"
    request_id = server.engine.requests[0].request_id
    assert server.engine.aborted == [request_id]
    assert _wait_for(lambda: request_id in server.engine.closed)
    assert _wait_for(lambda: _in_flight(server) == 0), "the request's timer was never finished"


def _in_flight(server: LiveServer) -> float:
    text = httpx.get(f"{server.base_url}/metrics").text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("omnistage_requests_in_flight{"))


CHAT = {"model": "fake-omni", "messages": [{"role": "user", "content": "Talk for a long time."}]}


@pytest.mark.parametrize("audio", [False, True])
def test_streaming_chat_disconnect_aborts(slow_server: LiveServer, audio: bool) -> None:
    body = {**CHAT, "stream": True}
    if audio:
        body |= {"modalities": ["text", "audio"], "audio": {"voice": "ethan", "format": "pcm16"}}
    with httpx.stream("POST", f"{slow_server.base_url}/v1/chat/completions", json=body, timeout=10) as response:
        lines = response.iter_lines()
        received = [next(lines) for _ in range(6)]
    assert any('"content"' in line for line in received)
    _assert_aborted(slow_server)


def _post_and_leave(server: LiveServer, path: str, body: dict[str, object]) -> None:
    """Sends the request on a raw socket and closes it once the request is in the engine (a client timeout
    could fire before the prompt is built on a loaded machine; leaving then is test_budget's case)."""
    host, port = server.base_url.removeprefix("http://").split(":")
    data = json.dumps(body).encode()
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(b"POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                     % (path.encode(), host.encode(), len(data), data))
        assert _wait_for(lambda: len(server.engine.requests) == 1)


def test_non_streaming_chat_disconnect_aborts(slow_server: LiveServer) -> None:
    _post_and_leave(slow_server, "/v1/chat/completions", CHAT)
    _assert_aborted(slow_server)


@pytest.mark.parametrize("stream_format", ["audio", "sse"])
def test_speech_disconnect_aborts(slow_server: LiveServer, stream_format: str) -> None:
    body = {"model": "fake-omni", "voice": "ethan", "input": "Hello.", "response_format": "pcm",
            "stream_format": stream_format}
    with httpx.stream("POST", f"{slow_server.base_url}/v1/audio/speech", json=body, timeout=10) as response:
        next(response.iter_bytes())
    _assert_aborted(slow_server)


def test_finished_requests_are_not_aborted(server: LiveServer) -> None:
    server.client().chat.completions.create(**CHAT)
    list(server.client().chat.completions.create(**CHAT, stream=True))
    assert len(server.engine.requests) == 2
    assert server.engine.aborted == []
    assert _wait_for(lambda: len(server.engine.closed) == 2)


def test_speech_disconnect_before_the_first_audio_aborts(server: LiveServer) -> None:
    server.engine.delay_s = 2.0  # the first output comes long after the client gives up
    _post_and_leave(server, "/v1/audio/speech",
                    {"model": "fake-omni", "voice": "ethan", "input": "Hello.", "response_format": "wav"})
    _assert_aborted(server)
