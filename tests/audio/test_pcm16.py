"""PCM16 as base64 in one C pass: the same bytes as numpy's conversion and binascii's base64, for every length."""

from __future__ import annotations

import base64
import shutil
import warnings

import numpy as np
import pytest

from omnistage.audio import AudioFormat, StreamingAudioEncoder
from omnistage.audio.pcm16 import _LIBRARY, encoded_size, float_to_pcm16, pcm16_base64

LENGTHS = [0, 1, 2, 3, 4, 5, 6, 7, 100, 1535, 1536, 1537, 3072, 3074, 21001]


def _samples(n: int, seed: int = 0) -> np.ndarray:
    x = (np.random.default_rng(seed).standard_normal(n) * 0.7).astype(np.float32)  # some past +-1: clipped
    edges = np.array([-np.inf, np.inf, -1.0, 1.0, -0.99999, np.nan, 2.5, -3.0, 1e-30, -0.0], np.float32)
    x[:min(n, len(edges))] = edges[:n]
    return x


@pytest.mark.parametrize("n", LENGTHS)
def test_the_c_pass_writes_what_numpy_and_base64_write(n: int) -> None:
    x = _samples(n, n)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # numpy warns casting NaN (it writes 0, as the C pass does)
        want = b"<" + base64.b64encode(float_to_pcm16(x)) + b">"
        assert pcm16_base64(x, b"<", b">", native=False) == want
    assert pcm16_base64(x, b"<", b">") == want
    assert len(want) == encoded_size(n) + 2


@pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None, reason="no C compiler")
def test_the_c_pass_is_built_where_a_compiler_is() -> None:
    assert _LIBRARY.load() is not None


@pytest.mark.parametrize("source_rate", [24000, 16000])
def test_a_streamed_pcm16_pieces_base64_is_its_feeds(source_rate: int) -> None:
    """``feed_base64`` gives what base64 of ``feed`` gives, piece by piece, resampled or not."""
    plain = StreamingAudioEncoder(AudioFormat.PCM16, source_rate)
    fused = StreamingAudioEncoder(AudioFormat.PCM16, source_rate)
    for i, n in enumerate([480, 1, 0, 2000, 7]):
        x = np.sin(np.arange(n) / (3 + i)).astype(np.float32)
        data = plain.feed(x)
        want = b"h" + base64.b64encode(data) + b"t" if data else b""
        assert fused.feed_base64(x, b"h", b"t") == want


def test_a_compressed_pieces_base64_is_its_feeds() -> None:
    plain, fused = StreamingAudioEncoder(AudioFormat.MP3, 24000), StreamingAudioEncoder(AudioFormat.MP3, 24000)
    x = np.sin(np.arange(24000) / 5).astype(np.float32)
    data = plain.feed(x)
    assert data and fused.feed_base64(x, b"h", b"t") == b"h" + base64.b64encode(data) + b"t"
