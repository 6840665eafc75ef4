"""How late the event loop runs what is due: ``omnistage_event_loop_lag_seconds``.

A small task sleeps ``interval`` seconds over and over and records how much later than asked it woke. Any
CPU work left on the loop (a parse, a resample, a regex over a large text) shows up here as lag, whatever
route caused it: every other request waited that long too.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from prometheus_client import Histogram

from omnistage.entrypoints.openai.common.stall_tracer import stall_tracer

INTERVAL_S = 0.05


async def watch_loop_lag(histogram: Histogram, interval: float = INTERVAL_S) -> None:
    loop = asyncio.get_running_loop()
    while True:
        start = loop.time()
        await asyncio.sleep(interval)
        histogram.observe(max(loop.time() - start - interval, 0.0))


@contextlib.asynccontextmanager
async def loop_lag_watcher(histogram: Histogram, trace_stalls_ms: float = 0.0) -> AsyncIterator[None]:
    """Runs ``watch_loop_lag`` while the server serves (a FastAPI lifespan), and the stall tracer when asked
    (``--trace-loop-stalls-ms``)."""
    task = asyncio.create_task(watch_loop_lag(histogram))
    try:
        async with stall_tracer(trace_stalls_ms):
            yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
