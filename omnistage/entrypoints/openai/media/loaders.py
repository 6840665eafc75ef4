"""Media in chat requests: URL fetching under the server's policy, and image/video/audio decoding.

Each loader raises ``MediaError`` with an OpenAI error code; the chat layer adds
the parameter path and turns it into a 400. Decoding is CPU work, so callers
run the ``decode_*`` functions in a worker thread.
"""

from __future__ import annotations

import binascii
import io
from collections.abc import Callable
from pathlib import Path
from urllib.parse import unquote, urlparse

import av
import numpy as np
from PIL import Image, UnidentifiedImageError

from omnistage.audio import AudioDecodeError, AudioTooLargeError, AudioTooLongError, load_audio
from omnistage.entrypoints.openai.common.errors import MediaError, quoted
from omnistage.entrypoints.openai.media.remote_fetch import RemoteFetcher
from omnistage.entrypoints.openai.server_config import MediaPolicy, ServerLimits
from omnistage.processing.prompt import AUDIO_SAMPLE_RATE
from omnistage.processing.video import Video

# data: URL media types → the decoder hint; anything else is probed.
_AUDIO_MIME_HINTS: dict[str, str] = {
    "audio/wav": "wav", "audio/x-wav": "wav", "audio/wave": "wav", "audio/vnd.wave": "wav",
    "audio/mpeg": "mp3", "audio/mp3": "mp3", "audio/flac": "flac", "audio/x-flac": "flac",
}


class FetchedMedia:
    """Raw bytes of one media item and, for data: URLs, the declared media type."""

    __slots__ = ("data", "mime")

    def __init__(self, data: bytes, mime: str | None = None) -> None:
        self.data = data
        self.mime = mime

    @property
    def audio_hint(self) -> str | None:
        return _AUDIO_MIME_HINTS.get(self.mime or "")


_BASE64_SLICE = 1 << 20  # characters: a multiple of 4, so only the last slice may end in padding


def decode_base64(data: str, limits: ServerLimits) -> bytes:
    """Strict base64 (no stray characters), size-checked before decoding."""
    if len(data) > limits.max_base64_bytes:
        raise MediaError(f"the base64 data is {len(data)} bytes; the limit is {limits.max_base64_bytes}",
                         code="media_too_large")
    try:
        # Strict (as b64decode's validate=True), in 1 MiB slices: one C call over 60 MB held the GIL (and so the
        # event loop, from a pool thread) for 0.25 s; between slices the loop gets its turn.
        return b"".join(binascii.a2b_base64(data[i:i + _BASE64_SLICE], strict_mode=True)
                        for i in range(0, len(data), _BASE64_SLICE))
    except (binascii.Error, ValueError) as exc:
        raise MediaError("invalid base64 data (strict base64: A-Z a-z 0-9 + /, padded with =)",
                         code="invalid_base64") from exc


class MediaFetcher:
    """Resolves media URLs: data: always, file:// under one folder, http(s) only when allowed."""

    def __init__(self, policy: MediaPolicy, limits: ServerLimits) -> None:
        self.policy = policy
        self.limits = limits
        self.remote = RemoteFetcher(policy, limits.max_media_bytes)

    async def fetch(self, url: str) -> FetchedMedia:
        scheme = urlparse(url).scheme.lower()
        if scheme == "data":
            return self.from_data_url(url)
        if scheme == "file":
            return FetchedMedia(self._from_file(url))
        if scheme in ("http", "https"):
            return FetchedMedia(await self._from_remote(url))
        raise MediaError(f"unsupported URL scheme {quoted(scheme)}: use data:, file:// or http(s)://",
                         code="invalid_url")

    def from_data_url(self, url: str) -> FetchedMedia:
        header, sep, payload = url[len("data:"):].partition(",")
        if not sep or not header.endswith(";base64"):
            raise MediaError("data: URLs must be base64 (data:<type>;base64,<data>)", code="invalid_url")
        mime = header[: -len(";base64")].split(";")[0].strip().lower() or None
        return FetchedMedia(decode_base64(payload, self.limits), mime)

    def _from_file(self, url: str) -> bytes:
        """One error for a missing file and a file outside the folder (no existence oracle), never a path."""
        root = self.policy.allowed_local_media_path
        if root is None:
            raise MediaError("file:// URLs are disabled (start the server with --allowed-local-media-path)",
                             code="local_media_disabled")
        parsed = urlparse(url)
        path = unquote(parsed.path)
        if parsed.netloc not in ("", "localhost") or "\x00" in path:
            raise MediaError("file:// URLs must name a local path (file:///...)", code="invalid_url")
        unavailable = MediaError("the file URL does not name a readable file under the allowed media folder",
                                 code="file_not_available")
        try:
            # resolve() follows symlinks, so a link inside the folder cannot reach outside it.
            resolved = Path(path).resolve(strict=True)
            if not resolved.is_relative_to(root) or not resolved.is_file():
                raise unavailable
            if resolved.stat().st_size > self.limits.max_media_bytes:
                raise MediaError(f"the file is larger than {self.limits.max_media_bytes} bytes", code="media_too_large")
            return resolved.read_bytes()
        except MediaError:
            raise
        except (OSError, ValueError, RuntimeError):  # missing, unreadable, a symlink loop
            raise unavailable from None

    async def _from_remote(self, url: str) -> bytes:
        if not self.policy.allow_remote_media:
            raise MediaError("http(s) media URLs are disabled (start the server with --allow-remote-media)",
                             code="remote_media_disabled")
        return await self.remote.fetch(url)


