"""Admission that protects running streams: a new audio request waits while adding it would push the pipeline
past real time.

Every running stream needs one second of audio per wall second. The pipeline keeps up while each stage makes
audio faster than that for all of them: the talker while its wall time per frame of a stream stays under the
frame's duration (the family's: 80 ms at 12.5 Hz; a talker step serves every stream, so one stream's pace is the
stage's), code2wav while its busy time per second of audio, times the number of streams, stays under one second. The larger of the two is the
pipeline's real-time factor at this load. Starting one more stream past ``limit`` would slow every stream into
underruns; instead it waits (its caller's admission ticket keeps counting, so ``--max-queued-requests`` still
bounds the queue with 429s).

What one more stream costs is predicted per stage. Code2wav's load grows with the streams (the median second of
audio's busy time over its recent chunks, times their number: each chunk weighs the audio it made, so a stream's
small first chunk, dearer per second than its later ones, counts for its share of the audio, not as a chunk). The
talker batches: a step reads its weights once for every stream, so its pace grows by far less than a stream's
share. Its pace is measured at each number of streams (a moving average per count, recorded while every talking
stream has a measured pace) and extrapolated along the line through the two largest counts measured (a saturating
talker bends up); with one count only, one more stream is taken to add ``MARGINAL_PRIOR`` of the pace (a batched
stage), which the next measurement corrects. Extrapolation goes one stream past what was measured, never more: a
burst of requests ramps up one measured count at a time. With no stream running, a request always starts.

When the talker measured its decode step at several batch sizes before serving (:class:`StepProfile`, from
:mod:`omnistage.engine.step_profile`), that curve gives the shape and the running streams only the level: the
pace at ``n`` streams is the latest measured pace (at whatever count it was taken) times the profile's step time
at ``n`` over its step time at that count. The per-count measurements confound the talker's cost with passing
contention (a newly admitted stream's prefill on the same cores), so extrapolating between two of them can read a
transient as the cost of a stream; the profile does not. A burst starts in rounds: each round as many streams as
the profile predicts room for, at most as many as are talking (so 1, 2, 4, ... while there is room), started
together so that their prefills batch and slow the running streams once; the next round waits until every stream
has a measured pace. The level the profile scales then includes what every running stream costs the machine (its
code2wav and thinker work shares the cores with the talker where all run on one CPU), which the talker's profile
alone does not see. While a stream is in its prefill, or a playing stream holds less than ``MIN_BUFFER_S`` of
audio, another starts only far below the limit (``PREFILL_HEADROOM``).
"""

from __future__ import annotations

import statistics
import sys
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from omnistage.pipeline.chunk_planner import Pace

MARGINAL_PRIOR = 0.25  # a stream's added talker pace, as a share of the pace, until two counts are measured
# While a new stream is in its prefill the running streams' pace can reach about twice its level (seen on the
# medium checkpoint: 42 -> 70 ms a frame): with an unmeasured stream running, another starts only with that room.
PREFILL_HEADROOM = 2.0
# A playing stream rides out a new stream's prefill (about half a second at up to twice the pace: a stream at 0.7x real
# time then falls behind by about 0.2 s) with this much audio.
MIN_BUFFER_S = 0.5
# Code2wav's load is the median of its newest calls: a fresh replica's first calls (each new chunk length's first
# run builds its kernels) cost several times the rest and must not hold a burst back for the calls after them.
RECENT_CALLS = 16


@dataclass
class RecentMedian:
    """The weighted median of the newest ``RECENT_CALLS`` samples (with equal weights, the median); None before
    the first."""

    _samples: deque[tuple[float, float]] = field(default_factory=lambda: deque(maxlen=RECENT_CALLS))
    # Kept until the next sample: the gate asks once per stream it might start, on every walk while requests wait.
    _median: float | None = None

    def add(self, sample: float, weight: float = 1.0) -> None:
        self._samples.append((sample, weight))
        self._median = None

    @property
    def value(self) -> float | None:
        if self._median is None:
            self._median = self._weighted_median()
        return self._median

    def _weighted_median(self) -> float | None:
        if not self._samples:
            return None
        ordered = sorted(self._samples)
        half, seen = sum(w for _, w in ordered) / 2, 0.0
        for i, (sample, weight) in enumerate(ordered):
            seen += weight
            if seen > half:
                return sample
            if seen == half:  # between two samples, as the median of an even count
                return statistics.mean((sample, ordered[i + 1][0]))
        return ordered[-1][0]


class StreamLoad(NamedTuple):
    """One stream in flight: whether its talker still runs, its measured wall seconds per talker frame, and the
    audio its player holds (None while it is not playing yet, or nobody plays it as it arrives). A tuple: the
    orchestrator makes one per running stream on most passes."""

    talking: bool
    talker_frame_s: float | None = None
    buffered_s: float | None = None

    @property
    def exposed(self) -> bool:
        """Whether a passing slowdown could stall it now: in its prefill (its load not measured yet), or playing
        with less than ``MIN_BUFFER_S`` of audio in hand."""
        if not self.talking:
            return False
        return self.talker_frame_s is None or (self.buffered_s is not None and self.buffered_s < MIN_BUFFER_S)


