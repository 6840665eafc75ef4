"""The duplex engine: one tick per frame, every live session's frame in one model step.

A tick takes each live session's oldest user frame (silence where none has arrived, counted), steps the model
once for all of them, and hands each session its agent frame. A frame is due before the next tick starts; one
whose step finished later goes out as silence and is counted late, so the caller's playback never waits on the
model. A tick that starts late does not hold the next ones back either: when the engine is more than
``max_backlog`` ticks behind, the ticks it missed are skipped (each session gets a late silent frame for each),
so the sessions stay on the wall clock. Sessions are admitted while a step with one more fits the frame
(:mod:`admission`); the model keeps each session's KV bounded (Moshi: its attention window). A new session's
prompt is prefilled by the tick that admits it, so a long one (PersonaPlex's voice prompt) makes that tick late.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import torch

from omnistage.engine.duplex.admission import Admission, SessionRefused, StepTimes
from omnistage.engine.duplex.base import DuplexModel, FrameCodec
from omnistage.engine.duplex.coded_step import CodedStep, step
from omnistage.engine.duplex.session import LATENESS_KEPT, AgentFrame, DuplexSession

__all__ = ["DuplexEngine", "SessionRefused", "TickReport"]


@dataclass(frozen=True)
class TickReport:
    index: int
    rows: int
    step_s: float
    late: bool  # the step finished after the tick's frames were due


class DuplexEngine:
    def __init__(self, model: DuplexModel, times: StepTimes, budget: float = 0.75, max_backlog: int = 2,
                 clock: Callable[[], float] = time.monotonic, codec: FrameCodec | None = None) -> None:
        self.model, self.codec = model, codec
        self.admission = Admission(times, model.frame_s, model.max_rows, budget)
        self.max_backlog = max_backlog
        self.clock = clock
        self._sessions: list[DuplexSession] = []  # index = the model's row
        self._pending: list[tuple[DuplexSession, object | None]] = []
        self._closing: list[DuplexSession] = []
        self._lock = threading.Lock()
        self._silence = model.silence()
        # what a missing input is heard as: a silent frame of samples through the codec, else its codes
        self._quiet = torch.zeros(codec.samples_per_frame) if codec is not None else self._silence
        self._ids = itertools.count()
        self._tick = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.reports: deque[TickReport] = deque(maxlen=LATENESS_KEPT)  # the latest hour's: a server runs for days

    # The caller's side ------------------------------------------------------------------------------------
    def open(self, on_frame: Callable[[AgentFrame], None], prompt: object | None = None) -> DuplexSession:
        """A new session, live from the next tick (its prompt prefilled then); :class:`SessionRefused` when one
        more would not hold real time."""
        with self._lock:
            self.admission.check(len(self._sessions) + len(self._pending))
            session = DuplexSession(f"duplex-{next(self._ids)}", on_frame)
            self._pending.append((session, prompt))
        return session

    def check_room(self) -> None:
        """:class:`SessionRefused` unless one more session would be admitted now (a WebRTC call's set-up asks
        before it answers)."""
        with self._lock:
            self.admission.check(len(self._sessions) + len(self._pending))

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
        report = TickReport(self._tick, rows, 0.0, False)
        if rows:
            report = self._step(started)
        self._tick += 1
        return report

    def _step(self, started: float) -> TickReport:
        heard = torch.stack([s.take(self._quiet) for s in self._sessions])
        begin = self.clock()
        out = step(self.model, self.codec, heard)
        done = self.clock()
        late = done > started + self.model.frame_s
        self.admission.times.observe(len(self._sessions), done - begin)
        for row, session in enumerate(self._sessions):
            session.deliver(self._frame(out, row, late, done - started))
        return TickReport(self._tick, len(self._sessions), done - begin, late)

    def _frame(self, out: CodedStep, row: int, late: bool, lateness_s: float) -> AgentFrame:
        """A late frame goes out silent (zeros); a row's frame before its first generated one is the decoded
        silence codes its decoder stream advanced by."""
        audio = None if out.audio is None else out.audio[row]
        if late:
            return AgentFrame(self._tick, self._silence, -1, True, lateness_s,
                              None if audio is None else torch.zeros_like(audio))
        text = int(out.text[row]) if bool(out.complete[row]) else -1
        return AgentFrame(self._tick, out.frames[row], text, False, lateness_s, audio)

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
        return 0.0

    @property
    def running(self) -> bool:
        """The tick thread is alive (a step that raised ends it: the server's health then says so)."""
        return self._thread is not None and self._thread.is_alive()

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
                quiet = None if self.codec is None else torch.zeros(self.codec.samples_per_frame)
                session.deliver(AgentFrame(self._tick + k, self._silence, -1, True, self.clock() - due, quiet))
        self._tick += ticks

    def _admit_and_release(self) -> None:
        with self._lock:
            closing, self._closing = self._closing, []
            pending, self._pending = self._pending, []
        for session in closing:
            if session in self._sessions:
                row = self._sessions.index(session)
                moved = self.model.close(row)
                if self.codec is not None:
                    self.codec.close(row)
                last = self._sessions.pop()
                if moved is not None:
                    self._sessions[row] = last
        for session, prompt in pending:
            if session.closed:
                continue
            row = self.model.open(prompt)
            if self.codec is not None:
                self.codec.open()
            assert row == len(self._sessions), "a duplex model appends a session's row"
            self._sessions.append(session)
