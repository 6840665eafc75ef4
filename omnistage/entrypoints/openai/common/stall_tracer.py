"""Names what stalled the event loop: ``--trace-loop-stalls-ms N`` (off by default; a diagnostic).

The loop lag histogram (``loop_lag.py``) says *that* the loop was late, not *why*. Here a task on the loop
stamps a heartbeat every ``interval`` seconds, and a watchdog thread checks it: once the beat is late by more
than N ms the watchdog takes the stack of every Python thread (``sys._current_frames()``), and when the loop
beats again it logs one line naming the stall's length, the loop thread's innermost frames and every other
thread's (a pool thread holding the GIL stalls the loop as surely as the loop's own work does), and where the
stall's time went: the loop thread's own CPU time over it, and the rest of the process's (the other threads'). A
loop on the CPU for the whole stall ran the work itself; a loop barely on the CPU while the other threads were
waited for the GIL; neither means the machine's other processes had the cores.

The watchdog needs the GIL to look. A C call that holds the GIL (msgspec decoding a 30 MB body, base64)
keeps the watchdog out until it returns, so the stacks are those just after it: still in the function that
made the call. ``watchdog_late_ms`` in the line says how long the watchdog itself waited for the GIL.
Reports are rate-limited (one per ``min_gap_s``; the stalls skipped are counted in the next line).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import threading
import time
import traceback
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from types import FrameType

logger = logging.getLogger(__name__)

BEAT_S = 0.02
FRAMES_SHOWN = 6  # innermost frames per thread: enough to name the culprit, short enough for one line


def _frames(frame: FrameType) -> str:
    """A thread's innermost frames, outermost first: ``file:line func < ...``."""
    summary = traceback.extract_stack(frame)[-FRAMES_SHOWN:]
    return " > ".join(f"{entry.filename.rsplit('/', 1)[-1]}:{entry.lineno} {entry.name}" for entry in summary)


def thread_stacks(loop_thread: int) -> str:
    """Every Python thread's innermost frames, the loop thread first."""
    names = {t.ident: t.name for t in threading.enumerate()}
    frames = sys._current_frames()  # noqa: SLF001 - the documented way to see other threads' stacks
    ordered = sorted(frames.items(), key=lambda item: item[0] != loop_thread)
    return " | ".join(f"[{'loop' if ident == loop_thread else names.get(ident, ident)}] {_frames(frame)}"
                      for ident, frame in ordered if ident != threading.get_ident())


@dataclass
class _Stall:
    beat: int  # the heartbeat that came late
    stacks: str
    watchdog_late_ms: float


@dataclass
class StallTracer:
    """The watchdog: ``beat`` runs on the loop, ``watch`` in its own thread."""

    threshold_s: float
    interval_s: float = BEAT_S
    min_gap_s: float = 1.0
    _beats: int = 0
    _last: float = field(default_factory=time.monotonic)
    _last_cpu: tuple[float, float] = (0.0, 0.0)  # the loop thread's and the process's CPU seconds at the last beat
    _worst: tuple[float, float, float] = (0.0, 0.0, 0.0)  # the longest gap since the last report: wall, loop, process
    _stop: threading.Event = field(default_factory=threading.Event)
    _pending: _Stall | None = None
    _last_report: float = float("-inf")
    _skipped: int = 0
    reports: int = 0

    async def beat(self) -> None:
        self._last, self._last_cpu = time.monotonic(), (time.thread_time(), time.process_time())
        while True:
            await asyncio.sleep(self.interval_s)
            now, cpu = time.monotonic(), (time.thread_time(), time.process_time())
            gap = (now - self._last, cpu[0] - self._last_cpu[0], cpu[1] - self._last_cpu[1])
            self._worst = max(self._worst, gap)
            self._last, self._last_cpu = now, cpu
            self._beats += 1

    def watch(self, loop_thread: int) -> None:
        poll = min(self.threshold_s / 4, 0.05)
        while True:
            asked = time.monotonic()
            if self._stop.wait(poll):
                return
            woke = time.monotonic()
            self.check(loop_thread, woke, woke - asked - poll)

    def check(self, loop_thread: int, now: float, watchdog_late_s: float) -> None:
        """One look: a late beat's stacks are taken; once the loop beats again the stall is logged."""
        pending = self._pending
        if pending is not None and self._beats != pending.beat:
            self._pending, worst, self._worst = None, self._worst, (0.0, 0.0, 0.0)
            self._report(pending, worst, now)
        elif pending is None and now - self._last - self.interval_s > self.threshold_s:
            self._pending = _Stall(self._beats, thread_stacks(loop_thread), watchdog_late_s * 1000)

    def _report(self, stall: _Stall, worst: tuple[float, float, float], now: float) -> None:
        if now - self._last_report < self.min_gap_s:
            self._skipped += 1
            return
        self._last_report, skipped, self._skipped = now, self._skipped, 0
        self.reports += 1
        wall, loop_cpu, process_cpu = (value * 1000 for value in worst)
        logger.warning("event loop stalled %.0f ms (loop thread on CPU %.0f ms, other threads %.0f ms; watchdog late "
                       "%.0f ms; %d stalls not logged since the last): %s", wall - self.interval_s * 1000, loop_cpu,
                       process_cpu - loop_cpu, stall.watchdog_late_ms, skipped, stall.stacks)

    def stop(self) -> None:
        self._stop.set()


@contextlib.asynccontextmanager
async def stall_tracer(threshold_ms: float) -> AsyncIterator[StallTracer | None]:
    """Runs a ``StallTracer`` while the server serves; ``threshold_ms`` 0: none."""
    if threshold_ms <= 0:
        yield None
        return
    tracer = StallTracer(threshold_ms / 1000)
    task = asyncio.create_task(tracer.beat())
    thread = threading.Thread(target=tracer.watch, args=(threading.get_ident(),), name="omnistage-stall-tracer",
                              daemon=True)
    thread.start()
    try:
        yield tracer
    finally:
        tracer.stop()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        thread.join(1.0)
