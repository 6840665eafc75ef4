"""A request's budget, spent before any work is done for it: counted from the raw body, then from headers.

Two passes, both before admission and before any media is decoded:

1. ``prescan_chat`` reads the raw JSON body with msgspec before pydantic
   builds a single object: the messages are first counted as raw slices (a
   million empty messages cost ~0.1 s and no lasting memory, where validating
   them took 40 s and 1.6 GB), then, within ``--max-messages``, their text and
   media parts are counted. A body msgspec cannot read this way is left for
   pydantic to name what is wrong with it.
2. ``MediaBudget`` adds up what each media item's header declares: audio
   seconds and sample rate, image pixels, video frames x pixels.

Every breach is a 400 naming the limit's flag (413 stays for the body size).
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

import msgspec
from fastapi import Request, Response
from fastapi.routing import APIRoute

from omnistage.entrypoints.openai.common.errors import APIError
from omnistage.entrypoints.openai.common.json_text import LONE_SURROGATE, lone_surrogate
from omnistage.entrypoints.openai.server_config import ServerLimits

MEDIA_PART_TYPES = frozenset({"input_audio", "image_url", "audio_url", "video_url"})
MIN_FRAME_COST = 256 * 256  # decoding a frame costs at least this many pixels' work, however small it is


def over_budget(limit: str, message: str, param: str | None = None, code: str = "request_over_budget") -> APIError:
    """A 400 naming the flag whose limit was crossed."""
    flag = "--" + limit.replace("_", "-")
    return APIError(400, f"{message} ({flag})", param=param, code=code)


class _Count(msgspec.Struct, gc=False):
    messages: list[msgspec.Raw] | None = None


class _Part(msgspec.Struct, gc=False):
    type: Any = None
    text: Any = None


class _Message(msgspec.Struct, gc=False):
    content: str | list[_Part] | None = None


_COUNT = msgspec.json.Decoder(_Count)
_MESSAGE = msgspec.json.Decoder(_Message)


def prescan_chat(body: bytes, limits: ServerLimits) -> None:
    """Message count, text characters and media parts of a chat body, from its raw bytes."""
    try:
        messages = _COUNT.decode(body).messages
    except msgspec.DecodeError:  # not JSON, or messages is not a list: pydantic says what is wrong
        return
    if messages is None:
        return
    if len(messages) > limits.max_messages:
        raise over_budget("max_messages", f"the request has {len(messages)} messages; the limit is "
                                          f"{limits.max_messages}", "messages", "too_many_messages")
    chars = media = 0
    for raw in messages:
        try:
            content = _MESSAGE.decode(raw).content
        except msgspec.DecodeError:
            continue
        if isinstance(content, str):
            chars += len(content)
            continue
        for part in content or ():
            chars += len(part.text) if isinstance(part.text, str) else 0
            media += isinstance(part.type, str) and part.type in MEDIA_PART_TYPES  # a list type is unhashable
    if chars > limits.max_text_chars:
        raise over_budget("max_text_chars", f"the messages hold {chars} characters of text; the limit is "
                                            f"{limits.max_text_chars}", "messages", "input_too_long")
    if media > limits.max_media_items:
        raise over_budget("max_media_items", f"the messages hold {media} media items; the limit is "
                                             f"{limits.max_media_items}", "messages", "too_many_media_items")


RESPONSES_MEDIA_TYPES = frozenset({"input_audio", "input_image", "input_file"})


class _ResponsesCount(msgspec.Struct, gc=False):
    input: str | list[msgspec.Raw] | None = None
    instructions: Any = None


class _Item(msgspec.Struct, gc=False):
    content: str | list[_Part] | None = None
    output: str | list[_Part] | None = None
    arguments: Any = None


_RESPONSES = msgspec.json.Decoder(_ResponsesCount)
_ITEM = msgspec.json.Decoder(_Item)


def _text_len(value: object) -> int:
    return len(value) if isinstance(value, str) else 0


def prescan_responses(body: bytes, limits: ServerLimits) -> None:
    """A ``/v1/responses`` body's input items (against ``--max-messages``), text and media parts, from raw bytes."""
    try:
        scan = _RESPONSES.decode(body)
    except msgspec.DecodeError:  # pydantic says what is wrong
        return
    items = [] if scan.input is None or isinstance(scan.input, str) else scan.input
    if len(items) > limits.max_messages:
        raise over_budget("max_messages", f"the request has {len(items)} input items; the limit is "
                                          f"{limits.max_messages}", "input", "too_many_messages")
    chars = _text_len(scan.input) + _text_len(scan.instructions)
    media = 0
    for raw in items:
        try:
            item = _ITEM.decode(raw)
        except msgspec.DecodeError:
            continue
        chars += _text_len(item.arguments)
        for value in (item.content, item.output):
            chars += _text_len(value)
            for part in value if isinstance(value, list) else ():
                chars += _text_len(part.text)
                media += isinstance(part.type, str) and part.type in RESPONSES_MEDIA_TYPES
    if chars > limits.max_text_chars:
        raise over_budget("max_text_chars", f"the input holds {chars} characters of text; the limit is "
                                            f"{limits.max_text_chars}", "input", "input_too_long")
    if media > limits.max_media_items:
        raise over_budget("max_media_items", f"the input holds {media} media items; the limit is "
                                             f"{limits.max_media_items}", "input", "too_many_media_items")


PRESCANS: dict[str, Callable[[bytes, ServerLimits], None]] = {"/v1/chat/completions": prescan_chat,
                                                              "/v1/responses": prescan_responses}


def check_json_text(body: bytes) -> None:
    """A JSON body holds valid text: no lone surrogate escape (``common/json_text.py``)."""
    if lone_surrogate(body):
        raise APIError(400, LONE_SURROGATE, code="invalid_json")


def _nested_too_deep() -> APIError:
    return APIError(400, "the JSON is nested too deep to read", code="invalid_json")


class BudgetedRoute(APIRoute):
    """Checks a JSON body's text, then runs the route's prescan on the raw body, before FastAPI parses and validates
    it (the body is read once: Starlette keeps it on the request for FastAPI's own read)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        prescan = PRESCANS.get(self.path)

        async def budgeted(request: Request) -> Response:
            kind = request.headers.get("content-type", "")
            if prescan is not None or "json" in kind or (not kind and request.method in ("POST", "PUT", "PATCH")):
                body = await request.body()  # FastAPI reads a body without a content type as JSON too
                check_json_text(body)
                try:
                    if prescan is not None:
                        prescan(body, request.app.state.limits)
                except RecursionError:  # msgspec's depth limit: Python's json would fail the same way
                    raise _nested_too_deep() from None
            return await handler(request)

        return budgeted


class MediaBudget:
    """What one request's media items declare in their headers, summed and checked as each is added."""

    def __init__(self, limits: ServerLimits) -> None:
        self.limits = limits
        self.audio_seconds = 0.0
        self.pixels = 0  # images and sampled video frames
        self.decode_pixels = 0  # every video frame decoded, at MIN_FRAME_COST at least

    def add_audio(self, rate: int, seconds: float | None, param: str) -> None:
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
