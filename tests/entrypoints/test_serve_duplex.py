"""``omnistage serve moshi-tiny``, the real command: a duplex family is served by the duplex engine (no stage
pipeline), says so in its ready banner, reports it on /health, refuses chat with a 400, opens GPT-Live sessions,
and on SIGTERM ends them as a rolling restart expects (``server_shutting_down``, ``session.closed``, close 1001)
and exits 0."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time

import httpx
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

pytestmark = pytest.mark.e2e
READY = re.compile(r"omnistage is ready: model '[^']+' at (http://[^ ]+)/v1")


def _until_ready(proc: subprocess.Popen[str], log: list[str]) -> str:
    assert proc.stderr is not None
    deadline = time.monotonic() + 300
    for line in proc.stderr:
        log.append(line)
        match = READY.search(line)
        if match:
            log.append(next(proc.stderr))  # the banner's "try:" line
            return match.group(1)
        assert time.monotonic() < deadline, "the server did not start"
    raise AssertionError("".join(log[-30:]))


def test_serve_runs_moshi_on_the_duplex_engine_and_drains_its_sessions_on_sigterm() -> None:
    proc = subprocess.Popen([sys.executable, "-m", "omnistage.entrypoints.cli", "serve", "moshi-tiny", "--port", "0",
                             "--max-num-seqs", "2"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    log: list[str] = []
    try:
        base = _until_ready(proc, log)
        banner = log[-1]
        assert "/v1/live/sessions" in banner and "chat/completions" not in banner
        health = httpx.get(f"{base}/health", timeout=30).json()
        assert health["status"] == "ok" and [s["stage"] for s in health["stages"]] == ["duplex"]
        chat = httpx.post(f"{base}/v1/chat/completions", timeout=30, json={
            "model": "moshi-tiny", "messages": [{"role": "user", "content": "hi"}]})
        assert chat.status_code == 400 and "/v1/live/sessions" in chat.json()["error"]["message"]
        with connect(base.replace("http://", "ws://") + "/v1/live/sessions", open_timeout=30) as ws:
            ws.send(json.dumps({"type": "session.start", "session": {"model": "moshi-tiny"}}))
            first = json.loads(ws.recv(timeout=60))
            if first["type"] == "error":  # a host too loaded for even one session in real time: said clearly
                assert first["error"]["code"] == "session_capacity_exceeded", first
                proc.send_signal(signal.SIGTERM)
                assert proc.wait(60) == 0
                return
            assert first["type"] == "session.started"
            proc.send_signal(signal.SIGTERM)
            events = []
            with pytest.raises(ConnectionClosed) as closed:
                while True:
                    events.append(json.loads(ws.recv(timeout=60)))
        kinds = [e["type"] for e in events if e["type"] != "session.output_audio.delta"]
        assert kinds[-2:] == ["error", "session.closed"] and events[-1]["reason"] == "connection_lost"
        assert [e for e in events if e["type"] == "error"][0]["error"]["code"] == "server_shutting_down"
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1001
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(30)