@dataclass(frozen=True)
class StepProfile:
    """A talker's decode step seconds at the batch sizes it measured (ascending, positive)."""

    points: tuple[tuple[int, float], ...]

    @classmethod
    def of(cls, step_seconds: dict[int, float]) -> StepProfile | None:
        points = tuple(sorted((n, s) for n, s in step_seconds.items() if n >= 1 and s > 0))
        return cls(points) if points else None

    def at(self, batch: int) -> float:
        """Step seconds at ``batch``: linear between measured sizes, along the last segment past the largest
        (never falling), the smallest measured below it."""
        points = self.points
        if batch <= points[0][0]:
            return points[0][1]
        for (n1, s1), (n2, s2) in zip(points, points[1:]):
            if batch <= n2:
                return s1 + (s2 - s1) * (batch - n1) / (n2 - n1)
        if len(points) == 1:
            return points[0][1]
        (n1, s1), (n2, s2) = points[-2:]
        return s2 + max((s2 - s1) / (n2 - n1), 0.0) * (batch - n2)


@dataclass
class AudioGate:
    limit: float  # 0: no gate
    frame_s: float  # seconds of audio in one of the family's codec frames
    # code2wav busy seconds per second of audio it made, over every stream.
    vocoder_busy: RecentMedian = field(default_factory=RecentMedian)
    _pace_by_count: dict[int, Pace] = field(default_factory=dict)
    _steps: StepProfile | None = None
    _latest_count: int = 0  # the talking count of the newest pace measurement (0: none yet)
    _known: list[tuple[int, float]] | None = None  # _measured(), until the next observation

    def profile(self, step_seconds: dict[int, float]) -> None:
        """The talker's decode step time by batch size, measured before serving."""
        self._steps = StepProfile.of(step_seconds)

    @property
    def step_profile(self) -> StepProfile | None:
        return self._steps

    def vocoded(self, busy_s: float, audio_s: float) -> None:
        if audio_s > 0:
            self.vocoder_busy.add(busy_s / audio_s, audio_s)

    def observe(self, talking: Sequence[float | None]) -> None:
        """Records the talker's pace at this number of talking streams (their measured seconds per frame), once
        each of them has a pace."""
        if talking and all(p is not None for p in talking):
            self._pace_by_count.setdefault(len(talking), Pace(alpha=0.2)).add(max(talking))
            self._latest_count = len(talking)
            self._known = None

    def _measured(self) -> list[tuple[int, float]]:
        """(talking count, pace) of every count measured, ascending (kept until the next observation: the gate asks
        on every orchestrator pass while requests wait)."""
        if self._known is None:
            self._known = sorted((n, p.value) for n, p in self._pace_by_count.items() if p.value is not None)
        return self._known

    def talker_pace(self, count: int) -> float | None:
        """The talker's expected seconds per frame with ``count`` talking streams; None before any measurement."""
        known = self._measured()
        if not known:
            return None
        latest = self._pace_by_count.get(self._latest_count)
        if self._steps is not None and latest is not None and latest.value is not None:
            return latest.value * self._steps.at(count) / self._steps.at(self._latest_count)
        if len(known) == 1:
            n, pace = known[0]
            return pace * (1 + MARGINAL_PRIOR * (count - n) / n)
        exact = dict(known).get(count)
        if exact is not None:
            return exact
        # Along the two largest counts measured: a saturating talker bends up, and its newest slope shows it.
        (n1, p1), (n2, p2) = known[-2:]
        return p2 + max((p2 - p1) / (n2 - n1), 0.0) * (count - n2)

    def rtf(self, talking: int, streams: int) -> float | None:
        """The pipeline's real-time factor with ``talking`` streams in the talker and ``streams`` in all (None
        until the talker has been measured)."""
        pace = self.talker_pace(max(talking, 1))
        if pace is None:
            return None
        return max(pace / self.frame_s, (self.vocoder_busy.value or 0.0) * streams)

    def admits(self, streams: Sequence[StreamLoad]) -> bool:
        """Whether one more audio stream may start now (:meth:`room`)."""
        return self.room(streams) >= 1

    def room(self, streams: Sequence[StreamLoad]) -> int:
        """How many more audio streams may start now, together (0: the next one waits).

        With no stream running, one: nothing is measured yet. Without a step profile: one stream past the largest
        count measured, so a burst ramps up one measured step at a time instead of trusting a long extrapolation.
        With one: as many as the profile predicts room for, up to as many as are talking (a burst doubles each
        round: the level the next round scales is measured with every running stream's load on the machine, the
        code2wav and thinker work that shares it with the talker among it, which the profile alone does not see).
        The streams of a round start together, so their prefills batch and slow the running streams once, not
        once per stream. While a stream is in its prefill (its load not measured yet) or a playing stream holds
        less than ``MIN_BUFFER_S`` of audio, one more starts only far below the limit (``PREFILL_HEADROOM``): a
        new stream's prefill slows every stream for a while."""
        if self.limit <= 0:
            return sys.maxsize
        if not streams:
            return 1
        talking, exposed = 0, False
        for s in streams:  # one walk: up to a batch of streams, on every pass while requests wait
            talking += s.talking
            exposed = exposed or s.exposed
        if self._steps is None and talking > max((n for n, _ in self._measured()), default=0):
            return 0  # streams not yet measured at this count: wait for them
        if exposed:
            predicted = self.rtf(talking + 1, len(streams) + 1)
            return int(predicted is not None and predicted * PREFILL_HEADROOM <= self.limit)
        group = max(talking, 1) if self._steps is not None else 1
        count = 0
        while count < group:
            predicted = self.rtf(talking + count + 1, len(streams) + count + 1)
            if predicted is None or predicted > self.limit:
                break
            count += 1
        return count
