"""A realtime session driven in-process, without a socket: its client events queued up front (as a flood sits in a
socket's buffer), what it sends kept. The service is the app's own (``build_app``), so its limits and pools are."""

from __future__ import annotations

import asyncio
import json
from collections import deque
from typing import Any

from omnistage.entrypoints.openai.api_server import build_app
from omnistage.entrypoints.openai.realtime.service import RealtimeService
from omnistage.entrypoints.openai.realtime.session_loop import RealtimeSession
from omnistage.entrypoints.openai.realtime.transport import ClientEvent, Incoming
from omnistage.entrypoints.openai.server_config import MediaPolicy, ServerLimits, ServingOptions
from tests.entrypoints.fake_engine import FakeEngine, RecordingProcessor, fake_front_end


class QueuedTransport:
    """Hands out its queued events without ever waiting (a full socket buffer), then says the client left (or, with
    ``hold``, waits for it first: the session stays open)."""

    def __init__(self, events: list[dict[str, Any]], hold: asyncio.Event | None = None) -> None:
        self.incoming: deque[Incoming] = deque(ClientEvent(json.dumps(e)) for e in events)
        self.sent: list[dict[str, Any]] = []
        self.hold, self.drained, self.closed = hold, asyncio.Event(), False

    async def send(self, event: dict[str, Any]) -> None:
        self.sent.append(event)

    async def receive(self) -> Incoming | None:
        if not self.incoming:
            self.drained.set()
            if self.hold is not None:
                await self.hold.wait()
        return self.incoming.popleft() if self.incoming else None

    async def close(self, reason: str, code: int = 1000) -> None:
        self.incoming.clear()
        self.closed = True
        self.drained.set()

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.sent if e["type"] == kind]

    def errors(self, code: str) -> list[dict[str, Any]]:
        return [e["error"] for e in self.of("error") if e["error"]["code"] == code]


def realtime_service(processor: RecordingProcessor, limits: ServerLimits) -> RealtimeService:
    app = build_app(FakeEngine(fake_front_end(processor)), limits, MediaPolicy(), serving=ServingOptions(vad="energy"))
    return app.state.realtime


async def run_counting_turns(session: RealtimeSession) -> int:
    """Runs ``session`` to its end; how many times another task got the event loop meanwhile."""
    turns = 0

    async def other() -> None:
        nonlocal turns
        while True:
            turns += 1
            await asyncio.sleep(0)

    ticker = asyncio.create_task(other())
    await asyncio.sleep(0)
    start = turns
    await session.run()
    ticker.cancel()
    return turns - start
