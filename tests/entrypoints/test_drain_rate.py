"""Retry-After from the rate requests really leave at, spread over the clients refused together."""

from __future__ import annotations

import asyncio

import httpx

from omnistage.entrypoints.openai.api_server import build_app
from omnistage.entrypoints.openai.drain_rate import RETRY_MAX_S, DrainRate
from omnistage.entrypoints.openai.server_config import ServerLimits
from tests.entrypoints.fake_engine import FakeEngine, RecordingProcessor
from tests.entrypoints.server_thread import ServerThread


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_retry_after_follows_the_drain_rate_and_spreads_a_burst() -> None:
    clock = Clock()
    drain = DrainRate(window_s=30.0, clock=clock)
    clock.now += 30
    assert drain.retry_after_s() == RETRY_MAX_S  # nothing has left yet: the longest wait
    fast, slow = DrainRate(clock=clock), DrainRate(clock=clock)
    clock.now += 30
    for i in range(60):  # 2 per second over the window
        fast.freed()
    for i in range(6):  # 0.2 per second
        slow.freed()
    assert fast.per_second() == 2.0 and slow.per_second() == 0.2
    assert [fast.retry_after_s() for _ in range(6)] == [1, 1, 2, 2, 3, 3]  # k-th refused: k / rate
    assert slow.retry_after_s() == 5
    clock.now += 29.5  # the promises have come due; fast's completions are still (just) in the window
    assert fast.retry_after_s() == 1
    clock.now += 1  # now they have left it
    assert fast.per_second() == 0.0


def test_a_refused_request_hears_when_a_place_should_free(processor: RecordingProcessor) -> None:
    """Requests finishing about 10 per second: a burst refused together is told 1, 1, ..., then 2 s and more."""
    engine = FakeEngine(processor=processor)
    app = build_app(engine, ServerLimits(max_queued_requests=2))
    thread = ServerThread(app)
    url = thread.start()
    try:
        async def scenario() -> list[int]:
            async with httpx.AsyncClient(base_url=url, timeout=20) as client:
                chat = {"model": "fake-omni", "messages": [{"role": "user", "content": "hi"}]}
                for _ in range(20):  # completions to measure
                    assert (await client.post("/v1/chat/completions", json=chat)).status_code == 200
                engine.delay_s = 5.0  # now two slow ones fill the server
                held = [asyncio.ensure_future(client.post("/v1/chat/completions", json=chat)) for _ in range(2)]
                while len(engine.requests) < 22:
                    await asyncio.sleep(0.01)
                refused = [await client.post("/v1/chat/completions", json=chat) for _ in range(30)]
                for task in held:
                    task.cancel()
                assert all(r.status_code == 429 for r in refused)
                return [int(r.headers["retry-after"]) for r in refused]

        waits = asyncio.run(scenario())
        rate = app.state.services.chat.admission.drain.per_second()
        assert rate > 0
        assert waits == sorted(waits) and waits[0] == 1 and waits[-1] > 1, waits  # not one constant
        assert abs(waits[-1] - min(30 / rate, RETRY_MAX_S)) <= 2, (waits, rate)
    finally:
        thread.stop()
