"""A request's budget, spent before any work is done for it: counted from the raw body, then from headers.

Two passes, both before any media is decoded:

1. ``common/prescan.py`` counts the raw JSON body (messages, parts, text, media, tool calls, depth) before
   pydantic builds a single object, and before admission.
2. After admission (a full server refuses before fetching a media byte), ``MediaBudget`` adds up what each
   media item's header declares: audio seconds, sample rate and seconds x rate x channels, image pixels, video
   frames x pixels.

Every breach is a 400 naming the limit's flag (413 stays for the body size).
"""

from __future__ import annotations

from omnistage.entrypoints.openai.common.errors import APIError
from omnistage.entrypoints.openai.server_config import ServerLimits

MIN_FRAME_COST = 256 * 256  # decoding a frame costs at least this many pixels' work, however small it is


def over_budget(limit: str, message: str, param: str | None = None, code: str = "request_over_budget") -> APIError:
    """A 400 naming the flag whose limit was crossed."""
    flag = "--" + limit.replace("_", "-")
    return APIError(400, f"{message} ({flag})", param=param, code=code)


class MediaBudget:
    """What one request's media items declare in their headers, summed and checked as each is added."""

    def __init__(self, limits: ServerLimits) -> None:
        self.limits = limits
        self.audio_seconds = 0.0
        self.audio_samples = 0.0  # seconds x rate x channels: what decoding them allocates
        self.pixels = 0  # images and sampled video frames
        self.decode_pixels = 0  # every video frame decoded, at MIN_FRAME_COST at least

    def add_audio(self, rate: int, seconds: float | None, param: str, channels: int = 1) -> None:
        lo, hi = self.limits.min_audio_sample_rate, self.limits.max_audio_sample_rate
        if not lo <= rate <= hi:
            limit = "min_audio_sample_rate" if rate < lo else "max_audio_sample_rate"
            raise over_budget(limit, f"the audio declares a sample rate of {rate} Hz; the accepted range is "
                                     f"{lo}-{hi} Hz", param, "invalid_sample_rate")
        self.audio_seconds += seconds or 0.0
        if self.audio_seconds > self.limits.max_audio_seconds:
            raise over_budget("max_audio_seconds", f"the request's audio lasts {self.audio_seconds:.1f} s; the "
                                                   f"limit is {self.limits.max_audio_seconds:g} s", param,
                              "audio_too_long")
        self.audio_samples += (seconds or 0.0) * rate * max(channels, 1)
        if self.audio_samples > self.limits.max_audio_samples:
            raise over_budget("max_audio_samples", f"the request's audio decodes to {self.audio_samples:.0f} samples "
                                                   f"(seconds x {rate} Hz x {channels} channels); the limit is "
                                                   f"{self.limits.max_audio_samples}", param, "audio_too_large")

    def remaining_audio_seconds(self) -> float:
        return max(self.limits.max_audio_seconds - self.audio_seconds, 0.0)

    def add_image(self, width: int, height: int, param: str) -> None:
        self._frame_size(width, height, param)
        self._pixels(width * height, param)

    def add_video(self, width: int, height: int, frames: int | None, param: str) -> None:
        """``frames``: what the container says it holds (None: unknown, checked while decoding instead)."""
        self._frame_size(width, height, param)
        sampled = self.limits.max_video_frames if frames is None else min(frames, self.limits.max_video_frames)
        self._pixels(sampled * width * height, param)
        if frames is not None:
            self.add_decoded_frames(frames, width, height, param)

    def add_decoded_frames(self, frames: int, width: int, height: int, param: str) -> None:
        self.decode_pixels += frames * max(width * height, MIN_FRAME_COST)
        if self.decode_pixels > self.limits.max_video_decode_pixels:
            raise over_budget("max_video_decode_pixels", f"the request's videos need {self.decode_pixels} frame "
                                                         f"pixels decoded; the limit is "
                                                         f"{self.limits.max_video_decode_pixels}", param,
                              "video_too_large")

    def _frame_size(self, width: int, height: int, param: str) -> None:
        if width <= 0 or height <= 0:
            raise APIError(400, f"the media declares a size of {width}x{height}", param=param, code="invalid_media")
        if width * height > self.limits.max_image_pixels:
            raise over_budget("max_image_pixels", f"the image is {width}x{height}; the limit is "
                                                  f"{self.limits.max_image_pixels} pixels", param, "image_too_large")

    def _pixels(self, pixels: int, param: str) -> None:
        self.pixels += pixels
        if self.pixels > self.limits.max_total_pixels:
            raise over_budget("max_total_pixels", f"the request's images and video frames hold {self.pixels} "
                                                  f"pixels; the limit is {self.limits.max_total_pixels}", param,
                              "too_many_pixels")


def turns_over_budget(sizes: list[tuple[int, float]], limits: ServerLimits) -> int:
    """How many of a conversation's oldest turns to drop so the rest fit one request's budget
    (``sizes``: each turn's text characters and audio seconds, oldest first); the newest is always kept."""
    chars = sum(c for c, _ in sizes)
    seconds = sum(s for _, s in sizes)
    drop = 0
    while drop < len(sizes) - 1 and (chars > limits.max_text_chars or seconds > limits.max_audio_seconds):
        chars -= sizes[drop][0]
        seconds -= sizes[drop][1]
        drop += 1
    return drop
