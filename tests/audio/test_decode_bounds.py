"""omnistage.audio.decode under a bound: audio whose header gives no length (a streaming FLAC, a WAV with 'unknown'
sizes, an MP3 read through FFmpeg) is decoded in pieces and refused as soon as the decoded samples (frames x
channels) or seconds pass the bound, long before the whole file is decoded; under the bound it decodes to what an
unbounded decoder reads."""

from __future__ import annotations

import io

import numpy as np
import pytest
import soundfile as sf
import torch

from omnistage.audio import AudioTooLargeError, AudioTooLongError, decode_audio
from tests.audio.signals import flac_without_length, mp3_bytes, soundfile_bytes, tone, wav_with_bogus_sizes

RATE, CHANNELS, SECONDS = 48_000, 8, 20.0


@pytest.fixture(scope="module")
def eight_channels() -> np.ndarray:
    return tone(440, SECONDS, RATE, channels=CHANNELS)


class Pieces:
    """A checkpoint that counts the pieces decoded before the decoder stopped."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self) -> None:
        self.count += 1


@pytest.mark.parametrize("make,fmt", [(flac_without_length, "flac"), (wav_with_bogus_sizes, "wav"),
                                      (flac_without_length, None)])
def test_a_header_without_a_length_is_stopped_at_the_samples_bound(make, fmt, eight_channels: np.ndarray) -> None:
    data = make(eight_channels, RATE)
    if make is flac_without_length:
        assert sf.info(io.BytesIO(data)).frames == 2**63 - 1  # libsndfile does not know the length
    whole = Pieces()
    decode_audio(data, fmt, checkpoint=whole)  # unbounded: every piece
    bound = 2 * RATE * CHANNELS  # two seconds of 8 channels
    stopped = Pieces()
    with pytest.raises(AudioTooLargeError, match=f"the limit is {bound}"):
        decode_audio(data, fmt, checkpoint=stopped, max_samples=bound)
    assert stopped.count < whole.count / 5, (stopped.count, whole.count)  # stopped near 2 s of 20, not after


def test_the_seconds_bound_stops_a_header_without_a_length(eight_channels: np.ndarray) -> None:
    pieces = Pieces()
    with pytest.raises(AudioTooLongError, match="the limit is 3 s"):
        decode_audio(flac_without_length(eight_channels, RATE), "flac", max_seconds=3.0, checkpoint=pieces)
    whole = Pieces()
    decode_audio(flac_without_length(eight_channels, RATE), "flac", checkpoint=whole)
    assert pieces.count < whole.count / 5, (pieces.count, whole.count)


def test_ffmpeg_decoding_is_stopped_at_the_samples_bound() -> None:
    data = mp3_bytes(tone(440, SECONDS, RATE), RATE)
    whole, stopped = Pieces(), Pieces()
    decode_audio(data, "mp3", checkpoint=whole)
    with pytest.raises(AudioTooLargeError, match="frames x 1 channels"):
        decode_audio(data, "mp3", checkpoint=stopped, max_samples=RATE)  # one second
    assert stopped.count < whole.count / 10, (stopped.count, whole.count)


@pytest.mark.parametrize("make,fmt", [(flac_without_length, "FLAC"), (wav_with_bogus_sizes, "WAV")])
def test_under_the_bound_the_pieces_are_the_whole(make, fmt: str, eight_channels: np.ndarray) -> None:
    """Decoded in pieces and downmixed per piece: the samples libsndfile reads in one go from the same PCM in a
    file with honest sizes, averaged over the channels."""
    whole = sf.read(io.BytesIO(soundfile_bytes(eight_channels, RATE, fmt)), dtype="float32", always_2d=True)[0]
    got = decode_audio(make(eight_channels, RATE), fmt.lower(), max_samples=int(SECONDS * RATE * CHANNELS))
    assert got.sample_rate == RATE
    expected = torch.from_numpy(whole.mean(axis=1, dtype=np.float32))
    torch.testing.assert_close(torch.from_numpy(got.samples), expected, atol=1e-7, rtol=0)  # float32 means
