"""An upload cut into the pieces the thinker writes down one by one: windows of at most 30 s, each cut at the
quietest moment near its end.

Why fixed windows rather than the realtime endpoint's VAD: a file's segments must cover it end to end, so a
segment's ``start``/``end`` are true boundaries in the audio and no sample goes untranscribed because a level
threshold misjudged a quiet speaker; a VAD tuned for live turn-taking would drop what it called silence.
Why 30 s: the thinker's audio encoder is Whisper's, trained on windows of up to 30 s, and a bounded piece
keeps each request's prompt and completion short. Why the quietest 20 ms frame of the window's last 5 s:
a cut there rarely falls inside a word. Audio of up to 30 s is one segment.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from omnistage.audio.vad import FRAME_MS, frame_dbfs

SEGMENT_SECONDS = 30.0
SEARCH_SECONDS = 5.0  # how far before a window's end its cut may move to find a quiet frame


@dataclass(frozen=True)
class Segment:
    """Samples ``[start, end)`` of the audio."""

    start: int
    end: int

    def seconds(self, rate: int) -> tuple[float, float]:
        return self.start / rate, self.end / rate


def _quietest_cut(audio: np.ndarray, lo: int, hi: int, frame: int) -> int:
    """The sample at the middle of the quietest whole frame in ``[lo, hi)`` (the last one on ties)."""
    frames = (hi - lo) // frame
    if frames < 1:
        return hi
    levels = frame_dbfs(audio[lo:lo + frames * frame].reshape(frames, frame))
    best = frames - 1 - int(np.argmin(levels[::-1]))
    return lo + best * frame + frame // 2


def split(audio: np.ndarray, rate: int, max_seconds: float = SEGMENT_SECONDS,
          search_seconds: float = SEARCH_SECONDS) -> list[Segment]:
    """Contiguous segments covering ``audio`` (empty audio: none), each at most ``max_seconds`` long."""
    window, search = int(max_seconds * rate), int(min(search_seconds, max_seconds / 2) * rate)
    frame = max(1, rate * FRAME_MS // 1000)
    segments: list[Segment] = []
    start = 0
    while start < len(audio):
        end = start + window
        if end < len(audio):
            end = _quietest_cut(audio, end - search, end, frame)
        end = min(end, len(audio))
        segments.append(Segment(start, end))
        start = end
    return segments
