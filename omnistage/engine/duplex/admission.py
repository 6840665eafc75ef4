"""How many duplex sessions fit in real time: a step's time against the number of rows it carries.

The engine measures its model's step at 1, 2, 4, ... rows before serving (:func:`calibrate`), then keeps each
size's time current with what ticks actually took (an exponential average, so a busier host lowers the limit).
A new session is admitted while the predicted step with it stays within ``budget`` of the frame (the rest of the
frame is the codec's and the jitter's); the next is refused with the numbers that refused it.
"""

from __future__ import annotations

import bisect
import time
from dataclasses import dataclass, field

import torch

from omnistage.engine.duplex.base import DuplexModel, FrameCodec
from omnistage.engine.duplex.coded_step import step

SMOOTHING = 0.1  # each tick's weight in its size's running step time


class SessionRefused(RuntimeError):
    """No room for one more session in real time (or no row left); the message says which numbers refused it."""


@dataclass
class StepTimes:
    """Seconds per step by rows carried, measured then kept current."""

    seconds: dict[int, float] = field(default_factory=dict)

    def observe(self, rows: int, seconds: float) -> None:
        old = self.seconds.get(rows)
        self.seconds[rows] = seconds if old is None else (1 - SMOOTHING) * old + SMOOTHING * seconds

    def predict(self, rows: int) -> float:
        """A step of ``rows``: measured, else linear between the nearest sizes (beyond the largest: its time
        per row)."""
        if rows in self.seconds or not self.seconds:
            return self.seconds.get(rows, 0.0)
        sizes = sorted(self.seconds)
        i = bisect.bisect_left(sizes, rows)
        if i == len(sizes):
            return self.seconds[sizes[-1]] * rows / sizes[-1]
        if i == 0:
            return self.seconds[sizes[0]]
        lo, hi = sizes[i - 1], sizes[i]
        return self.seconds[lo] + (self.seconds[hi] - self.seconds[lo]) * (rows - lo) / (hi - lo)


@dataclass
class Admission:
    times: StepTimes
    frame_s: float
    max_rows: int
    budget: float = 0.75  # of the frame a step may take

    def capacity(self) -> int:
        """The most sessions whose step fits the budget (what the bench prints as holding real time)."""
        return max((n for n in range(1, self.max_rows + 1) if self.times.predict(n) <= self.limit_s), default=0)

    @property
    def limit_s(self) -> float:
        return self.budget * self.frame_s

    def check(self, live: int) -> None:
        if live >= self.max_rows:
            raise SessionRefused(f"duplex engine full: all {self.max_rows} session rows are live")
        step = self.times.predict(live + 1)
        if step > self.limit_s:
            raise SessionRefused(
                f"duplex engine at real-time capacity: {live} sessions live; a step of {live + 1} would take "
                f"{step * 1e3:.1f} ms of the {self.frame_s * 1e3:.0f} ms frame (limit {self.limit_s * 1e3:.1f} ms)")


@torch.inference_mode()
def calibrate(model: DuplexModel, sizes: tuple[int, ...] | None = None, steps: int = 5,
              codec: FrameCodec | None = None) -> StepTimes:
    """The model's step (with its codec around it, if any) at 1, 2, 4, ... rows up to its rows, on scratch
    sessions closed after; the median of ``steps``."""
    if model.rows:
        raise RuntimeError("calibrate before any session opens")
    sizes = sizes or tuple(sorted({min(2 ** i, model.max_rows) for i in range(model.max_rows.bit_length() + 1)}))
    times = StepTimes()
    quiet = model.silence() if codec is None else torch.zeros(codec.samples_per_frame)
    for n in sizes:
        while model.rows < n:
            model.open(None)
            if codec is not None:
                codec.open()
        heard = quiet.expand(n, -1)
        step(model, codec, heard)  # the first step of new rows warms caches
        samples = []
        for _ in range(steps):
            start = time.perf_counter()
            step(model, codec, heard)
            samples.append(time.perf_counter() - start)
        times.seconds[n] = sorted(samples)[len(samples) // 2]
    while model.rows:
        row = model.rows - 1
        model.close(row)
        if codec is not None:
            codec.close(row)
    return times
