"""Admission that protects running streams: a new audio request waits while adding it would push the pipeline
past real time.

Every running stream needs one second of audio per wall second. The pipeline keeps up while each stage makes
audio faster than that for all of them: the talker while its wall time per frame of a stream stays under the
frame's 80 ms (a talker step serves every stream, so one stream's pace is the stage's), code2wav while its busy
time per second of audio, times the number of streams, stays under one second. The larger of the two is the
pipeline's real-time factor at this load. Starting one more stream past ``limit`` would slow every stream into
underruns; instead it waits (its caller's admission ticket keeps counting, so ``--max-queued-requests`` still
bounds the queue with 429s).

The factor one more stream would cause is predicted from what was measured at each number of streams (a
moving average per count): measured there, or extrapolated along the last two counts, or, with one count
only, proportionally (a stage that does not batch). With no stream running, a request always starts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from omnistage.pipeline.chunk_planner import Pace
from omnistage.pipeline.playback import FRAME_S


@dataclass(frozen=True)
class StreamLoad:
    """What one running stream measured: wall seconds per talker frame (None until known)."""

    talker_frame_s: float | None


@dataclass
class AudioGate:
    limit: float  # 0: no gate
    # code2wav busy seconds per second of audio it made, over every stream.
    vocoder_busy: Pace = field(default_factory=lambda: Pace(alpha=0.1))
    _by_count: dict[int, Pace] = field(default_factory=dict)

    def vocoded(self, busy_s: float, audio_s: float) -> None:
        if audio_s > 0:
            self.vocoder_busy.add(busy_s / audio_s)

    def rtf(self, streams: Sequence[StreamLoad]) -> float | None:
        """The pipeline's real-time factor with ``streams`` running; None until the talker's pace is known."""
        paces = [s.talker_frame_s for s in streams if s.talker_frame_s is not None]
        if not paces:
            return None
        vocoder = (self.vocoder_busy.value or 0.0) * len(streams)
        return max(max(paces) / FRAME_S, vocoder)

    def observe(self, streams: Sequence[StreamLoad]) -> None:
        """Records the factor measured at this number of streams (called as measurements arrive)."""
        rtf = self.rtf(streams)
        if rtf is not None:
            self._by_count.setdefault(len(streams), Pace(alpha=0.2)).add(rtf)

    def predict(self, count: int) -> float | None:
        """The factor expected with ``count`` streams."""
        known = sorted((n, p.value) for n, p in self._by_count.items() if p.value is not None)
        exact = dict(known).get(count)
        if exact is not None or not known:
            return exact
        below = [(n, v) for n, v in known if n < count]
        if len(below) >= 2:
            (n1, v1), (n2, v2) = below[-2], below[-1]
            return v2 + (v2 - v1) / (n2 - n1) * (count - n2)
        n, v = below[-1] if below else known[0]
        return v * count / n

    def admits(self, streams: Sequence[StreamLoad]) -> bool:
        """Whether one more audio stream may start now."""
        if self.limit <= 0 or not streams:
            return True
        now = self.rtf(streams)
        if now is None:
            return False  # the running streams' pace is not known yet: wait for it
        predicted = self.predict(len(streams) + 1)
        return now <= self.limit and (predicted is None or predicted <= self.limit)
