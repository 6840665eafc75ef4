"""A request's media and template messages → the thinker's prompt, in two steps, both after admission.

Only the raw body's prescan comes before admission: a server that is full refuses a request before a single media
byte is fetched or a data: URL's base64 read. Every API that sends a conversation to the thinker (chat
completions, responses) then turns its own input shape into a ``PromptPlan``: template messages with one
placeholder part per media item, and the items' bytes (``fetch``/``inline`` read them under the media policy,
decoding no samples or pixels); ``check`` reads each item's header against the request's budget
(``MediaBudget``) before ``build`` decodes the items and runs the chat template and the processor in one job of
the bounded ``DecodePool``. The client leaving cancels either step and gives the admission ticket back.

The processor's chat template places one placeholder per audio/image/video part,
and ``PromptProcessor.process`` expands them in order, so each kind is collected
in the order its parts appear. A video part reaches the processor as its sampled
frames and their rate; with ``use_audio_in_video`` also its sound track, which
counts against the request's audio budget like any audio part (checked from the
header before decoding, and again while decoding).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
from jinja2 import TemplateError
from PIL import Image

from omnistage.entrypoints.openai.common.decode_pool import CancelToken, DecodePool
from omnistage.entrypoints.openai.common.errors import APIError, bad_request
from omnistage.entrypoints.openai.common.request_budget import MIN_FRAME_COST, MediaBudget, over_budget
from omnistage.entrypoints.openai.media.loaders import (
    FetchedMedia,
    MediaError,
    MediaFetcher,
    decode_audio_item,
    decode_base64,
    decode_image,
    decode_video,
)
from omnistage.entrypoints.openai.media.probe import probe_audio, probe_image, probe_video, probe_video_audio
from omnistage.entrypoints.openai.server_config import ServerLimits
from omnistage.processing.prompt import AUDIO_SAMPLE_RATE, ProcessedPrompt, PromptProcessor
from omnistage.processing.video import Video

# The processor's chat-template input; only the APIs' prompt planners build it.
TemplatePart = dict[str, str]
TemplateMessage = dict[str, object]


@dataclass(frozen=True)
class MediaItem:
    """One media part's bytes, not yet decoded; ``param`` names it in errors."""

    kind: Literal["audio", "image", "video"]
    data: bytes
    param: str
    audio_hint: str | None = None


@dataclass(frozen=True)
class TemplateOptions:
    """How the prompt is built for one request: the tools the chat template shows, extra template variables
    (``chat_template_kwargs``), text the answer is made to start with (a forced tool call), and whether each
    video's sound track joins the prompt (``mm_processor_kwargs.use_audio_in_video``)."""

    tools: list[dict[str, object]] | None = None
    kwargs: dict[str, object] | None = None
    assistant_prefix: str = ""
    use_audio_in_video: bool = False


@dataclass
class PromptPlan:
    """A prompt before any decoding: template messages, and media items whose headers fit the budget."""

    messages: list[TemplateMessage]
    items: list[MediaItem] = field(default_factory=list)
    options: TemplateOptions = field(default_factory=TemplateOptions)


@dataclass
class _Decoded:
    audios: list[np.ndarray] = field(default_factory=list)
    images: list[Image.Image] = field(default_factory=list)
    videos: list[Video] = field(default_factory=list)
    audio_seconds: float = 0.0
    decode_pixels: int = 0


ON_LOOP_BASE64 = 256 * 1024  # base64 shorter than this decodes in well under a millisecond: not worth a pool hop
# A prompt of plain text messages this short (characters; no media, no tools) templates and tokenises on the loop:
# 0.1 ms at 60 characters, 0.3 ms at 1,000, 1.2 ms at 4,096 (tiny's tokenizer). A pool hop (a job, a worker's
# wake-up, the loop's) cost the server more CPU than building a short prompt.
ON_LOOP_TEXT = 2048
_ON_LOOP = CancelToken()  # a build on the loop runs to its end in one go: nothing ever cancels this one


def _plain_text_size(plan: PromptPlan) -> float:
    """The characters of a prompt whose messages are plain text; infinite when it has tools or parts."""
    if plan.options.tools:
        return math.inf
    size = len(plan.options.assistant_prefix)
    for message in plan.messages:
        content = message.get("content")
        if not isinstance(content, str) or len(message) > 2:  # parts, tool calls: the pool's
            return math.inf
        size += len(content)
    return size


def _base64_job(data: str, limits: ServerLimits, token: CancelToken) -> bytes:
    return decode_base64(data, limits)


def _data_url_job(fetcher: MediaFetcher, url: str, token: CancelToken) -> FetchedMedia:
    return fetcher.from_data_url(url)


def media_error(exc: MediaError, param: str) -> APIError:
    return bad_request(str(exc), param=param, code=exc.code)


