"""A replica's signs of life as the orchestrator sees them, and when to restart it after it dies or hangs.

A process that is alive is not necessarily working: a replica whose engine
loop is stuck (a hung kernel, a deadlock, a SIGSTOP) still passes
``is_alive``. So every replica's engine loop sends something at least every
``HEARTBEAT_S`` (a ``Heartbeat`` when it has nothing else to say); a ready
replica silent for ``stall_timeout_s`` is declared stalled, its requests are
failed and it is killed and restarted. Restarts back off (doubling up to a
cap) and the backoff starts over once a replica has stayed healthy for
``BACKOFF_RESET_S``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

HEARTBEAT_S = 1.0  # a replica's engine loop reports at least this often
RESTART_BACKOFF_S = (0.5, 30.0)  # first wait before restarting a dead replica, and the cap as it doubles
BACKOFF_RESET_S = 60.0  # healthy this long: the next failure restarts after the first wait again
DEFAULT_STALL_TIMEOUT_S = 60.0


@dataclass
class Liveness:
    last_seen: float = field(default_factory=time.monotonic)  # its latest message (or its creation)
    healthy_since: float | None = None
    backoff: int = 0  # restarts since it was last healthy for BACKOFF_RESET_S

    def seen(self, now: float) -> None:
        self.last_seen = now

    def became_healthy(self, now: float) -> None:
        self.healthy_since = self.last_seen = now

    def silent_for(self, now: float) -> float:
        return now - self.last_seen

    def restart_delay(self, now: float) -> float:
        """How long to wait before restarting it, now that it is down."""
        if self.healthy_since is not None and now - self.healthy_since >= BACKOFF_RESET_S:
            self.backoff = 0
        self.healthy_since = None
        first, cap = RESTART_BACKOFF_S
        delay = min(first * 2 ** self.backoff, cap)
        self.backoff += 1
        return delay
