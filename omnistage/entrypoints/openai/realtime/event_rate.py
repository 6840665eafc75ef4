"""How fast one realtime session's client events are acted on: a token bucket of ``--realtime-events-per-second``.

Every client event costs the event loop some work (``session.update`` rebuilds the VAD and describes the session);
10,000 sent back to back held the loop for seconds. The session loop yields between events, so others get their
turn, and past this rate an event is not acted on: it is answered with a ``rate_limit_exceeded`` error naming the
flag. The bucket holds ``BURST_S`` seconds' worth, for a client that restores a conversation's items at once.
Microphone audio from a WebRTC track is not counted: its codec paces it.
"""

from __future__ import annotations

import time
from collections.abc import Callable

BURST_S = 2.0


class EventRate:
    def __init__(self, per_second: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.per_second, self.clock = per_second, clock
        self.burst = max(per_second * BURST_S, 1.0)
        self._tokens, self._at = self.burst, clock()

    def take(self) -> bool:
        """Whether one more event may be acted on now (and counts it)."""
        now = self.clock()
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.per_second)
        self._at = now
        if self._tokens < 1.0:
            return False
        self._tokens -= 1.0
        return True
