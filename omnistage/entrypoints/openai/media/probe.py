"""What a media item says about itself, read from its header without decoding it.

PIL reads an image's size lazily on ``Image.open``; libsndfile reads a WAV or
FLAC header's rate and frame count; PyAV opens a container and reads its
streams' metadata (rate, size, frame count or duration) without decoding a
frame. The request budget is checked against these before any decoding runs.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import av
import soundfile as sf
from PIL import Image, UnidentifiedImageError

from omnistage.entrypoints.openai.common.errors import MediaError

T = TypeVar("T")
_SOUNDFILE_HINTS = frozenset({"wav", "flac", None})  # None: unknown container, libsndfile tried first


@dataclass(frozen=True)
class AudioInfo:
    sample_rate: int
    seconds: float | None  # None: the container does not say (the decoder stops at the budget instead)
    channels: int = 1


@dataclass(frozen=True)
class VideoInfo:
    width: int
    height: int
    frames: int | None  # None: unknown until decoded


def probe_audio(data: bytes, fmt: str | None) -> AudioInfo:
    if not data:
        raise MediaError("the audio is empty", code="invalid_audio")
    if fmt in _SOUNDFILE_HINTS:
        try:
            info = sf.info(io.BytesIO(data))
            # A streaming FLAC/Ogg states no length: libsndfile says SF_COUNT_MAX frames (the decoder bounds it).
            seconds = info.frames / info.samplerate if info.samplerate > 0 and info.frames < 2**63 - 1 else None
            return AudioInfo(int(info.samplerate), seconds, int(info.channels))
        except (sf.LibsndfileError, RuntimeError, TypeError, ValueError) as exc:
            if fmt is not None:
                raise MediaError(f"could not read the audio header: it is not a {fmt} file",
                                 code="invalid_audio") from exc
    return _probe_av_audio(data)


def _probe_av_audio(data: bytes) -> AudioInfo:
    return _probe_av(data, "audio", _audio_info)


def _audio_info(container: av.container.InputContainer) -> AudioInfo:
    stream = container.streams.audio[0]
    return AudioInfo(int(stream.sample_rate or 0), _seconds(container, stream), int(stream.channels or 1))


def probe_video_audio(data: bytes) -> AudioInfo:
    """A video's sound track, which ``use_audio_in_video`` needs: its absence is the client's mistake."""
    def read(container: av.container.InputContainer) -> AudioInfo:
        if not container.streams.audio:
            raise MediaError("the video has no audio track, which mm_processor_kwargs.use_audio_in_video=true "
                             "needs", code="video_without_audio")
        return _audio_info(container)

    return _probe_av(data, "video", read)


def probe_image(data: bytes) -> tuple[int, int]:
    try:
        with Image.open(io.BytesIO(data)) as img:  # reads the header only
            return img.width, img.height
    except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError) as exc:
        raise MediaError("could not read the image header (the file is in no image format this server reads)",
                         code="invalid_image") from exc


def probe_video(data: bytes) -> VideoInfo:
    def read(container: av.container.InputContainer) -> VideoInfo:
        stream = container.streams.video[0]
        rate = float(stream.average_rate or stream.guessed_rate or 0) or None
        frames = _video_frames(int(stream.frames or 0), _seconds(container, stream), rate)
        return VideoInfo(int(stream.codec_context.width), int(stream.codec_context.height), frames)

    return _probe_av(data, "video", read)


def _probe_av(data: bytes, kind: str, read: Callable[[av.container.InputContainer], T]) -> T:
    """Opens the container (headers only) and reads its first ``kind`` stream's metadata with ``read``."""
    try:
        with av.open(io.BytesIO(data), mode="r") as container:
            if not getattr(container.streams, kind):
                raise MediaError(f"the file has no {kind} stream", code=f"invalid_{kind}")
            return read(container)
    except MediaError:
        raise
    except (av.FFmpegError, ValueError, IndexError, UnicodeDecodeError, ZeroDivisionError) as exc:
        raise MediaError(f"could not read the {kind} header (the file is in no {kind} format this server reads)",
                         code=f"invalid_{kind}") from exc


def _seconds(container: av.container.InputContainer, stream: av.stream.Stream) -> float | None:
    if stream.duration is not None and stream.time_base is not None:
        return float(stream.duration * stream.time_base)
    if container.duration is not None:
        return container.duration / 1e6  # microseconds
    return None


def _video_frames(frames: int, duration_s: float | None, rate: float | None) -> int | None:
    """The container's frame count, else duration x rate, else unknown."""
    if frames > 0:
        return frames
    if duration_s is not None and rate is not None and 0 < duration_s * rate < 2**40:
        return int(duration_s * rate + 0.999)
    return None
