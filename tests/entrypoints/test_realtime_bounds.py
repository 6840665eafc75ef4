"""A realtime session cannot hold the event loop or the server's memory (issue 51, rows 3-5): it yields between
queued events and answers a flood with ``rate_limit_exceeded`` errors; an item's audio is size-checked before it is
decoded, and decoded and resampled off the event loop; sessions, items and the audio and text they hold count
against server-wide bounds."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest
from websockets.asyncio.client import connect

from omnistage.entrypoints.openai.api_server import build_app
from omnistage.entrypoints.openai.realtime.session_loop import RealtimeSession
from omnistage.entrypoints.openai.server_config import MediaPolicy, ServerLimits, ServingOptions
from tests.entrypoints.fake_engine import FakeEngine, RecordingProcessor, fake_front_end
from tests.entrypoints.realtime_harness import QueuedTransport, realtime_service, run_counting_turns
from tests.entrypoints.server_thread import ServerThread

UPDATE = {"type": "session.update", "session": {"instructions": "Be brief."}}


# ---- floods -------------------------------------------------------------------------------------------------


def test_the_session_loop_yields_between_queued_events(processor: RecordingProcessor) -> None:
    """Events already queued never suspended the read loop: 10,000 session.update held /health for 3.6 s."""
    service = realtime_service(processor, ServerLimits(realtime_events_per_second=1e6))
    transport = QueuedTransport([UPDATE] * 300)
    turns = asyncio.run(run_counting_turns(RealtimeSession(transport, service)))
    assert len(transport.of("session.updated")) == 300
    assert turns >= 300  # another task ran between every two events


def test_a_flood_is_answered_with_rate_limit_errors(processor: RecordingProcessor) -> None:
    service = realtime_service(processor, ServerLimits(realtime_events_per_second=20.0))
    events = [{**UPDATE, "event_id": f"evt_{i}"} for i in range(500)]
    transport = QueuedTransport(events)
    started = time.monotonic()
    asyncio.run(RealtimeSession(transport, service).run())
    elapsed = time.monotonic() - started
    acted = len(transport.of("session.updated"))
    refused = transport.errors("rate_limit_exceeded")
    assert acted + len(refused) == 500
    assert 40 <= acted <= 40 + 20 * elapsed + 1  # the two seconds' burst, then the rate
    assert "--realtime-events-per-second" in refused[0]["message"]
    assert {e["event_id"] for e in refused} <= {e["event_id"] for e in events}


def test_the_rate_refills_with_time() -> None:
    from omnistage.entrypoints.openai.realtime.event_rate import EventRate

    now = [0.0]
    rate = EventRate(10.0, clock=lambda: now[0])
    assert sum(rate.take() for _ in range(50)) == 20  # two seconds' worth at once
    now[0] = 0.5
    assert sum(rate.take() for _ in range(50)) == 5


def test_a_flood_does_not_stall_health(processor: RecordingProcessor) -> None:
    """10,000 session.update back to back while /health is polled: every poll answered well inside a second."""
    engine = FakeEngine(fake_front_end(processor))
    thread = ServerThread(build_app(engine, ServerLimits(), MediaPolicy()))  # Silero VAD: rebuilt per update
    url = thread.start()
    worst = 0.0

    async def flood() -> int:
        async with connect(url.replace("http://", "ws://") + "/v1/realtime", max_size=None) as ws:
            await ws.recv()
            message = '{"type": "session.update", "session": {"instructions": "Be brief."}}'
            for _ in range(10_000):
                await ws.send(message)
            answered = 0
            while answered < 10_000:
                answered += json.loads(await ws.recv())["type"] in ("session.updated", "error")
            return answered

    async def canary(done: asyncio.Event) -> None:
        nonlocal worst
        async with httpx.AsyncClient(timeout=30) as client:
            while not done.is_set():
                started = time.monotonic()
                assert (await client.get(f"{url}/health")).status_code == 200
                worst = max(worst, time.monotonic() - started)
                await asyncio.sleep(0.05)

    async def scenario() -> None:
        done = asyncio.Event()
        watch = asyncio.create_task(canary(done))
        try:
            assert await asyncio.wait_for(flood(), 120) == 10_000
        finally:
            done.set()
            await watch

    try:
        asyncio.run(scenario())
    finally:
        thread.stop()
    assert worst < 1.0, f"/health took {worst:.2f} s during the flood"
