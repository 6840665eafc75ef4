"""Time-stretching speech without changing its pitch (WSOLA), whole or chunk by chunk.

WSOLA (waveform-similarity overlap-add): output frames of ``FRAME`` samples are
laid down every ``hop`` samples under a Hann window (periodic, so windows at half
overlap sum to one); frame k is read from the input near ``k * hop * speed``,
shifted by up to ``SEARCH`` samples to where the input best continues the
previous frame (cross-correlation). Waveform periods are copied, not resampled,
so the pitch stays and only the duration changes: ``len(out) == round(len(in) / speed)``.

``TimeStretcher`` keeps the input it still needs and the output not yet complete
between ``feed`` calls, so chunks fed one by one give the same samples as the
whole signal fed at once: a streamed response is stretched exactly like a whole one.
"""

from __future__ import annotations

import math

import numpy as np

MIN_SPEED, MAX_SPEED = 0.25, 4.0  # OpenAI's range for /v1/audio/speech
FRAME = 1024  # ~43 ms at 24 kHz: several pitch periods of any voice
SEARCH = 256  # ±10.7 ms at 24 kHz: at least one period of a voice down to ~94 Hz
_WINDOW = (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(FRAME) / FRAME)).astype(np.float32)


class TimeStretcher:
    """Stretches float32 mono audio by 1/``speed`` (2.0: half as long); ``speed == 1`` passes samples through."""

    def __init__(self, speed: float) -> None:
        if not MIN_SPEED <= speed <= MAX_SPEED:
            raise ValueError(f"speed must be within {MIN_SPEED}..{MAX_SPEED}, got {speed}")
        self.speed = speed
        self._hop = FRAME // 2  # synthesis hop
        self._fed = 0  # input samples received
        self._emitted = 0  # output samples returned
        self._finished = False
        # The input is read as if preceded by half a frame of silence, so frame 0 is centred on sample 0 and the
        # first half-frame of output (its fade-in) is dropped: output sample t then stands for input t * speed.
        self._inp = np.zeros(self._hop, np.float32)
        self._inp_base = -self._hop  # input index of self._inp[0]
        self._out = np.zeros(FRAME, np.float32)  # overlap-add accumulator from raw output index self._out_base
        self._out_base = 0
        self._frame = 0  # next output frame
        self._prev_start: int | None = None  # input index (padded) where the previous frame was read

    def feed(self, samples: np.ndarray) -> np.ndarray:
        if self._finished:
            raise RuntimeError("feed() after finish()")
        chunk = np.asarray(samples, dtype=np.float32).reshape(-1)
        if self.speed == 1.0:
            return chunk
        self._fed += chunk.size
        self._inp = np.concatenate([self._inp, chunk])
        self._run(final_len=None)
        return self._take(limit=None)

    def finish(self) -> np.ndarray:
        """The rest of the output; the total is ``round(input / speed)`` samples."""
        if self._finished:
            return np.zeros(0, np.float32)
        self._finished = True
        if self.speed == 1.0:
            return np.zeros(0, np.float32)
        total = round(self._fed / self.speed)
        self._run(final_len=total)
        return self._take(limit=total)

    # -- frames ---------------------------------------------------------------------------------------------

    def _run(self, final_len: int | None) -> None:
        """Lays down every frame the input allows; with ``final_len``, pads with silence until the output is done."""
        # Output sample t is complete once every frame that covers it (raw index t + hop) has been laid down.
        while final_len is None or self._frame * self._hop - self._hop < final_len:
            target = self._target(self._frame)
            natural = None if self._prev_start is None else self._prev_start + self._hop
            need = max(target + SEARCH, natural or 0) + FRAME
            have = self._inp_base + self._inp.size
            if need > have:
                if final_len is None:
                    return
                self._inp = np.concatenate([self._inp, np.zeros(need - have, np.float32)])
            start = self._best_start(target, natural)
            self._add(self._read(start, FRAME) * _WINDOW)
            self._prev_start = start
            self._frame += 1
            self._drop_input(min(self._target(self._frame) - SEARCH, start + self._hop))

    def _target(self, frame: int) -> int:
        """Input index where frame ``frame`` is read before the search: centred on ``frame * hop * speed``."""
        return round(frame * self._hop * self.speed) - self._hop

    def _best_start(self, target: int, natural: int | None) -> int:
        """Where near ``target`` the input looks most like ``natural`` (the previous frame's continuation)."""
        lo = max(target - SEARCH, self._inp_base)
        if natural is None:
            return max(target, lo)
        hi = target + SEARCH
        template = self._read(natural, FRAME)
        region = self._read(lo, hi - lo + FRAME)
        return lo + int(np.argmax(_correlate(region, template)))

    def _read(self, start: int, length: int) -> np.ndarray:
        offset = start - self._inp_base
        return self._inp[offset:offset + length]

    def _drop_input(self, keep_from: int) -> None:
        cut = keep_from - self._inp_base
        if cut > 0:
            self._inp = self._inp[cut:]
            self._inp_base = keep_from

    # -- output ---------------------------------------------------------------------------------------------

    def _add(self, frame: np.ndarray) -> None:
        offset = self._frame * self._hop - self._out_base
        if offset + FRAME > self._out.size:  # grown geometrically: a whole signal fed at once stays linear
            grown = np.zeros(max(offset + FRAME, 2 * self._out.size), np.float32)
            grown[:self._out.size] = self._out
            self._out = grown
        self._out[offset:offset + FRAME] += frame

    def _take(self, limit: int | None) -> np.ndarray:
        """Output no later frame will add to (all up to ``limit`` at the end), less the leading half-frame."""
        complete = self._frame * self._hop - self._hop  # output index up to which every frame has been added
        end = complete if limit is None else limit
        if end <= self._emitted:
            return np.zeros(0, np.float32)
        lo, hi = self._emitted + self._hop - self._out_base, end + self._hop - self._out_base
        out = self._out[lo:hi].copy()
        self._emitted = end
        self._out = self._out[hi:]
        self._out_base += hi
        return out


def _correlate(region: np.ndarray, template: np.ndarray) -> np.ndarray:
    """``c[i] = sum(region[i:i+len(template)] * template)`` for every full overlap, by FFT."""
    lags = region.size - template.size + 1
    size = 1 << math.ceil(math.log2(region.size + template.size))
    spectrum = np.fft.rfft(region, size) * np.conj(np.fft.rfft(template, size))
    return np.fft.irfft(spectrum, size)[:lags]


def stretch(samples: np.ndarray, speed: float) -> np.ndarray:
    """The whole signal at once: ``round(len(samples) / speed)`` samples, same pitch."""
    stretcher = TimeStretcher(speed)
    return np.concatenate([stretcher.feed(samples), stretcher.finish()])
