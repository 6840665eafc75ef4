"""omnistage.audio: decoding client audio to 16 kHz mono, encoding every output format, streaming encoding."""

from __future__ import annotations

import io

import numpy as np
import pytest
import soundfile as sf

from omnistage.audio import (
    AudioDecodeError,
    AudioFormat,
    AudioTooLongError,
    StreamingAudioEncoder,
    decode_audio,
    encode_audio,
    load_audio,
    resample,
    to_mono,
)
from tests.audio.signals import av_decode, mp3_bytes, peak_hz, soundfile_bytes, tone


@pytest.mark.parametrize("fmt", ["wav", "flac", None])
def test_soundfile_formats_decode_downmix_and_resample_to_16k(fmt: str | None) -> None:
    stereo = tone(440, 1.0, 44100, channels=2)
    data = soundfile_bytes(stereo, 44100, "FLAC" if fmt == "flac" else "WAV")
    audio = load_audio(data, fmt, 16000)
    assert audio.dtype == np.float32 and audio.ndim == 1
    assert len(audio) == 16000
    assert abs(peak_hz(audio, 16000) - 440) < 2


def test_mp3_decodes_through_pyav() -> None:
    audio = load_audio(mp3_bytes(tone(440, 1.0, 24000), 24000), "mp3", 16000)
    # MP3 pads with encoder delay; the length is within one frame of the original.
    assert abs(len(audio) - 16000) < 1200
    assert abs(peak_hz(audio, 16000) - 440) < 3


def test_unknown_container_falls_back_to_ffmpeg() -> None:
    decoded = decode_audio(mp3_bytes(tone(440, 0.5, 24000), 24000), None)
    assert decoded.sample_rate == 24000 and decoded.samples.size > 0


@pytest.mark.parametrize("fmt", ["wav", "mp3", None])
def test_garbage_is_a_decode_error(fmt: str | None) -> None:
    with pytest.raises(AudioDecodeError):
        decode_audio(b"not audio at all" * 20, fmt)


def test_empty_bytes_are_a_decode_error() -> None:
    with pytest.raises(AudioDecodeError):
        decode_audio(b"", "wav")


@pytest.mark.parametrize("data_fmt", ["wav", "mp3"])
def test_too_long_audio_is_refused(data_fmt: str) -> None:
    samples = tone(440, 2.0, 16000)
    data = soundfile_bytes(samples, 16000) if data_fmt == "wav" else mp3_bytes(samples, 16000)
    with pytest.raises(AudioTooLongError):
        decode_audio(data, data_fmt, max_seconds=1.0)


def test_to_mono_and_resample() -> None:
    stereo = np.stack([np.ones(10, np.float32), -np.ones(10, np.float32)], axis=1)
    assert np.allclose(to_mono(stereo), 0.0)
    assert resample(np.zeros(48000, np.float32), 48000, 16000).shape == (16000,)
    same = np.arange(5, dtype=np.float32)
    assert np.array_equal(resample(same, 16000, 16000), same)


@pytest.mark.parametrize("fmt", list(AudioFormat))
def test_encode_each_format_round_trips(fmt: AudioFormat) -> None:
    samples = tone(440, 1.0, 24000)
    data = encode_audio(samples, 24000, fmt)
    if fmt is AudioFormat.PCM16:
        decoded, rate = np.frombuffer(data, "<i2").astype(np.float32) / 32767, 24000
        assert len(decoded) == 24000
    elif fmt in (AudioFormat.WAV, AudioFormat.FLAC):
        decoded, rate = sf.read(io.BytesIO(data), dtype="float32")
        assert rate == 24000 and len(decoded) == 24000
    else:
        decoded, rate = av_decode(data)
    assert abs(peak_hz(decoded, rate) - 440) < 5


@pytest.mark.parametrize("fmt", [f for f in AudioFormat if f is not AudioFormat.FLAC])
def test_streamed_pieces_concatenate_to_one_valid_file(fmt: AudioFormat) -> None:
    encoder = StreamingAudioEncoder(fmt, 24000)
    samples = tone(440, 1.0, 24000)
    pieces = [encoder.feed(chunk) for chunk in np.array_split(samples, 7)] + [encoder.finish()]
    assert sum(1 for p in pieces[:-1] if p) >= 3, "audio should leave the encoder before the end"
    data = b"".join(pieces)
    if fmt is AudioFormat.PCM16:
        assert len(data) == 2 * 24000
        return
    decoded, rate = sf.read(io.BytesIO(data), dtype="float32") if fmt is AudioFormat.WAV else av_decode(data)
    assert len(decoded) >= 0.95 * len(samples) * rate / 24000
    assert abs(peak_hz(decoded, rate) - 440) < 5


def test_streamed_flac_is_the_whole_file_soundfile_reads() -> None:
    """FLAC is held to the end: its header then has the exact length libsndfile needs ("array is too big" else)."""
    encoder = StreamingAudioEncoder(AudioFormat.FLAC, 24000)
    samples = tone(440, 1.0, 24000)
    pieces = [encoder.feed(chunk) for chunk in np.array_split(samples, 7)] + [encoder.finish()]
    assert not any(pieces[:-1])
    decoded, rate = sf.read(io.BytesIO(b"".join(pieces)), dtype="int16")
    assert rate == 24000 and sf.info(io.BytesIO(pieces[-1])).frames == len(samples)
    # FLAC is lossless on PCM16: the samples are exactly the PCM16 encoding's.
    np.testing.assert_array_equal(decoded, np.frombuffer(encode_audio(samples, 24000, AudioFormat.PCM16), "<i2"))


def test_streaming_encoder_refuses_feed_after_finish() -> None:
    encoder = StreamingAudioEncoder(AudioFormat.MP3, 24000)
    encoder.finish()
    assert encoder.finish() == b""
    with pytest.raises(RuntimeError):
        encoder.feed(np.zeros(10, np.float32))


def test_format_names_parse_case_insensitively() -> None:
    assert AudioFormat.parse("PCM") is AudioFormat.PCM16
    assert AudioFormat.parse("Mp3") is AudioFormat.MP3
    with pytest.raises(ValueError, match="unknown audio format"):
        AudioFormat.parse("ogg")
