"""uvicorn's server, stopping the way a rolling restart expects.

uvicorn stops at the first SIGTERM or SIGINT: it closes the listening socket (a new client is refused, not told
to retry), waits for the connections, and then raises the signal again, so the process dies of it instead of
exiting 0. Here the first signal starts a drain (:mod:`omnistage.entrypoints.openai.common.draining`): the
socket stays open and answers 503 with ``Retry-After``, readiness turns false, and what is in flight goes on;
sessions, which have no end of their own, are told to end (``on_drain``: each realtime session finishes its
running response, gets an error event saying why and is closed with 1001).
The server stops once nothing is in flight. At ``--shutdown-timeout``, or at a second signal, it ends what remains
first (``end_work``: the pipeline shuts down, and every request still running gets that error as its last event),
then stops. The process exits 0 either way.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from types import FrameType

import uvicorn

from omnistage.entrypoints.openai.common.draining import Draining

logger = logging.getLogger(__name__)


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, draining: Draining, timeout_s: float,
                 in_flight: Callable[[], int], end_work: Callable[[], Awaitable[None]],
                 on_drain: Callable[[], Awaitable[None]] | None = None) -> None:
        super().__init__(config)
        self.on_drain = on_drain
        self._drain_task: asyncio.Task[None] | None = None
        self.draining = draining
        self.timeout_s = timeout_s
        self.in_flight = in_flight  # requests, sessions and calls still running
        self.end_work = end_work
        self._cut_short = False
        self._ending: asyncio.Task[None] | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # Not recorded in uvicorn's captured signals: it raises those again once it has stopped.
        if self.draining.draining:
            self._cut_short = True
            return
        self.draining.begin()
        logger.warning("stopping: new requests get 503; %d in flight have up to %g s to finish (a second signal "
                       "ends them now)", self.in_flight(), self.timeout_s)

    async def on_tick(self, counter: int) -> bool:
        """Every 0.1 s (uvicorn's main loop): stops once the drain is over."""
        if self.draining.draining and self.on_drain is not None and self._drain_task is None:
            self._drain_task = asyncio.create_task(self.on_drain())
        if self.draining.draining and not self.should_exit and self._ending is None:
            since = self.draining.since or time.monotonic()
            if self.in_flight() == 0:
                self.should_exit = True
            elif self._cut_short or time.monotonic() - since >= self.timeout_s:
                logger.warning("stopping now: ending %d requests and sessions still in flight", self.in_flight())
                self._ending = asyncio.create_task(self._end())
        return await super().on_tick(counter)

    async def _end(self) -> None:
        try:
            await self.end_work()
        finally:
            self.should_exit = True
