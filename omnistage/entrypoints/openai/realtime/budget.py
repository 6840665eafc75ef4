"""What all realtime sessions together may hold: sessions open (WebSocket and WebRTC alike), conversation items, and
the bytes of their audio and text (input buffers, committed audio and its frozen features, item text).

Each session had its own bounds only (600 s buffered, 1,200 s committed, any number of items), so sessions together
had none: eight of them took the API from 0.9 to 3.0 GB. A session's ``SessionMeter`` charges the server-wide
``RealtimeBudget`` as its buffer and conversation grow and refunds it as they shrink and when the session ends; a
charge past a bound is refused with an ``error`` event naming the flag (a conversation first drops its own oldest
audio items to make room, as its per-session bound does). The server's own reply items are charged but never
refused: their tokens bound them.
"""

from __future__ import annotations

import numpy as np

from omnistage.entrypoints.openai.realtime.event_error import EventError
from omnistage.entrypoints.openai.server_config import ServerLimits

SAMPLE_BYTES = np.dtype(np.float32).itemsize  # buffered and committed audio are float32 (an item: ``Item.nbytes``)


class RealtimeBudget:
    def __init__(self, limits: ServerLimits) -> None:
        self.max_sessions, self.max_items = limits.max_realtime_sessions, limits.max_realtime_items
        self.max_bytes = limits.max_realtime_bytes
        self.sessions = self.items = self.bytes = 0

    def meter(self) -> SessionMeter:
        return SessionMeter(self)


class SessionMeter:
    """One session's share of the budget: counted from ``open`` to ``close``."""

    def __init__(self, budget: RealtimeBudget) -> None:
        self.budget = budget
        self.items = self.bytes = 0
        self.opened = self.closed = False

    def open(self) -> None:
        budget = self.budget
        if budget.sessions >= budget.max_sessions:
            raise EventError("session_limit_reached", f"the server holds {budget.max_sessions} realtime sessions, its "
                             "limit (--max-realtime-sessions); try again later", error_type="server_error")
        budget.sessions += 1
        self.opened = True

    def fits(self, nbytes: int, items: int = 0) -> bool:
        budget = self.budget
        return budget.items + items <= budget.max_items and budget.bytes + nbytes <= budget.max_bytes

    def charge(self, nbytes: int, items: int = 0, param: str | None = None, force: bool = False) -> None:
        """Counts ``nbytes`` and ``items`` more; past a bound (unless ``force``) an error naming it, nothing counted."""
        budget = self.budget
        if not force and budget.items + items > budget.max_items:
            raise EventError("too_many_items", f"the server's realtime sessions hold {budget.max_items} items, its "
                             "limit (--max-realtime-items); delete some", param, error_type="server_error")
        if not force and budget.bytes + nbytes > budget.max_bytes:
            raise EventError("realtime_memory_exceeded", f"the server's realtime sessions hold {budget.bytes} bytes "
                             f"of audio and text; {nbytes} more would pass its limit of {budget.max_bytes} "
                             "(--max-realtime-bytes)", param, error_type="server_error")
        self._add(nbytes, items)

    def refund(self, nbytes: int, items: int = 0) -> None:
        self._add(-nbytes, -items)

    def close(self) -> None:
        """The session ended: everything it held, and its place, go back (what it drops later is not counted)."""
        self.refund(self.bytes, self.items)
        self.closed = True
        if self.opened:
            self.budget.sessions -= 1
            self.opened = False

    def _add(self, nbytes: int, items: int) -> None:
        if self.closed:
            return
        self.bytes += nbytes
        self.items += items
        self.budget.bytes += nbytes
        self.budget.items += items
