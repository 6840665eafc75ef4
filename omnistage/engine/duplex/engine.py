"""The duplex engine: one tick per frame, every live session's frame in one model step.

A tick takes each live session's oldest user frame (silence where none has arrived, counted), steps the model
once for all of them, and hands each session its agent frame. A frame is due before the next tick starts; one
whose step finished later goes out as silence and is counted late, so the caller's playback never waits on the
model. A tick that starts late does not hold the next ones back either: when the engine is more than
``max_backlog`` ticks behind, the ticks it missed are skipped (each session gets a late silent frame for each),
so the sessions stay on the wall clock. Sessions are admitted while a step with one more fits the frame
(:mod:`admission`); the model keeps each session's KV bounded (Moshi: its attention window).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from omnistage.engine.duplex.admission import Admission, SessionRefused, StepTimes
from omnistage.engine.duplex.base import DuplexModel
from omnistage.engine.duplex.session import AgentFrame, DuplexSession

__all__ = ["DuplexEngine", "SessionRefused", "TickReport"]


@dataclass(frozen=True)
class TickReport:
    index: int
    rows: int
    step_s: float
    late: bool  # the step finished after the tick's frames were due


class DuplexEngine:
    def __init__(self, model: DuplexModel, times: StepTimes, budget: float = 0.75, max_backlog: int = 2,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.model = model
        self.admission = Admission(times, model.frame_s, model.max_rows, budget)
        self.max_backlog = max_backlog
        self.clock = clock
        self._sessions: list[DuplexSession] = []  # index = the model's row
        self._pending: list[tuple[DuplexSession, object | None]] = []
        self._closing: list[DuplexSession] = []
        self._lock = threading.Lock()
        self._silence = model.silence()
        self._ids = itertools.count()
        self._tick = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.reports: list[TickReport] = []

    # The caller's side ------------------------------------------------------------------------------------
    def open(self, on_frame: Callable[[AgentFrame], None], prompt: object | None = None) -> DuplexSession:
        """A new session, live from the next tick (its prompt prefilled then); :class:`SessionRefused` when one
        more would not hold real time."""
        with self._lock:
            self.admission.check(len(self._sessions) + len(self._pending))
            session = DuplexSession(f"duplex-{next(self._ids)}", on_frame)
            self._pending.append((session, prompt))
        return session

    def close(self, session: DuplexSession) -> None:
        with self._lock:
            if not session.closed:
                session.closed = True
                self._closing.append(session)

    @property
    def live(self) -> int:
        with self._lock:
            return len(self._sessions) + len(self._pending)

    # The engine's side -------------------------------------------------------------------------------------
    def tick(self, started: float) -> TickReport:
        """One frame for every live session; ``started``: when the tick was due (its frames are due one frame
        later)."""
        self._admit_and_release()
        rows = len(self._sessions)
        if rows == 0:
            return TickReport(self._tick, 0, 0.0, False)
        user = torch.stack([s.take(self._silence) for s in self._sessions])
        begin = self.clock()
        out = self.model.step(user)
        done = self.clock()
        late = done > started + self.model.frame_s
        self.admission.times.observe(rows, done - begin)
        for row, session in enumerate(self._sessions):
            complete = bool(out.complete[row]) and not late
            session.deliver(AgentFrame(self._tick, out.frames[row] if complete else self._silence,
                                       int(out.text[row]) if complete else -1, late, done - started))
        return TickReport(self._tick, rows, done - begin, late)

    def run(self) -> None:
        """Ticks on the wall clock until :meth:`stop` (the engine's thread)."""
        start = self.clock()
        while not self._stop.is_set():
            wait = self.advance(start)
            if wait > 0:
                self._stop.wait(wait)

    def advance(self, start: float) -> float:
        """The next tick if it is due (skipping those missed past ``max_backlog``); else the seconds until it
        is. ``start``: when tick 0 was due."""
        due = start + self._tick * self.model.frame_s
        now = self.clock()
        if now < due:
            return due - now
        behind = int((now - due) / self.model.frame_s)
        if behind > self.max_backlog:
            self._skip(behind, due)
            return 0.0
        self.reports.append(self.tick(due))
        self._tick += 1
        return 0.0

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run, name="duplex-engine", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _skip(self, ticks: int, due: float) -> None:
        """The engine fell ``ticks`` behind: those frames go out late and silent, and the clock jumps on."""
        for k in range(ticks):
            for session in self._sessions:
                session.deliver(AgentFrame(self._tick + k, self._silence, -1, True, self.clock() - due))
        self._tick += ticks

    def _admit_and_release(self) -> None:
        with self._lock:
            closing, self._closing = self._closing, []
            pending, self._pending = self._pending, []
        for session in closing:
            if session in self._sessions:
                row = self._sessions.index(session)
                moved = self.model.close(row)
                last = self._sessions.pop()
                if moved is not None:
                    self._sessions[row] = last
        for session, prompt in pending:
            if session.closed:
                continue
            row = self.model.open(prompt)
            assert row == len(self._sessions), "a duplex model appends a session's row"
            self._sessions.append(session)
