"""Decoding client audio into the 16 kHz mono float32 the audio encoder expects.

WAV and FLAC go through soundfile (libsndfile), MP3 and anything else through
PyAV (FFmpeg). Both decode in bounded pieces (a block of frames, a packet), each
downmixed as it comes, and count what they decoded: past ``max_seconds`` (frames
/ rate) or ``max_samples`` (frames x channels, what decoding allocates) they stop
there. A header that states a length is checked before the first piece too; one
that gives none (a streaming FLAC or Ogg, raw MP3, WebM) or lies about it is
stopped by the count, so a tiny file that expands to hours of 8-channel 192 kHz
silence is refused without being decoded in full. Every decoded piece is checked as it comes: a float file
holding NaN, infinity or values no audio has is refused (``AudioNotFiniteError``) at this one point, for every
route that takes audio.
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
_UNKNOWN_FRAMES = 2**63 - 1  # libsndfile's frame count for a stream whose header gives none (SF_COUNT_MAX)
_BLOCK_FRAMES = 1 << 16  # libsndfile reads this many frames at a time: ~1.4 s at 48 kHz


class AudioDecodeError(ValueError):
    """The bytes are not audio any decoder here understands."""


class AudioTooLongError(AudioDecodeError):
    """The audio decodes but is longer than the caller allows."""


class AudioTooLargeError(AudioTooLongError):
    """The audio decodes to more samples (frames x channels) than the caller allows."""


class AudioNotFiniteError(AudioDecodeError):
    """A float file's samples hold NaN or infinity, or values no audio has: every feature computed from them
    would be non-finite, and the request fail deep in a model ("sampling failed")."""


# Past this a sample is no audio in any scale (normalised floats lie within ±1, integer-scaled ones within ±32768);
# a power spectrum of samples near 1e17 overflows float32 to infinity.
MAX_SAMPLE_MAGNITUDE = 65536.0


def check_samples(samples: np.ndarray) -> None:
    """``AudioNotFiniteError`` unless every sample is finite and within ±``MAX_SAMPLE_MAGNITUDE``."""
    if not samples.size:
        return
    peak = float(np.max(np.abs(samples)))  # NaN if any sample is NaN
    if not np.isfinite(peak):
        raise AudioNotFiniteError("the audio holds non-finite samples (NaN or infinity)")
    if peak > MAX_SAMPLE_MAGNITUDE:
        raise AudioNotFiniteError(f"the audio holds samples of magnitude {peak:.3g}; audio samples lie within "
                                  f"±{MAX_SAMPLE_MAGNITUDE:g}")


@dataclass(frozen=True)
class DecodeBound:
    """How much one decode may produce: seconds and samples (frames x channels), either unbounded (None)."""

    max_seconds: float | None = None
    max_samples: int | None = None

    def check(self, frames: int, rate: int, channels: int) -> None:
        if self.max_seconds is not None and frames > self.max_seconds * rate:
            raise AudioTooLongError(f"the audio is {frames / rate:.2f} s long; the limit is {self.max_seconds:g} s")
        if self.max_samples is not None and frames * channels > self.max_samples:
            raise AudioTooLargeError(f"the audio decodes to {frames * channels} samples ({frames} frames x "
                                     f"{channels} channels) or more; the limit is {self.max_samples}")


@dataclass(frozen=True)
class DecodedAudio:
    samples: np.ndarray  # float32 mono
    sample_rate: int

    @property
    def duration_s(self) -> float:
        return len(self.samples) / self.sample_rate


def decode_audio(data: bytes, fmt: str | None = None, max_seconds: float | None = None,
                 checkpoint: Callable[[], None] | None = None, max_samples: int | None = None) -> DecodedAudio:
    """Decodes ``data`` to mono float32 at its own rate; ``fmt`` picks the decoder: wav/flac libsndfile, any other
    name (mp3, ``"video"`` for a video's sound track) FFmpeg's first audio stream, None libsndfile then FFmpeg.
    ``max_seconds`` and ``max_samples`` bound what is decoded (:class:`DecodeBound`); ``checkpoint`` is called
    between decoded pieces (it may raise to stop the work)."""
    if not data:
        raise AudioDecodeError("the audio is empty")
    bound = DecodeBound(max_seconds, max_samples)
    hint = (fmt or "").lower()
    decoded = None
    if hint in _SOUNDFILE_HINTS or not hint:
        # An unknown container (an audio_url): libsndfile is strict and fast, FFmpeg reads the rest.
        try:
            decoded = _decode_soundfile(data, bound, checkpoint)
        except (AudioTooLongError, AudioNotFiniteError):
            raise
        except AudioDecodeError:
            if hint:
                raise
    if decoded is None:  # FFmpeg's format, or one libsndfile cannot tell the length of
        decoded = _decode_av(data, bound, checkpoint)
    if decoded.samples.size == 0:
        raise AudioDecodeError("the audio has no samples")
    return decoded


def to_mono(samples: np.ndarray) -> np.ndarray:
    """Averages channels of a ``[frames, channels]`` array; a 1-D array is returned as float32."""
    arr = np.asarray(samples, dtype=np.float32)
    return arr if arr.ndim == 1 else arr.mean(axis=1, dtype=np.float32)


def checked_mono(samples: np.ndarray) -> np.ndarray:
    """``to_mono``, the result checked as it comes (``check_samples``): a decode stops at its first bad piece."""
    mono = to_mono(samples)
    check_samples(mono)
    return mono


def resample(samples: np.ndarray, rate_in: int, rate_out: int) -> np.ndarray:
    """Polyphase resampling with an anti-aliasing FIR (scipy), exact for any integer rate pair."""
    if rate_in == rate_out:
        return np.asarray(samples, dtype=np.float32)
    g = math.gcd(rate_in, rate_out)
    return resample_poly(samples, rate_out // g, rate_in // g).astype(np.float32)


def load_audio(data: bytes, fmt: str | None, target_rate: int, max_seconds: float | None = None,
               checkpoint: Callable[[], None] | None = None, max_samples: int | None = None) -> np.ndarray:
    """Decode, downmix and resample in one call: what a prompt's audio item needs."""
    decoded = decode_audio(data, fmt, max_seconds, checkpoint, max_samples)
    return resample(decoded.samples, decoded.sample_rate, target_rate)


def _decode_soundfile(data: bytes, bound: DecodeBound, checkpoint: Callable[[], None] | None) -> DecodedAudio | None:
    """libsndfile's decoding in blocks; None for a stream whose header gives no length (a streaming FLAC), which
    libsndfile cannot read to its end (its position bookkeeping fails at the last block): FFmpeg reads those."""
    try:
        with sf.SoundFile(io.BytesIO(data)) as f:
            rate, channels = int(f.samplerate), int(f.channels)
            if f.frames == _UNKNOWN_FRAMES:
                return None
            bound.check(f.frames, rate, channels)  # the header's length, before a frame is decoded
            chunks: list[np.ndarray] = []
            frames = 0
            while (block := f.read(_BLOCK_FRAMES, dtype="float32", always_2d=True)).shape[0]:
                frames += block.shape[0]
                bound.check(frames, rate, channels)  # a header that understated the length stops here
                chunks.append(checked_mono(block))
                if checkpoint is not None:
                    checkpoint()
    except AudioDecodeError:
        raise
    except (sf.LibsndfileError, RuntimeError, TypeError, ValueError) as exc:
        raise AudioDecodeError("could not decode the audio as wav or flac") from exc
    return DecodedAudio(np.concatenate(chunks) if chunks else np.zeros(0, np.float32), rate)


def _decode_av(data: bytes, bound: DecodeBound, checkpoint: Callable[[], None] | None = None) -> DecodedAudio:
    try:
        with av.open(io.BytesIO(data), mode="r") as container:
            if not container.streams.audio:
                raise AudioDecodeError("the file has no audio stream")
            return _read_av_stream(container, bound, checkpoint)
    except AudioDecodeError:
        raise
    except (av.FFmpegError, ValueError, IndexError, UnicodeDecodeError) as exc:
        raise AudioDecodeError("could not decode the audio: not an audio format this server reads") from exc


def _read_av_stream(container: av.container.InputContainer, bound: DecodeBound,
                    checkpoint: Callable[[], None] | None) -> DecodedAudio:
    stream = container.streams.audio[0]
    # Packed float: the channels interleaved in one plane, downmixed here (a plain mean, not FFmpeg's matrix).
    # Not planar: PyAV gives an 8-channel planar frame a ninth plane, and reading it crashes the process.
    to_float = av.AudioResampler(format="flt")
    chunks: list[np.ndarray] = []
    frames = 0
    rate = 0
    for frame in container.decode(stream):
        if checkpoint is not None:
            checkpoint()
        for out in to_float.resample(frame):
            rate, channels = out.sample_rate, out.layout.nb_channels
            packed = out.to_ndarray().reshape(-1, channels)  # [samples, channels]
            frames += packed.shape[0]
            bound.check(frames, rate, channels)
            chunks.append(checked_mono(packed))
    if not chunks:
        raise AudioDecodeError("the audio has no samples")
    return DecodedAudio(np.concatenate(chunks).astype(np.float32), int(rate))
