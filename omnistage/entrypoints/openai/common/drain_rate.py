"""How fast admitted requests leave, and so when a refused client should come back (``Retry-After``).

Every ticket released is a place freed. Over the last ``window_s`` seconds
that gives a drain rate (places per second); the k-th client refused while
earlier refused ones are still waiting is told when the k-th place is
expected to free, ``k / rate``, so a burst of refusals is spread out instead
of returning all at once. With nothing freed in the window the server is
stuck behind long requests, and the wait is the cap.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable

DRAIN_WINDOW_S = 30.0
RETRY_MIN_S = 1
RETRY_MAX_S = 60  # OpenAI's clients wait out a Retry-After up to a minute


class DrainRate:
    def __init__(self, window_s: float = DRAIN_WINDOW_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.window_s = window_s
        self.clock = clock
        self.started = clock()
        self._freed: deque[float] = deque(maxlen=100_000)
        self._promised: deque[float] = deque()  # when each client refused earlier was told to come back

    def freed(self) -> None:
        self._freed.append(self.clock())

    def per_second(self) -> float:
        now = self.clock()
        while self._freed and self._freed[0] < now - self.window_s:
            self._freed.popleft()
        span = min(self.window_s, now - self.started)
        return len(self._freed) / span if span > 0 else 0.0

    def retry_after_s(self) -> int:
        """Seconds until a place is expected for one more refused client (and it is counted as waiting)."""
        now = self.clock()
        while self._promised and self._promised[0] <= now:
            self._promised.popleft()
        rate = self.per_second()
        ahead = len(self._promised) + 1
        wait = RETRY_MAX_S if rate <= 0 else min(max(math.ceil(ahead / rate), RETRY_MIN_S), RETRY_MAX_S)
        self._promised.append(now + wait)
        return wait
