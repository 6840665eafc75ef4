"""How a GPT-Live session ends when its client does not end it, driven in-process through a queue transport on a
fake engine: the server stopping (``server_shutting_down``, then ``session.closed`` ``connection_lost`` and a 1001
close), the session idle past ``--ws-idle-timeout`` (``expired``), and the client leaving (the backend's realtime
session ends, its running reply aborted)."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from typing import Any

from omnistage.entrypoints.openai.api_server import build_app
from omnistage.entrypoints.openai.live.route import backend_for
from omnistage.entrypoints.openai.live.session import LiveSession
from omnistage.entrypoints.openai.realtime.transport import ClientEvent, Incoming
from tests.entrypoints.conftest import TEST_LIMITS
from tests.entrypoints.fake_engine import FakeEngine, RecordingProcessor, fake_front_end
from tests.entrypoints.live_client import live_problems


class QueueTransport:
    def __init__(self) -> None:
        self.incoming: asyncio.Queue[Incoming | None] = asyncio.Queue()
        self.sent: list[dict[str, Any]] = []
        self.closed: tuple[str, int] | None = None

    async def send(self, event: dict[str, Any]) -> None:
        if self.closed is not None:
            raise ConnectionError("closed")
        self.sent.append(event)

    async def receive(self) -> Incoming | None:
        return await self.incoming.get()

    async def close(self, reason: str, code: int = 1000) -> None:
        self.closed = (reason, code)
        self.incoming.put_nowait(None)

    def put(self, event: dict[str, Any]) -> None:
        self.incoming.put_nowait(ClientEvent(json.dumps(event)))

    async def wait_for(self, kind: str, timeout_s: float = 10.0) -> dict[str, Any]:
        async with asyncio.timeout(timeout_s):
            while not any(e["type"] == kind for e in self.sent):
                await asyncio.sleep(0.01)
        return next(e for e in self.sent if e["type"] == kind)


def _session(processor: RecordingProcessor, **limits: float) -> tuple[LiveSession, QueueTransport, FakeEngine]:
    engine = FakeEngine(fake_front_end(processor))
    service = build_app(engine, replace(TEST_LIMITS, **limits)).state.realtime
    transport = QueueTransport()
    return LiveSession(transport, service, lambda: backend_for(service)), transport, engine


def test_the_server_stopping_closes_the_session_as_connection_lost(processor: RecordingProcessor) -> None:
    async def scenario() -> QueueTransport:
        session, transport, _ = _session(processor)
        transport.put({"type": "session.start", "session": {"model": "fake-omni"}})
        task = asyncio.create_task(session.run())
        await transport.wait_for("session.started")
        await session.service.shut_down_sessions()  # what SIGTERM does (common/draining.py)
        await asyncio.wait_for(task, 10)
        return transport
    transport = asyncio.run(scenario())
    kinds = [e["type"] for e in transport.sent]
    assert kinds[-2:] == ["error", "session.closed"]
    assert transport.sent[-2]["error"]["code"] == "server_shutting_down"
    assert transport.sent[-1]["reason"] == "connection_lost" and transport.closed[1] == 1001
    assert live_problems(transport.sent) == []


def test_an_idle_session_expires(processor: RecordingProcessor) -> None:
    async def scenario() -> QueueTransport:
        session, transport, _ = _session(processor, ws_idle_timeout=0.3)
        transport.put({"type": "session.start", "session": {"model": "fake-omni"}})
        await asyncio.wait_for(session.run(), 10)
        return transport
    transport = asyncio.run(scenario())
    assert transport.sent[-2]["error"]["code"] == "idle_timeout"
    assert transport.sent[-1]["type"] == "session.closed" and transport.sent[-1]["reason"] == "expired"
    assert transport.closed is not None and live_problems(transport.sent) == []


def test_the_client_leaving_aborts_the_running_reply(processor: RecordingProcessor) -> None:
    async def scenario() -> FakeEngine:
        session, transport, engine = _session(processor)
        engine.delay_s = 0.2  # a slow reply: still running when the client goes
        transport.put({"type": "session.start", "session": {"model": "fake-omni"}})
        task = asyncio.create_task(session.run())
        await transport.wait_for("session.started")
        transport.put({"type": "session.commentary.append", "content": "Say hello.", "delegation_id": None})
        await transport.wait_for("session.output_transcript.delta")
        transport.incoming.put_nowait(None)  # the socket closed
        await asyncio.wait_for(task, 10)
        return engine
    engine = asyncio.run(scenario())
    reply = engine.requests[-1].request_id
    assert reply in engine.aborted and reply in engine.closed


def test_a_start_past_the_session_bound_is_refused_without_waiting(processor: RecordingProcessor) -> None:
    """The realtime session behind a start past ``--max-realtime-sessions`` ends before it reads: a long startup
    history (more events than the bridge queues) must not wait for it."""
    history = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": f"{i}"}]}
               for i in range(128)]

    async def scenario() -> tuple[QueueTransport, QueueTransport, dict[str, Any]]:
        first, one, _ = _session(processor, max_realtime_sessions=1)
        second = LiveSession(QueueTransport(), first.service, lambda: backend_for(first.service))
        one.put({"type": "session.start", "session": {"model": "fake-omni"}})
        task = asyncio.create_task(first.run())
        await one.wait_for("session.started")
        second.transport.put({"type": "session.start", "session": {"model": "fake-omni", "input": history}})
        other = asyncio.create_task(second.run())
        refused = await second.transport.wait_for("error")
        second.transport.put({"type": "session.close"})
        one.put({"type": "session.close"})
        await asyncio.wait_for(asyncio.gather(task, other), 10)
        return one, second.transport, refused
    one, two, refused = asyncio.run(scenario())
    assert refused["error"]["type"] == "server_error" and "session" in refused["error"]["message"]
    assert not any(e["type"] == "session.started" for e in two.sent)
    assert one.sent[-1]["type"] == "session.closed"