class PromptBuilder:
    def __init__(self, processor: PromptProcessor, fetcher: MediaFetcher, limits: ServerLimits,
                 pool: DecodePool | None = None) -> None:
        self.processor = processor
        self.fetcher = fetcher
        self.limits = limits
        self.pool = pool or DecodePool(limits.decode_workers)

    # -- planning: the bytes and their headers, before any sample is decoded ----------------------
    async def fetch(self, url: str, param: str) -> FetchedMedia:
        """A data:, file:// or http(s) URL's bytes under the server's media policy; a large data: URL is decoded
        in the bounded pool (four 60 MB ones decoded at once on the event loop stalled it for seconds)."""
        try:
            if len(url) > ON_LOOP_BASE64 and url[:5].lower() == "data:":
                return await self.pool.run_sized(len(url), _data_url_job, self.fetcher, url)
            return await self.fetcher.fetch(url)
        except MediaError as exc:
            raise media_error(exc, param) from exc

    async def inline(self, data: str, param: str) -> bytes:
        """An inline item's base64 text, bounded by ``--max-base64-bytes``; a large one decoded in the pool."""
        try:
            if len(data) > ON_LOOP_BASE64:
                return await self.pool.run_sized(len(data), _base64_job, data, self.limits)
            return decode_base64(data, self.limits)
        except MediaError as exc:
            raise media_error(exc, param) from exc

    async def check(self, plan: PromptPlan) -> PromptPlan:
        """Each item's header against the request's budget, in the pool; decodes nothing."""
        if plan.items:
            await self.pool.run(self._check_headers, plan.items, plan.options.use_audio_in_video)
        return plan

    def _check_headers(self, items: list[MediaItem], audio_in_video: bool, token: CancelToken) -> None:
        budget = MediaBudget(self.limits)
        for item in items:
            token.check()
            try:
                if item.kind == "audio":
                    info = probe_audio(item.data, item.audio_hint)
                    budget.add_audio(info.sample_rate, info.seconds, item.param, info.channels)
                elif item.kind == "image":
                    budget.add_image(*probe_image(item.data), item.param)
                else:
                    video = probe_video(item.data)
                    budget.add_video(video.width, video.height, video.frames, item.param)
                    if audio_in_video:
                        track = probe_video_audio(item.data)
                        budget.add_audio(track.sample_rate, track.seconds, item.param, track.channels)
            except MediaError as exc:
                raise media_error(exc, item.param) from exc

    # -- building: the decode and the template ----------------------------------------------------
    async def build(self, plan: PromptPlan) -> ProcessedPrompt:
        """Decodes the media and builds the prompt, in the pool (cancelled with the calling task); one request with
        large media at a time (``DecodePool.run_large``). A short plain-text prompt is built on the loop
        (``ON_LOOP_TEXT``)."""
        if not plan.items and _plain_text_size(plan) <= ON_LOOP_TEXT:
            return self._build(plan, _ON_LOOP)
        return await self.pool.run_sized(sum(len(item.data) for item in plan.items), self._build, plan)

    def _build(self, plan: PromptPlan, token: CancelToken) -> ProcessedPrompt:
        decoded = _Decoded()
        for item in plan.items:
            token.check()
            try:
                self._decode(item, decoded, plan.options.use_audio_in_video, token)
            except MediaError as exc:
                raise media_error(exc, item.param) from exc
        token.check()
        try:
            options = plan.options
            ids = self.processor.apply_chat_template(plan.messages, options.tools, options.kwargs,
                                                     options.assistant_prefix)
            return self.processor.process(ids, audios=decoded.audios, images=decoded.images, videos=decoded.videos,
                                          use_audio_in_video=options.use_audio_in_video)
        except (ValueError, TemplateError) as exc:
            raise bad_request(f"could not build the prompt: {exc}", param="messages") from exc

    def _decode(self, item: MediaItem, out: _Decoded, audio_in_video: bool, token: CancelToken) -> None:
        """One item, with the budget enforced again while decoding: a header may understate what follows."""
        limits = self.limits
        if item.kind == "audio":
            left = limits.max_audio_seconds - out.audio_seconds
            audio = decode_audio_item(item.data, item.audio_hint, left, token.check, limits.max_audio_samples)
            out.audio_seconds += len(audio) / AUDIO_SAMPLE_RATE
            out.audios.append(audio)
        elif item.kind == "image":
            out.images.append(decode_image(item.data, limits))
        else:
            def on_frame(width: int, height: int) -> None:
                token.check()
                out.decode_pixels += max(width * height, MIN_FRAME_COST)
                if out.decode_pixels > limits.max_video_decode_pixels:
                    raise over_budget("max_video_decode_pixels", "the request's videos decode to more frame pixels "
                                      f"than the limit of {limits.max_video_decode_pixels}", item.param,
                                      "video_too_large")

            left = limits.max_audio_seconds - out.audio_seconds if audio_in_video else None
            video = decode_video(item.data, limits, on_frame, left, token.check)
            if video.audio is not None:
                out.audio_seconds += len(video.audio) / AUDIO_SAMPLE_RATE
            out.videos.append(video)
