"""Test signals and measurements shared by the audio and API tests."""

from __future__ import annotations

import io

import av
import numpy as np
import soundfile as sf


def tone(freq: float, seconds: float, rate: int, channels: int = 1) -> np.ndarray:
    """A sine at ``freq``; ``[frames]`` when mono, ``[frames, channels]`` otherwise."""
    t = np.arange(int(seconds * rate)) / rate
    mono = (0.3 * np.sin(2 * np.pi * freq * t)).astype(np.float32)
    return mono if channels == 1 else np.stack([mono] * channels, axis=1)


def peak_hz(samples: np.ndarray, rate: int) -> float:
    spectrum = np.abs(np.fft.rfft(samples))
    return float(np.argmax(spectrum) * rate / len(samples))


def soundfile_bytes(samples: np.ndarray, rate: int, fmt: str = "WAV") -> bytes:
    buf = io.BytesIO()
    sf.write(buf, samples, rate, format=fmt, subtype="PCM_16")
    return buf.getvalue()


def av_decode(data: bytes) -> tuple[np.ndarray, int]:
    """Any container FFmpeg reads → mono float32 and its rate."""
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.audio[0]
        frames = [f.to_ndarray() for f in container.decode(stream)]
        rate = stream.rate
    planar = [f.astype(np.float32) / (32768.0 if f.dtype == np.int16 else 1.0) for f in frames]
    return np.concatenate([p.reshape(-1) for p in planar]), int(rate)


def mp3_bytes(samples: np.ndarray, rate: int) -> bytes:
    from omnistage.audio import AudioFormat, encode_audio

    return encode_audio(samples, rate, AudioFormat.MP3)
