"""Test signals and measurements shared by the audio and API tests."""

from __future__ import annotations

import io

import av
import numpy as np
import soundfile as sf
from scipy.signal import lfilter


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


# Formants (F1, F2, F3 in Hz) of five vowels, roughly /a/ /i/ /e/ /o/ /u/ of an adult male voice.
VOWEL_FORMANTS = ((730, 1090, 2440), (270, 2290, 3010), (530, 1840, 2480), (570, 840, 2410), (300, 870, 2240))


def speech_like(seconds: float, rate: int, seed: int = 0, level: float = 0.3) -> np.ndarray:
    """Vowels as a source-filter model makes them, one every 250 ms: a sawtooth at a wandering 95-145 Hz
    pitch (a glottal pulse train has every harmonic, falling as 1/k) through three formant resonators, under a
    syllable envelope, over a faint noise floor. Silero VAD calls it speech; white noise and tones it does not."""
    rng = np.random.default_rng(seed)
    n = int(seconds * rate)
    t = np.arange(n) / rate
    pitch = 120 + 25 * np.sin(2 * np.pi * 0.6 * t + seed)
    source = 2 * (np.cumsum(pitch) / rate % 1.0) - 1
    syllable = int(0.25 * rate)
    voiced = np.zeros(n)
    for i, start in enumerate(range(0, n, syllable)):
        piece = source[start:start + syllable]
        for formant, bandwidth in zip(VOWEL_FORMANTS[(i + seed) % len(VOWEL_FORMANTS)], (80, 100, 120)):
            r, theta = np.exp(-np.pi * bandwidth / rate), 2 * np.pi * formant / rate
            voiced[start:start + syllable] += lfilter([1 - r], [1, -2 * r * np.cos(theta), r * r], piece)
    envelope = np.sqrt(np.sin(np.pi * (t * 4 % 1.0)))
    voiced *= envelope * level / (np.abs(voiced).max() + 1e-9)
    return (voiced + 0.002 * rng.standard_normal(n)).astype(np.float32)


def flac_without_length(samples: np.ndarray, rate: int) -> bytes:
    """A FLAC whose STREAMINFO gives no length (total samples 0, as a live encoder writes it): a decoder learns
    how long it is only by decoding it."""
    data = bytearray(soundfile_bytes(samples, rate, "FLAC"))
    assert data[:4] == b"fLaC" and data[4] & 0x7F == 0  # the first metadata block is STREAMINFO
    info = 8  # its 34 bytes follow the block header; the total is the low 36 bits of bytes 10-17
    data[info + 13] &= 0xF0
    data[info + 14:info + 18] = b"\0\0\0\0"
    return bytes(data)


def wav_with_bogus_sizes(samples: np.ndarray, rate: int) -> bytes:
    """A WAV whose RIFF and data chunk sizes say 0xFFFFFFFF (a streamed WAV's 'unknown'), whatever follows."""
    data = bytearray(soundfile_bytes(samples, rate, "WAV"))
    at = data.index(b"data")
    data[4:8] = data[at + 4:at + 8] = b"\xff\xff\xff\xff"
    return bytes(data)
