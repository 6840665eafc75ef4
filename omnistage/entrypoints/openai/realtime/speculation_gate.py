"""Whether a session may start a speculative reply now (``speculation.py``): only where the server has headroom.

A speculative reply spends the stages' compute on a reply that may be dropped unheard, and it competes with the
replies being spoken: at concurrency 4 on medium, the held replies started at every pause ran one spoken stream
dry. So, server-wide (one gate per ``RealtimeService``):

* **load:** no speculative reply starts while a committed reply that is still being made and already playing has
  less than ``margin_s`` of audio ahead of its player: the caller's, as the server sees it (the audio sent, less the
  time since its first audio). A reply that has sent no audio yet cannot run dry: it does not hold speculation
  back (a speculative reply that is used is work its commit would start anyway, ~100 ms later);
* **cap:** at most ``max_in_flight`` speculative replies run at once;
* **admission:** each holds a place under the server's bound, as any request does (full: none starts).

Refused, a turn is answered as it would be without speculation: its commit starts the reply.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

from omnistage.entrypoints.openai.common.admission import Admission, Overloaded, Ticket

# A committed reply with less audio than this ahead of its player is near running dry: one more chunk late (the
# codec's regular chunk is 2 s of Qwen3-Omni's audio, made in well under a second at concurrency 4) would stall it.
MARGIN_S = 1.0
# Held replies in flight per server: each costs a prefill, a talker's first frames and a codec chunk.
MAX_IN_FLIGHT = 2


class Player(Protocol):
    """A committed reply as its writer sees it (``response.py``)."""

    def ahead_s(self, now: float) -> float | None:
        """Seconds of audio sent beyond what its player has played by ``now``; None before its first audio and once
        nothing more will be made for it (done, or it does not speak)."""
        ...


class SpeculationGate:
    def __init__(self, max_in_flight: int = MAX_IN_FLIGHT, margin_s: float = MARGIN_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.max_in_flight, self.margin_s, self._clock = max_in_flight, margin_s, clock
        self.in_flight = 0
        self._players: set[Player] = set()

    def playing(self, player: Player) -> Callable[[], None]:
        """A committed reply started; the function returned says it ended (idempotent)."""
        self._players.add(player)
        return lambda: self._players.discard(player)

    def headroom(self) -> bool:
        """Every committed reply still being made and playing is ``margin_s`` ahead of its player; the cap is free."""
        if self.in_flight >= self.max_in_flight:
            return False
        now = self._clock()
        return all(ahead is None or ahead >= self.margin_s for ahead in (p.ahead_s(now) for p in self._players))

    def admit(self, admission: Admission) -> Ticket | None:
        """A place for one speculative reply (its admission ticket, which also frees its place here), or None."""
        if not self.headroom():
            return None
        try:
            ticket = admission.admit()
        except Overloaded:
            return None
        self.in_flight += 1

        def release() -> None:
            self.in_flight -= 1
            ticket.release()

        return Ticket(release)
