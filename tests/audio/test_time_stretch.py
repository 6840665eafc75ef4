"""omnistage.audio.time_stretch: WSOLA keeps the pitch, scales the duration, streams like the whole signal."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from omnistage.audio import TimeStretcher, stretch
from tests.audio.signals import peak_hz, tone

RATE = 24000
SPEEDS = [0.25, 0.5, 0.8, 1.25, 2.0, 3.3, 4.0]


def _rms(x: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.square(x, dtype=np.float64))))


@pytest.mark.parametrize("speed", SPEEDS)
def test_duration_scales_and_pitch_and_loudness_stay(speed: float) -> None:
    source = tone(440, 1.0, RATE)
    out = stretch(source, speed)
    # The output length is exact by construction; the tolerance is one sample for rounding.
    assert abs(len(out) - len(source) / speed) <= 1
    assert abs(peak_hz(out, RATE) - 440) < 3  # FFT bin width is RATE / len(out) <= 2.7 Hz here
    middle = out[len(out) // 8: -len(out) // 8]  # no edge effects counted
    assert abs(_rms(middle) / _rms(source) - 1) < 0.05


@pytest.mark.parametrize("speed", [0.5, 2.0])
def test_time_order_is_kept(speed: float) -> None:
    """A 300 Hz half then a 600 Hz half: each half of the output has its own pitch (the content is not mixed)."""
    source = np.concatenate([tone(300, 0.5, RATE), tone(600, 0.5, RATE)])
    out = stretch(source, speed)
    quarter = len(out) // 4
    assert abs(peak_hz(out[:quarter * 2 - quarter // 2], RATE) - 300) < 5
    assert abs(peak_hz(out[quarter * 2 + quarter // 2:], RATE) - 600) < 5


def test_speed_one_is_the_identity() -> None:
    source = tone(440, 0.3, RATE) + np.linspace(-0.1, 0.1, int(0.3 * RATE), dtype=np.float32)
    stretcher = TimeStretcher(1.0)
    parts = [stretcher.feed(c) for c in np.array_split(source, 5)] + [stretcher.finish()]
    np.testing.assert_array_equal(np.concatenate(parts), source)


@pytest.mark.parametrize("speed", [0.25, 0.7, 1.5, 4.0])
def test_chunked_equals_whole(speed: float) -> None:
    """Chunks of any size, as a streamed response feeds them, give the whole signal's output."""
    rng = np.random.default_rng(7)
    source = (tone(220, 1.2, RATE) + 0.05 * rng.standard_normal(int(1.2 * RATE))).astype(np.float32)
    whole = stretch(source, speed)
    stretcher = TimeStretcher(speed)
    parts, start = [], 0
    while start < len(source):
        size = int(rng.integers(1, 4000))
        parts.append(stretcher.feed(source[start:start + size]))
        start += size
    parts.append(stretcher.finish())
    assert sum(1 for p in parts[:-1] if p.size) >= 5, "output should leave before the end"
    # The same frames and searches on the same samples; FFT sizes match, so only float rounding could differ.
    torch.testing.assert_close(torch.from_numpy(np.concatenate(parts)), torch.from_numpy(whole), rtol=0, atol=1e-6)


def test_short_and_empty_inputs() -> None:
    assert stretch(np.zeros(0, np.float32), 2.0).size == 0
    assert len(stretch(tone(440, 0.01, RATE), 0.5)) == 480


def test_out_of_range_speed_and_feed_after_finish() -> None:
    for bad in (0.2, 4.5):
        with pytest.raises(ValueError, match="speed"):
            TimeStretcher(bad)
    stretcher = TimeStretcher(2.0)
    stretcher.finish()
    with pytest.raises(RuntimeError):
        stretcher.feed(np.zeros(4, np.float32))