MIN_AUDIO_SAMPLES = 400  # 25 ms at 16 kHz: one window of the audio encoder's feature extractor
VIDEO_AUDIO_HINT = "video"  # decode_audio's hint for a container's first audio stream, through FFmpeg


def decode_audio_item(data: bytes, fmt: str | None, max_seconds: float,
                      checkpoint: Callable[[], None] | None = None, max_samples: int | None = None) -> np.ndarray:
    """Any supported container → 16 kHz mono float32, as the audio encoder's feature extractor wants;
    ``max_seconds`` and ``max_samples`` (--max-audio-samples) stop a decoder whose header understated the
    length or gave none."""
    try:
        samples = load_audio(data, fmt, AUDIO_SAMPLE_RATE, max_seconds=max_seconds, checkpoint=checkpoint,
                             max_samples=max_samples)
    except AudioTooLargeError as exc:
        raise MediaError(f"{exc} (--max-audio-samples)", code="audio_too_large") from exc
    except AudioTooLongError as exc:
        raise MediaError(str(exc), code="audio_too_long") from exc
    except AudioDecodeError as exc:
        raise MediaError(str(exc), code="invalid_audio") from exc
    if samples.size < MIN_AUDIO_SAMPLES:  # e.g. a few frames at a claimed 10 MHz: no feature window fits
        raise MediaError(f"the audio is {samples.size / AUDIO_SAMPLE_RATE * 1000:.1f} ms long; the minimum is "
                         f"{MIN_AUDIO_SAMPLES / AUDIO_SAMPLE_RATE * 1000:g} ms", code="invalid_audio")
    return samples


def _check_pixels(width: int, height: int, limits: ServerLimits) -> None:
    if width * height > limits.max_image_pixels:
        raise MediaError(f"the image is {width}x{height}; the limit is {limits.max_image_pixels} pixels",
                         code="image_too_large")


def decode_image(data: bytes, limits: ServerLimits) -> Image.Image:
    """RGB PIL image; the size is checked from the header, before the pixels are decoded."""
    try:
        img = Image.open(io.BytesIO(data))
        _check_pixels(img.width, img.height, limits)
        img.load()
    except MediaError:
        raise
    except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError) as exc:
        raise MediaError("could not decode the image", code="invalid_image") from exc
    return img.convert("RGB")


# Called with each decoded frame's width and height before it is kept; may raise to stop decoding.
FrameCheck = Callable[[int, int], None]


def decode_video(data: bytes, limits: ServerLimits, on_frame: FrameCheck | None = None,
                 audio_seconds: float | None = None, checkpoint: Callable[[], None] | None = None) -> Video:
    """RGB frames sampled at ``video_sample_fps`` (at most ``max_video_frames``), with the rate they were
    sampled at. With ``audio_seconds`` (``use_audio_in_video``: what is left of the request's audio budget)
    the sound track is decoded too, as 16 kHz mono; otherwise it is not read."""
    try:
        with av.open(io.BytesIO(data), mode="r") as container:
            if not container.streams.video:
                raise MediaError("the file has no video stream", code="invalid_video")
            video = _sample_frames(container, limits, on_frame)
    except MediaError:
        raise
    except (av.FFmpegError, ValueError, IndexError) as exc:
        raise MediaError("could not decode the video", code="invalid_video") from exc
    if audio_seconds is None:
        return video
    audio = decode_audio_item(data, VIDEO_AUDIO_HINT, audio_seconds, checkpoint, limits.max_audio_samples)
    return Video(frames=video.frames, fps=video.fps, audio=audio)


def _frame_interval(container: av.container.InputContainer, limits: ServerLimits) -> float:
    """Seconds between sampled frames: ``1 / video_sample_fps``, widened so the frame cap spans the
    whole video instead of its first few seconds (when the container states its duration)."""
    interval = 1.0 / limits.video_sample_fps
    if container.duration:  # microseconds
        interval = max(interval, container.duration / 1e6 / limits.max_video_frames)
    return interval


def _sample_frames(container: av.container.InputContainer, limits: ServerLimits,
                   on_frame: FrameCheck | None) -> Video:
    stream = container.streams.video[0]
    interval = _frame_interval(container, limits)
    frames: list[Image.Image] = []
    times: list[float] = []
    next_t = 0.0
    for frame in container.decode(stream):
        if on_frame is not None:
            on_frame(frame.width, frame.height)
        t = float(frame.time) if frame.time is not None else next_t
        if t + 1e-6 < next_t:
            continue
        _check_pixels(frame.width, frame.height, limits)
        frames.append(frame.to_image().convert("RGB"))
        times.append(t)
        next_t = t + interval
        if len(frames) >= limits.max_video_frames:
            break
    if not frames:
        raise MediaError("the video has no frames", code="invalid_video")
    return Video(frames=tuple(frames), fps=_sampled_fps(times, interval))


def _sampled_fps(times: list[float], interval: float) -> float:
    """The rate of the sampled frames from their mean spacing: source frames rarely fall exactly on the
    sampling grid (a 3 fps clip sampled every 0.5 s gives a frame every 0.67 s). One frame: the grid's rate."""
    span = times[-1] - times[0]
    return (len(times) - 1) / span if len(times) > 1 and span > 0 else 1.0 / interval
