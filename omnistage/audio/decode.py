"""Decoding client audio into the 16 kHz mono float32 the audio encoder expects.

WAV and FLAC go through soundfile (libsndfile), MP3 and anything else through
PyAV (FFmpeg). Lengths are checked before (soundfile) or while (PyAV) decoding,
so a tiny compressed file that expands to hours of silence is rejected without
being decoded in full.
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable
from dataclasses import dataclass

import av
import numpy as np
import soundfile as sf
from scipy.signal import resample_poly

_SOUNDFILE_HINTS = frozenset({"wav", "flac"})


class AudioDecodeError(ValueError):
    """The bytes are not audio any decoder here understands."""


class AudioTooLongError(AudioDecodeError):
    """The audio decodes but is longer than the caller allows."""


@dataclass(frozen=True)
class DecodedAudio:
    samples: np.ndarray  # float32 mono
    sample_rate: int

    @property
    def duration_s(self) -> float:
        return len(self.samples) / self.sample_rate


def decode_audio(data: bytes, fmt: str | None = None, max_seconds: float | None = None,
                 checkpoint: Callable[[], None] | None = None) -> DecodedAudio:
    """Decodes ``data`` to mono float32 at its own rate; ``fmt`` picks the decoder: wav/flac libsndfile, any other
    name (mp3, ``"video"`` for a video's sound track) FFmpeg's first audio stream, None libsndfile then FFmpeg.
    ``checkpoint`` is called between decoded packets (it may raise to stop the work)."""
    if not data:
        raise AudioDecodeError("the audio is empty")
    hint = (fmt or "").lower()
    if hint in _SOUNDFILE_HINTS:
        decoded = _decode_soundfile(data, max_seconds)
    elif hint:
        decoded = _decode_av(data, max_seconds, checkpoint)
    else:
        # Unknown container (an audio_url): libsndfile is strict and fast, FFmpeg reads the rest.
        try:
            decoded = _decode_soundfile(data, max_seconds)
        except AudioTooLongError:
            raise
        except AudioDecodeError:
            decoded = _decode_av(data, max_seconds, checkpoint)
    if decoded.samples.size == 0:
        raise AudioDecodeError("the audio has no samples")
    return decoded


def to_mono(samples: np.ndarray) -> np.ndarray:
    """Averages channels of a ``[frames, channels]`` array; a 1-D array is returned as float32."""
    arr = np.asarray(samples, dtype=np.float32)
    return arr if arr.ndim == 1 else arr.mean(axis=1, dtype=np.float32)


def resample(samples: np.ndarray, rate_in: int, rate_out: int) -> np.ndarray:
    """Polyphase resampling with an anti-aliasing FIR (scipy), exact for any integer rate pair."""
    if rate_in == rate_out:
        return np.asarray(samples, dtype=np.float32)
    g = math.gcd(rate_in, rate_out)
    return resample_poly(samples, rate_out // g, rate_in // g).astype(np.float32)


def load_audio(data: bytes, fmt: str | None, target_rate: int, max_seconds: float | None = None,
               checkpoint: Callable[[], None] | None = None) -> np.ndarray:
    """Decode, downmix and resample in one call: what a prompt's audio item needs."""
    decoded = decode_audio(data, fmt, max_seconds, checkpoint)
    return resample(decoded.samples, decoded.sample_rate, target_rate)


def _check_length(frames: int, rate: int, max_seconds: float | None) -> None:
    if max_seconds is not None and frames > max_seconds * rate:
        raise AudioTooLongError(f"the audio is {frames / rate:.2f} s long; the limit is {max_seconds:g} s")


def _decode_soundfile(data: bytes, max_seconds: float | None) -> DecodedAudio:
    try:
        with sf.SoundFile(io.BytesIO(data)) as f:
            _check_length(f.frames, f.samplerate, max_seconds)
            samples = f.read(dtype="float32", always_2d=True)
            rate = int(f.samplerate)
    except AudioDecodeError:
        raise
    except (sf.LibsndfileError, RuntimeError, TypeError, ValueError) as exc:
        raise AudioDecodeError(f"could not decode the audio: {exc}") from exc
    return DecodedAudio(to_mono(samples), rate)


def _decode_av(data: bytes, max_seconds: float | None, checkpoint: Callable[[], None] | None = None) -> DecodedAudio:
    try:
        with av.open(io.BytesIO(data), mode="r") as container:
            if not container.streams.audio:
                raise AudioDecodeError("the file has no audio stream")
            return _read_av_stream(container, max_seconds, checkpoint)
    except AudioDecodeError:
        raise
    except (av.FFmpegError, ValueError, IndexError, UnicodeDecodeError) as exc:
        raise AudioDecodeError(f"could not decode the audio: {exc}") from exc


def _read_av_stream(container: av.container.InputContainer, max_seconds: float | None,
                    checkpoint: Callable[[], None] | None) -> DecodedAudio:
    stream = container.streams.audio[0]
    # Planar float keeps channels apart, so the downmix is ours (a plain mean), not FFmpeg's matrix.
    to_float = av.AudioResampler(format="fltp")
    chunks: list[np.ndarray] = []
    frames = 0
    rate = 0
    for frame in container.decode(stream):
        if checkpoint is not None:
            checkpoint()
        for out in to_float.resample(frame):
            rate = out.sample_rate
            planar = out.to_ndarray()  # [channels, samples]
            chunks.append(planar.mean(axis=0, dtype=np.float32))
            frames += planar.shape[1]
            _check_length(frames, rate, max_seconds)
    if not chunks:
        raise AudioDecodeError("the audio has no samples")
    return DecodedAudio(np.concatenate(chunks).astype(np.float32), int(rate))
