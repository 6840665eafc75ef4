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


# ---- what all sessions together hold ------------------------------------------------------------------------


def text_item(item_id: str) -> dict:
    return {"type": "conversation.item.create", "item": {"id": item_id, "type": "message", "role": "user",
                                                           "content": [{"type": "input_text", "text": "hi"}]}}


def append(seconds: float, rate: int = 24_000) -> dict:
    return {"type": "input_audio_buffer.append", "audio": base64.b64encode(b"\0\0" * int(rate * seconds)).decode()}


NO_VAD = {"type": "session.update", "session": {"audio": {"input": {"turn_detection": None}}}}


def test_sessions_past_the_limit_are_refused_and_their_places_come_back(processor: RecordingProcessor) -> None:
    service = realtime_service(processor, ServerLimits(max_realtime_sessions=2))

    async def scenario() -> None:
        hold = asyncio.Event()
        held = [QueuedTransport([], hold) for _ in range(2)]
        tasks = [asyncio.create_task(RealtimeSession(t, service).run()) for t in held]
        await asyncio.gather(*(t.drained.wait() for t in held))
        refused = QueuedTransport([UPDATE])
        await RealtimeSession(refused, service).run()
        assert [e["error"]["code"] for e in refused.of("error")] == ["session_limit_reached"]
        assert refused.closed and not refused.of("session.created")
        assert "--max-realtime-sessions" in refused.of("error")[0]["error"]["message"]
        hold.set()
        await asyncio.gather(*tasks)
        again = QueuedTransport([UPDATE])
        await RealtimeSession(again, service).run()
        assert again.of("session.updated") and not again.of("error")
    asyncio.run(scenario())
    assert service.budget.sessions == 0


def test_items_past_the_server_wide_limit_are_refused(processor: RecordingProcessor) -> None:
    service = realtime_service(processor, ServerLimits(max_realtime_items=3))

    async def scenario() -> None:
        hold = asyncio.Event()
        first = QueuedTransport([text_item("a1"), text_item("a2")], hold)
        task = asyncio.create_task(RealtimeSession(first, service).run())
        await first.drained.wait()
        second = QueuedTransport([text_item("b1"), text_item("b2"), {"type": "conversation.item.delete",
                                                                     "item_id": "b1"}, text_item("b3")])
        await RealtimeSession(second, service).run()
        assert [e["error"]["code"] for e in second.of("error")] == ["too_many_items"]
        assert [e["item"]["id"] for e in second.of("conversation.item.added")] == ["b1", "b3"]
        assert service.budget.items == 2  # the second session's items went back when it ended
        hold.set()
        await task
    asyncio.run(scenario())
    assert (service.budget.items, service.budget.bytes) == (0, 0)


def test_audio_past_the_server_wide_bytes_is_refused(processor: RecordingProcessor) -> None:
    """One session's buffered audio counts against what another may append; clearing gives it back."""
    service = realtime_service(processor, ServerLimits(max_realtime_bytes=1_000_000))  # ~10 s at 24 kHz

    async def scenario() -> None:
        hold = asyncio.Event()
        first = QueuedTransport([NO_VAD, append(6.0)], hold)
        task = asyncio.create_task(RealtimeSession(first, service).run())
        await first.drained.wait()
        assert not first.of("error") and service.budget.bytes >= 6 * 24_000 * 4
        second = QueuedTransport([NO_VAD, append(2.0), append(3.0), {"type": "input_audio_buffer.clear"},
                                  append(3.0)])
        await RealtimeSession(second, service).run()
        errors = second.of("error")
        assert [e["error"]["code"] for e in errors] == ["realtime_memory_exceeded"]
        assert "--max-realtime-bytes" in errors[0]["error"]["message"]
        hold.set()
        await task
    asyncio.run(scenario())
    assert service.budget.bytes == 0


