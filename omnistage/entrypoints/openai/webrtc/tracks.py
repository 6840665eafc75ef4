"""The call's audio: the reply track the server plays, and the microphone track it listens to.

:class:`ReplyTrack` is what aiortc encodes to Opus: 20 ms frames of 24 kHz
PCM, paced by the clock, silence whenever nothing is queued (a WebRTC track
never pauses). ``clear`` drops what is queued, so a barge-in is silent from
the next frame. :func:`microphone_pcm` turns the browser's Opus (48 kHz,
decoded by aiortc) into mono float32 at the session's input rate.
"""

from __future__ import annotations

import asyncio
import fractions
import time
from collections.abc import AsyncIterator, Callable

import av
import numpy as np
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

RATE = 24_000  # the reply's rate (the session's output)
FRAME_SAMPLES = RATE // 50  # 20 ms, Opus' usual packet
_TIME_BASE = fractions.Fraction(1, RATE)


class ReplyTrack(MediaStreamTrack):
    kind = "audio"

    def __init__(self) -> None:
        super().__init__()
        self._pending = np.zeros(0, np.int16)
        self._start: float | None = None
        self._sent = 0  # samples sent so far: the next frame's pts
        self.frames_played = 0  # frames that carried reply audio (not silence)

    @property
    def queued_samples(self) -> int:
        return len(self._pending)

    def push(self, samples: np.ndarray) -> None:
        """Reply audio (float32 at 24 kHz), played after what is queued."""
        pcm = (np.clip(samples, -1.0, 1.0) * 32767).astype(np.int16)
        self._pending = np.concatenate([self._pending, pcm])

    def clear(self) -> int:
        """Drops what is queued (barge-in); how many samples were dropped."""
        dropped, self._pending = len(self._pending), np.zeros(0, np.int16)
        return dropped

    async def recv(self) -> av.AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        if self._start is None:
            self._start = time.monotonic()
        else:  # paced by the wall clock: the peer's jitter buffer expects real time, not a burst
            await asyncio.sleep(max(0.0, self._start + self._sent / RATE - time.monotonic()))
        chunk = self._pending[:FRAME_SAMPLES]
        self._pending = self._pending[FRAME_SAMPLES:]
        if len(chunk):
            self.frames_played += 1
        frame = av.AudioFrame.from_ndarray(np.pad(chunk, (0, FRAME_SAMPLES - len(chunk)))[None, :],
                                           format="s16", layout="mono")
        frame.sample_rate, frame.time_base, frame.pts = RATE, _TIME_BASE, self._sent
        self._sent += FRAME_SAMPLES
        return frame


async def microphone_pcm(track: MediaStreamTrack, rate: Callable[[], int]) -> AsyncIterator[tuple[np.ndarray, int]]:
    """The remote audio track as mono float32 pieces at ``rate()`` (the session's input rate, read per frame: a
    ``session.update`` may change it), until it ends. One resampler runs across frames: resampling each 20 ms
    piece alone would click at every edge."""
    resampler, current = None, 0
    while True:
        try:
            frame = await track.recv()
        except MediaStreamError:
            return
        if resampler is None or rate() != current:
            current = rate()
            resampler = av.AudioResampler(format="s16", layout="mono", rate=current)
        for out in resampler.resample(frame):
            yield out.to_ndarray().reshape(-1).astype(np.float32) / 32768.0, current
