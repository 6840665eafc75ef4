"""Admission that protects running streams: a new audio request waits while adding it would push the pipeline
past real time.

Every running stream needs one second of audio per wall second. The pipeline keeps up while each stage makes
audio faster than that for all of them: the talker while its wall time per frame of a stream stays under the
frame's 80 ms (a talker step serves every stream, so one stream's pace is the stage's), code2wav while its busy
time per second of audio, times the number of streams, stays under one second. The larger of the two is the
pipeline's real-time factor at this load. Starting one more stream past ``limit`` would slow every stream into
underruns; instead it waits (its caller's admission ticket keeps counting, so ``--max-queued-requests`` still
bounds the queue with 429s).

What one more stream costs is predicted per stage. Code2wav's load grows with the streams (its measured busy
time per audio second, times their number). The talker batches: a step reads its weights once for every
stream, so its pace grows by far less than a stream's share. Its pace is measured at each number of streams
(a moving average per count, recorded while every talking stream has a measured pace) and extrapolated along
the line through the two largest counts measured (a saturating talker bends up); with one count only, one more
stream is taken to add ``MARGINAL_PRIOR`` of the pace (a batched stage), which the next measurement corrects.
Extrapolation goes one stream past what was measured, never more: a burst of requests ramps up one measured count
at a time. With no stream running, a request always starts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from omnistage.pipeline.chunk_planner import Pace
from omnistage.pipeline.playback import FRAME_S

MARGINAL_PRIOR = 0.25  # a stream's added talker pace, as a share of the pace, until two counts are measured


@dataclass(frozen=True)
class StreamLoad:
    """One stream in flight: whether its talker still runs, and its measured wall seconds per talker frame."""

    talking: bool
    talker_frame_s: float | None = None


@dataclass
class AudioGate:
    limit: float  # 0: no gate
    # code2wav busy seconds per second of audio it made, over every stream.
    vocoder_busy: Pace = field(default_factory=lambda: Pace(alpha=0.1))
    _pace_by_count: dict[int, Pace] = field(default_factory=dict)

    def vocoded(self, busy_s: float, audio_s: float) -> None:
        if audio_s > 0:
            self.vocoder_busy.add(busy_s / audio_s)

    def observe(self, streams: Sequence[StreamLoad]) -> None:
        """Records the talker's pace at this number of talking streams, once each of them has a pace."""
        talking = [s.talker_frame_s for s in streams if s.talking]
        if talking and all(p is not None for p in talking):
            self._pace_by_count.setdefault(len(talking), Pace(alpha=0.2)).add(max(talking))

    def talker_pace(self, count: int) -> float | None:
        """The talker's expected seconds per frame with ``count`` talking streams; None before any measurement."""
        known = sorted((n, p.value) for n, p in self._pace_by_count.items() if p.value is not None)
        if not known:
            return None
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
        return max(pace / FRAME_S, (self.vocoder_busy.value or 0.0) * streams)

    def admits(self, streams: Sequence[StreamLoad]) -> bool:
        """Whether one more audio stream may start now: at most one stream past the largest count measured, so
        a burst of requests ramps up one measured step at a time instead of trusting a long extrapolation."""
        if self.limit <= 0 or not streams:
            return True
        talking = sum(s.talking for s in streams)
        measured = max((n for n, p in self._pace_by_count.items() if p.value is not None), default=0)
        if talking > measured:
            return False  # streams not yet measured at this count: wait for them
        predicted = self.rtf(talking + 1, len(streams) + 1)
        return predicted is not None and predicted <= self.limit