def test_a_commit_makes_room_by_dropping_the_sessions_own_oldest_audio(processor: RecordingProcessor) -> None:
    """G.711 doubles when committed (8 kHz buffered, 16 kHz kept): 4 s turns hold 128 kB buffered, 256 kB committed.
    The fourth commit would pass 1 MB: the session's oldest audio item goes, as past its own bound."""
    service = realtime_service(processor, ServerLimits(max_realtime_bytes=1_000_000))
    update = {"type": "session.update", "session": {"streaming_input": False, "audio": {"input": {
        "format": {"type": "audio/pcmu"}, "turn_detection": None}}}}
    turn = [{"type": "input_audio_buffer.append", "audio": base64.b64encode(b"\x7f" * 32_000).decode()},
            {"type": "input_audio_buffer.commit"}]
    transport = QueuedTransport([update, *turn, *turn, *turn, *turn])
    asyncio.run(RealtimeSession(transport, service).run())
    assert not transport.of("error")
    assert len(transport.of("input_audio_buffer.committed")) == 4
    assert transport.of("conversation.item.deleted")  # older audio items made room
    assert (service.budget.items, service.budget.bytes, service.budget.sessions) == (0, 0, 0)


def test_response_metadata_past_openais_bounds_is_an_error_event(processor: RecordingProcessor) -> None:
    service = realtime_service(processor, ServerLimits())
    transport = QueuedTransport([text_item("x"), {"type": "response.create", "event_id": "evt_m", "response": {
        "metadata": {f"k{i}": "v" for i in range(17)}}}])
    asyncio.run(RealtimeSession(transport, service).run())
    (error,) = transport.of("error")
    assert error["error"]["param"] == "response.metadata" and error["error"]["event_id"] == "evt_m"


def test_what_a_session_held_goes_back_when_it_ends(processor: RecordingProcessor) -> None:
    service = realtime_service(processor, ServerLimits())

    async def scenario() -> None:
        hold = asyncio.Event()
        transport = QueuedTransport([NO_VAD, text_item("q"), {"type": "response.create", "response": {
            "output_modalities": ["text"]}}, append(1.0)], hold)
        task = asyncio.create_task(RealtimeSession(transport, service).run())
        while not transport.of("response.done"):
            await asyncio.sleep(0.01)
        assert service.budget.items == 2 and service.budget.bytes > 24_000 * 4  # question, reply, the buffer
        hold.set()
        await task
    asyncio.run(asyncio.wait_for(scenario(), 60))
    assert (service.budget.items, service.budget.bytes, service.budget.sessions) == (0, 0, 0)


def test_a_socket_past_the_session_limit_hears_why_and_is_told_to_retry(processor: RecordingProcessor) -> None:
    """Over a real WebSocket: the refused client reads an OpenAI-shaped error event, then the close code 1013 (try
    again later, not 1000: nothing went well); once the first session ends, a new one opens."""
    app = build_app(FakeEngine(fake_front_end(processor)), ServerLimits(max_realtime_sessions=1), MediaPolicy())
    thread = ServerThread(app)
    url = thread.start().replace("http://", "ws://") + "/v1/realtime"

    async def scenario() -> tuple[dict, int | None, str]:
        async with connect(url) as first:
            assert json.loads(await first.recv())["type"] == "session.created"
            async with connect(url) as refused:
                error = json.loads(await asyncio.wait_for(refused.recv(), 10))
                await asyncio.wait_for(refused.wait_closed(), 10)
                code = refused.close_code
        for _ in range(50):  # the place comes back once the server has seen the first client leave
            async with connect(url) as again:
                first_event = json.loads(await asyncio.wait_for(again.recv(), 10))["type"]
            if first_event == "session.created":
                break
            await asyncio.sleep(0.1)
        return error, code, first_event
    try:
        error, code, again = asyncio.run(scenario())
    finally:
        thread.stop()
    assert error["type"] == "error" and error["error"]["code"] == "session_limit_reached"
    assert error["error"]["type"] == "server_error" and "--max-realtime-sessions" in error["error"]["message"]
    assert code == 1013 and again == "session.created"
