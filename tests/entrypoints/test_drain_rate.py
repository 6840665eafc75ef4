"""Retry-After from the rate requests really leave at, spread over the clients refused together."""

from __future__ import annotations

import asyncio
import math

import httpx

from omnistage.entrypoints.openai.api_server import build_app
from omnistage.entrypoints.openai.common.drain_rate import RETRY_MAX_S, DrainRate
from omnistage.entrypoints.openai.server_config import ServerLimits
from tests.entrypoints.fake_engine import FakeEngine, RecordingProcessor, fake_front_end
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
    """A burst refused together is told when each of its places should free: 1 s for the first, more for
    those behind (a burst three seconds' drain long)."""
    engine = FakeEngine(fake_front_end(processor))
    app = build_app(engine, ServerLimits(max_queued_requests=2))
    thread = ServerThread(app)
    url = thread.start()
    try:
        drain = app.state.services.chat.admission.drain

        async def scenario() -> tuple[float, list[int]]:
            async with httpx.AsyncClient(base_url=url, timeout=20) as client:
                chat = {"model": "fake-omni", "messages": [{"role": "user", "content": "hi"}]}
                engine.delay_s = 0.02  # ~8 completions a second to measure
                for _ in range(12):
                    assert (await client.post("/v1/chat/completions", json=chat)).status_code == 200
                engine.delay_s = 5.0  # now two slow ones fill the server
                held = [asyncio.ensure_future(client.post("/v1/chat/completions", json=chat)) for _ in range(2)]
                while len(engine.requests) < 14:
                    await asyncio.sleep(0.01)
                rate = drain.per_second()
                burst = [client.post("/v1/chat/completions", json=chat) for _ in range(math.ceil(3 * rate))]
                refused = list(await asyncio.gather(*burst))
                for task in held:
                    task.cancel()
                assert all(r.status_code == 429 for r in refused)
                return rate, [int(r.headers["retry-after"]) for r in refused]

        rate, waits = asyncio.run(scenario())
        assert rate > 0
        waits.sort()  # (the burst's replies arrive in any order)
        # Not one constant: the first refused hear 1 s, those behind them longer (the measured rate
        # itself falls while the burst is refused: nothing finishes meanwhile).
        assert waits[0] == 1 and 2 <= waits[-1] <= RETRY_MAX_S, (rate, waits)
    finally:
        thread.stop()
