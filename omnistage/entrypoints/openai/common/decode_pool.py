"""The bounded pool where requests' media decoding and prompt preprocessing run, off the event loop.

``--decode-workers`` threads serve every endpoint; a job waits its turn in
the pool's queue. Each job gets a ``CancelToken``: when the awaiting request
goes away (its client disconnected, it was cancelled), a job still queued is
dropped and a running one stops at its next checkpoint (between items, between
video frames, between audio packets), so nothing keeps decoding for nobody and
what it decoded is freed with it.

Jobs over large media (``run_large``: tens of MB to join, convert and extract
features from) run one at a time. Much of that work holds the GIL in stretches
of tens of ms; with four such jobs at once the event loop, competing with all
of them for the GIL, waited up to a second for its turn (four 60 MB ``data:``
items, traced with ``--trace-loop-stalls-ms``). One at a time, it waits at most
the interpreter's switch interval between stretches; the other workers stay
free for small jobs.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")


class DecodeCancelled(Exception):
    """Raised inside a job whose request went away."""


class CancelToken:
    def __init__(self) -> None:
        self._event = threading.Event()

    def cancel(self) -> None:
        self._event.set()

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()

    def check(self) -> None:
        """A checkpoint: raises ``DecodeCancelled`` once the request went away."""
        if self._event.is_set():
            raise DecodeCancelled()


LARGE_JOB_BYTES = 4 << 20  # media bytes past which a job is ``run_large``'s


class DecodePool:
    def __init__(self, workers: int, name: str = "decode") -> None:
        self.workers = workers
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=f"omnistage-{name}")
        self._lock = threading.Lock()
        self._large = asyncio.Semaphore(1)
        self.queued = 0  # jobs submitted and not finished (running ones included)

    async def run_large(self, fn: Callable[..., T], *args: object) -> T:
        """``run``, one such job at a time (see the module's docstring)."""
        async with self._large:
            return await self.run(fn, *args)

    async def run_sized(self, size: int, fn: Callable[..., T], *args: object) -> T:
        """``run_large`` when the job's media is past ``LARGE_JOB_BYTES``, else ``run``."""
        return await (self.run_large if size > LARGE_JOB_BYTES else self.run)(fn, *args)

    async def run(self, fn: Callable[..., T], *args: object) -> T:
        """``fn(*args, token)`` in the pool; cancelling the caller cancels the job."""
        token = CancelToken()
        with self._lock:
            self.queued += 1
        future = self._executor.submit(self._job, fn, args, token)
        future.add_done_callback(self._done)  # also when cancelled before it ran
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            token.cancel()  # wrap_future already cancelled the job if it had not started
            raise

    @staticmethod
    def _job(fn: Callable[..., T], args: tuple[object, ...], token: CancelToken) -> T:
        token.check()
        return fn(*args, token)

    def _done(self, _: object) -> None:
        with self._lock:
            self.queued -= 1

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
