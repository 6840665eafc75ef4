"""Resampling audio that arrives in pieces: a polyphase FIR whose input history carries across pieces.

``resample`` (scipy's ``resample_poly``) sees one whole signal; cut into pieces
it would ring at every cut. A detector that watches a live stream (the realtime
VAD) needs the stream's own samples at its rate, piece by piece, and an API
encoder turns a model's audio into the rate its wire format takes (a 44.1 kHz
decoder's chunks as 24 kHz PCM) as each chunk arrives. The signal is, in effect,
zero-stuffed by ``up``, low-passed by one causal FIR and every ``down``-th sample
kept, counting from the start of the stream: the pieces' outputs joined are the
whole's output. Only the taps that meet a real sample are computed (each output
phase's own ``taps_per_phase`` taps over the newest inputs), so the cost is per
output sample, not per zero-stuffed one. The filter delays the output by half its
length (``delay`` output samples, about a millisecond).
"""

from __future__ import annotations

from math import gcd

import numpy as np
from scipy.signal import firwin

TAPS_PER_PHASE = 16  # filter length per output phase: ~60 dB stop band, a few µs a sample
_NO_TAPS = np.zeros(0, np.float64)
_NO_PHASES = np.zeros((0, 0), np.float64)


class StreamResampler:
    def __init__(self, rate_in: int, rate_out: int) -> None:
        g = gcd(rate_in, rate_out)
        self.up, self.down = rate_out // g, rate_in // g
        self._taps = _NO_TAPS
        if self.up == self.down:  # the identity (most streams): no filter to design, nothing to keep
            self._span, self._phases = 0, _NO_PHASES
            self._history, self._inputs, self._outputs = _NO_TAPS, 0, 0
            return
        n = TAPS_PER_PHASE * max(self.up, self.down) + 1
        self._taps = firwin(n, 1.0 / max(self.up, self.down)) * self.up  # up: zero-stuffing's lost gain
        # Phase p's taps: h[p], h[p + up], h[p + 2 up], ... (zero past the filter's end).
        self._span = -(-len(self._taps) // self.up)
        phases = np.zeros(self.up * self._span, np.float64)
        phases[:len(self._taps)] = self._taps
        self._phases = phases.reshape(self._span, self.up).T.copy()
        self.reset()

    @property
    def delay(self) -> int:
        """The filter's group delay in output samples."""
        return (len(self._taps) - 1) // 2 // self.down if len(self._taps) else 0

    def reset(self) -> None:
        self._history = np.zeros(self._span, np.float64)  # the newest inputs, the filter's reach
        self._inputs = 0  # input samples consumed so far
        self._outputs = 0  # output samples produced so far

    def __call__(self, samples: np.ndarray) -> np.ndarray:
        samples = np.asarray(samples, dtype=np.float32).reshape(-1)
        if self.up == self.down:
            return samples
        start = self._inputs - self._span  # the stream index of ``buffer[0]``
        buffer = np.concatenate([self._history, samples.astype(np.float64)])
        self._inputs += len(samples)
        end = -(-self._inputs * self.up // self.down)  # outputs whose stuffed index lies within the input so far
        n = np.arange(self._outputs, end, dtype=np.int64)
        self._outputs = end
        self._history = buffer[len(buffer) - self._span:]
        if not len(n):
            return np.zeros(0, np.float32)
        stuffed = n * self.down
        newest = stuffed // self.up  # the newest input each output reads
        rows = newest[:, None] - np.arange(self._span)[None, :] - start
        out = np.einsum("ij,ij->i", buffer[rows], self._phases[stuffed % self.up])
        return out.astype(np.float32)
