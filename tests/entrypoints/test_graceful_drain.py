"""A rolling restart: SIGTERM to `omnistage serve tiny` (the real command, pipeline and signal) while audio streams
are in flight. They finish, new work is told to go elsewhere, readiness turns false while liveness holds, and the
process exits 0; past --shutdown-timeout what remains ends with an error."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import httpx
import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

from omnistage.entrypoints.openai.api_server import build_app
from omnistage.entrypoints.openai.server_config import AccessPolicy
from tests.entrypoints.fake_engine import FakeEngine, RecordingProcessor, fake_front_end
from tests.entrypoints.server_thread import ServerThread

# A random talker stops early: made to speak long enough to be caught mid-stream (3000 frames, 4 min of audio at
# 12.5 Hz, are about 10 s of tiny's work on 2 cores).
DRAINED_FRAMES, CUT_FRAMES = 1000, 3000
READY = re.compile(r"omnistage is ready: model '[^']+' at (http://[^ ]+)/v1")


@dataclass
class Served:
    proc: subprocess.Popen[str]
    base_url: str
    log: list[str] = field(default_factory=list)


def _serve(frames: int, *flags: str) -> Iterator[Served]:
    proc = subprocess.Popen([sys.executable, "-m", "omnistage.entrypoints.cli", "serve", "tiny", "--port", "0",
                             "--talker-min-new-tokens", str(frames), *flags], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    log: list[str] = []
    base_url = None
    deadline = time.monotonic() + 300
    for line in proc.stderr:
        log.append(line)
        match = READY.search(line)
        if match:
            base_url = match.group(1)
            break
        assert time.monotonic() < deadline, "the server did not start"
    assert base_url is not None, "".join(log[-30:])
    served = Served(proc, base_url, log)
    reader = threading.Thread(target=lambda: served.log.extend(proc.stderr or ()), daemon=True)
    reader.start()
    try:
        yield served
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(30)


@pytest.fixture()
def server() -> Iterator[Served]:
    yield from _serve(DRAINED_FRAMES, "--shutdown-timeout", "60")


@pytest.fixture()
def impatient_server() -> Iterator[Served]:
    yield from _serve(CUT_FRAMES, "--shutdown-timeout", "1")


@dataclass
class Stream:
    """One streamed chat with audio, read on its own thread: its events, and the audio deltas among them."""

    events: list[dict] = field(default_factory=list)
    audio_deltas: int = 0
    done: bool = False
    started: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None


def _stream(base_url: str, max_tokens: int, stream: Stream) -> None:
    body = {"model": "tiny", "messages": [{"role": "user", "content": "Tell me a long story about a cat."}],
            "modalities": ["text", "audio"], "audio": {"voice": "Ethan", "format": "pcm16"},
            "max_tokens": max_tokens, "temperature": 0.0, "stream": True}
    try:
        with httpx.stream("POST", f"{base_url}/v1/chat/completions", json=body, timeout=120) as response:
            assert response.status_code == 200, response.read()
            for line in response.iter_lines():
                if line == "data: [DONE]":
                    stream.done = True
                elif line.startswith("data: "):
                    event = json.loads(line[6:])
                    stream.events.append(event)
                    audio = (event.get("choices") or [{}])[0].get("delta", {}).get("audio") or {}
                    if audio.get("data"):
                        stream.audio_deltas += 1
                        stream.started.set()
    except BaseException as exc:  # noqa: BLE001 - reported by the test
        stream.error = exc
    finally:
        stream.started.set()


def _start_streams(base_url: str, count: int, max_tokens: int) -> tuple[list[Stream], list[threading.Thread]]:
    streams = [Stream() for _ in range(count)]
    threads = [threading.Thread(target=_stream, args=(base_url, max_tokens, s), daemon=True) for s in streams]
    for thread in threads:
        thread.start()
    for s in streams:  # each is in flight: its first audio came
        assert s.started.wait(120)
        assert s.error is None and not s.done, s.error
    return streams, threads


def test_sigterm_lets_four_audio_streams_finish_and_refuses_new_work(server: Served) -> None:
    session = connect(f"{server.base_url.replace('http', 'ws')}/v1/realtime?model=tiny", open_timeout=30)
    assert json.loads(session.recv(30))["type"] == "session.created"
    streams, threads = _start_streams(server.base_url, 4, max_tokens=48)
    assert httpx.get(f"{server.base_url}/ready").json() == {"status": "ready"}

    server.proc.send_signal(signal.SIGTERM)
    # A session has no end of its own: it is told why, then closed as going away.
    closing = json.loads(session.recv(30))
    assert closing["type"] == "error" and closing["error"]["code"] == "server_shutting_down"
    with pytest.raises(ConnectionClosed) as closed:
        session.recv(30)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1001
    time.sleep(0.3)
    ready = httpx.get(f"{server.base_url}/ready")
    assert (ready.status_code, ready.json()) == (503, {"status": "draining"})
    assert httpx.get(f"{server.base_url}/health").status_code == 200  # alive: it is finishing its streams
    refused = httpx.post(f"{server.base_url}/v1/chat/completions",
                         json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}]})
    assert refused.status_code == 503
    assert int(refused.headers["Retry-After"]) >= 1
    assert refused.json()["error"]["code"] == "shutting_down"

    for thread in threads:
        thread.join(120)
    for s in streams:
        assert s.error is None and s.done, s.error
        assert s.audio_deltas >= 1
        assert not any("error" in event for event in s.events)
        assert s.events[-1]["choices"][0]["finish_reason"] in ("stop", "length")
    assert server.proc.wait(60) == 0, "".join(server.log[-30:])


def test_past_the_shutdown_timeout_what_remains_ends_with_an_error(impatient_server: Served) -> None:
    (stream,), threads = _start_streams(impatient_server.base_url, 1, max_tokens=48)
    impatient_server.proc.send_signal(signal.SIGTERM)
    threads[0].join(120)
    assert stream.error is None
    errors = [event["error"] for event in stream.events if "error" in event]
    assert errors and "shut down" in errors[0]["message"]
    assert impatient_server.proc.wait(60) == 0, "".join(impatient_server.log[-30:])


def test_readiness_needs_no_key_and_follows_the_drain(processor: RecordingProcessor) -> None:
    """``/ready`` is open like /health, 200 while serving and 503 once the server drains; meanwhile a new request
    is a 503 with Retry-After even without a key, and the probes still answer."""
    app = build_app(FakeEngine(fake_front_end(processor)), access=AccessPolicy(api_keys=("sk-test",)))
    thread = ServerThread(app)
    base_url = thread.start()
    try:
        assert httpx.get(f"{base_url}/ready").json() == {"status": "ready"}
        assert httpx.get(f"{base_url}/v1/models").status_code == 401
        app.state.services.draining.begin()
        ready = httpx.get(f"{base_url}/ready")
        assert (ready.status_code, ready.json()) == (503, {"status": "draining"})
        assert httpx.get(f"{base_url}/health").status_code == 200
        refused = httpx.get(f"{base_url}/v1/models")
        assert refused.status_code == 503 and refused.headers["Retry-After"] == "5"
        assert refused.json()["error"]["code"] == "shutting_down"
        with pytest.raises(InvalidStatus) as refusal:  # a realtime session's handshake gets the same answer
            connect(f"{base_url.replace('http', 'ws')}/v1/realtime?model=fake-omni",
                    additional_headers={"Authorization": "Bearer sk-test"}, open_timeout=10)
        assert refusal.value.response.status_code == 503
    finally:
        thread.stop()
