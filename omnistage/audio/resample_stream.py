"""Resampling audio that arrives in pieces: a polyphase FIR whose filter state carries across pieces.

``resample`` (scipy's ``resample_poly``) sees one whole signal; cut into pieces
it would ring at every cut. A detector that watches a live stream (the realtime
VAD) needs the stream's own samples at its rate, piece by piece, so here the
signal is zero-stuffed by ``up``, low-passed by one FIR (``lfilter`` keeps its
state between calls) and every ``down``-th sample is kept, counting from the
start of the stream: the pieces' outputs joined are the whole's output.
The filter delays the output by half its length (``delay`` output samples,
about a millisecond): nothing a turn detector at 32 ms resolution notices.
"""

from __future__ import annotations

from math import gcd

import numpy as np
from scipy.signal import firwin, lfilter

TAPS_PER_PHASE = 16  # filter length per output phase: ~60 dB stop band, a few µs a sample


class StreamResampler:
    def __init__(self, rate_in: int, rate_out: int) -> None:
        g = gcd(rate_in, rate_out)
        self.up, self.down = rate_out // g, rate_in // g
        self._taps = np.zeros(0, np.float64)
        if self.up != self.down:
            n = TAPS_PER_PHASE * max(self.up, self.down) + 1
            self._taps = firwin(n, 1.0 / max(self.up, self.down)) * self.up  # up: zero-stuffing's lost gain
        self.reset()

    @property
    def delay(self) -> int:
        """The filter's group delay in output samples."""
        return (len(self._taps) - 1) // 2 // self.down if len(self._taps) else 0

    def reset(self) -> None:
        self._state = np.zeros(max(len(self._taps) - 1, 0), np.float64)
        self._stuffed = 0  # upsampled samples produced so far: where the next kept sample falls

    def __call__(self, samples: np.ndarray) -> np.ndarray:
        samples = np.asarray(samples, dtype=np.float32)
        if self.up == self.down:
            return samples
        stuffed = np.zeros(len(samples) * self.up, np.float64)
        stuffed[:: self.up] = samples
        filtered, self._state = lfilter(self._taps, 1.0, stuffed, zi=self._state)
        first = -self._stuffed % self.down
        self._stuffed += len(stuffed)
        return filtered[first:: self.down].astype(np.float32)
