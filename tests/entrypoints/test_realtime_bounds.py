"""A realtime session cannot hold the event loop or the server's memory (issue 51, rows 3-5): it yields between
queued events and answers a flood with ``rate_limit_exceeded`` errors; an item's audio is size-checked before it is
decoded, and decoded and resampled off the event loop; sessions, items and the audio and text they hold count
against server-wide bounds."""

from __future__ import annotations

import asyncio
import base64
import json
import threading
import time
from collections.abc import Awaitable, Callable

import httpx
from websockets.asyncio.client import connect

from omnistage.entrypoints.openai.api_server import build_app
from omnistage.entrypoints.openai.realtime.session_loop import RealtimeSession
from omnistage.entrypoints.openai.server_config import MediaPolicy, ServerLimits
from tests.entrypoints.fake_engine import FakeEngine, RecordingProcessor, fake_front_end
from tests.entrypoints.realtime_harness import QueuedTransport, realtime_service, run_counting_turns
from tests.entrypoints.server_thread import ServerThread

UPDATE = {"type": "session.update", "session": {"instructions": "Be brief."}}
G711 = {"type": "session.update", "session": {"audio": {"input": {"format": {"type": "audio/pcmu"},
                                                                  "turn_detection": None}}}}


def g711_item(seconds: float, tail: str = "") -> dict:
    audio = base64.b64encode(b"\x7f" * int(8000 * seconds)).decode() + tail
    return {"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": [
        {"type": "input_audio", "audio": audio}]}}


def worst_health_during(url: str, work: Callable[[], Awaitable[object]]) -> float:
    """The slowest ``/health`` answer, polled every 50 ms from a thread of its own (the client's own work does not
    delay it) while ``work`` runs."""
    worst, done = [0.0], threading.Event()

    def canary() -> None:
        with httpx.Client(timeout=30) as client:
            while not done.is_set():
                started = time.monotonic()
                assert client.get(f"{url}/health").status_code == 200
                worst[0] = max(worst[0], time.monotonic() - started)
                time.sleep(0.05)

    watch = threading.Thread(target=canary)
    watch.start()
    try:
        asyncio.run(asyncio.wait_for(work(), 120))
    finally:
        done.set()
        watch.join()
    return worst[0]


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

    async def flood() -> None:
        async with connect(url.replace("http://", "ws://") + "/v1/realtime", max_size=None) as ws:
            await ws.recv()
            message = '{"type": "session.update", "session": {"instructions": "Be brief."}}'
            for _ in range(10_000):
                await ws.send(message)
            answered = 0
            while answered < 10_000:
                answered += json.loads(await ws.recv())["type"] in ("session.updated", "error")

    try:
        worst = worst_health_during(url, flood)
    finally:
        thread.stop()
    assert worst < 1.0, f"/health took {worst:.2f} s during the flood"


# ---- item audio ---------------------------------------------------------------------------------------------


def test_item_audio_is_decoded_off_the_event_loop(processor: RecordingProcessor) -> None:
    """Two items of 599 s of G.711 each: decoded and resampled in the pool while the loop serves others."""
    service = realtime_service(processor, ServerLimits())
    transport = QueuedTransport([G711, g711_item(599), g711_item(599)])
    turns = asyncio.run(run_counting_turns(RealtimeSession(transport, service)))
    added = transport.of("conversation.item.added")
    assert len(added) == 2 and not transport.of("error")
    assert turns > 50  # far more than one between each two events: the loop ran while the pool decoded


def test_item_audio_is_bounded_before_it_is_decoded(processor: RecordingProcessor) -> None:
    """Past --max-audio-seconds from the base64's length alone: the invalid base64 at its end is never read."""
    service = realtime_service(processor, ServerLimits(max_audio_seconds=5.0))
    transport = QueuedTransport([G711, g711_item(6, tail="!!!!"), g711_item(4)])
    asyncio.run(RealtimeSession(transport, service).run())
    errors = transport.of("error")
    assert [e["error"]["code"] for e in errors] == ["input_audio_buffer_too_long"]
    assert len(transport.of("conversation.item.added")) == 1  # the 4 s item


def test_item_audio_does_not_stall_health(processor: RecordingProcessor) -> None:
    """Four items of 599 s of G.711 back to back (each took ~0.2 s of the loop here): /health stays quick."""
    engine = FakeEngine(fake_front_end(processor))
    thread = ServerThread(build_app(engine, ServerLimits(), MediaPolicy()))
    url = thread.start()
    messages = [json.dumps(g711_item(599))] * 4

    async def items() -> None:
        async with connect(url.replace("http://", "ws://") + "/v1/realtime", max_size=None) as ws:
            await ws.recv()
            await ws.send(json.dumps(G711))
            for message in messages:
                await ws.send(message)
            done = 0
            while done < 4:
                event = json.loads(await ws.recv())
                assert event["type"] != "error", event
                done += event["type"] == "conversation.item.done"

    try:
        worst = worst_health_during(url, items)
    finally:
        thread.stop()
    assert worst < 0.5, f"/health took {worst:.2f} s while the items were decoded"
