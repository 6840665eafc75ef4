"""Chat messages → the thinker's prompt: media are fetched and decoded, then the chat template runs.

The processor's chat template places one placeholder per audio/image/video part,
and ``PromptProcessor.process`` expands them in order, so each kind is collected
in the order its parts appear. A video part reaches the processor as its sampled
frames and their rate; its audio track is not used.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

import anyio
import numpy as np
from PIL import Image

from omnistage.entrypoints.openai.errors import APIError, bad_request
from omnistage.entrypoints.openai.media import (
    MediaError,
    MediaFetcher,
    decode_audio_item,
    decode_base64,
    decode_image,
    decode_video,
)
from omnistage.entrypoints.openai.protocol import (
    AudioURLPart,
    ChatMessage,
    ContentPart,
    ImageURLPart,
    InputAudioPart,
    TextPart,
    VideoURLPart,
)
from omnistage.entrypoints.openai.server_config import ServerLimits
from omnistage.processing.prompt import ProcessedPrompt, PromptProcessor
from omnistage.processing.video import Video

# The processor's chat-template input; this module is the only place that builds it.
TemplatePart = dict[str, str]
TemplateMessage = dict[str, object]
T = TypeVar("T")
_TEXT_ROLE = {"developer": "system"}  # Qwen's template knows system/user/assistant


@dataclass
class _Collected:
    messages: list[TemplateMessage] = field(default_factory=list)
    audios: list[np.ndarray] = field(default_factory=list)
    images: list[Image.Image] = field(default_factory=list)
    videos: list[Video] = field(default_factory=list)


def _media_error(exc: MediaError, param: str) -> APIError:
    return bad_request(str(exc), param=param, code=exc.code)


def check_text_length(messages: list[ChatMessage], limits: ServerLimits) -> None:
    total = 0
    for msg in messages:
        if isinstance(msg.content, str):
            total += len(msg.content)
        elif msg.content is not None:
            total += sum(len(p.text) for p in msg.content if isinstance(p, TextPart))
    if total > limits.max_text_chars:
        raise bad_request(f"the messages hold {total} characters of text; the limit is {limits.max_text_chars}",
                          param="messages", code="input_too_long")


def check_media_count(messages: list[ChatMessage], limits: ServerLimits) -> None:
    count = sum(1 for m in messages if isinstance(m.content, list) for p in m.content if not isinstance(p, TextPart))
    if count > limits.max_media_items:
        raise bad_request(f"the messages hold {count} media items; the limit is {limits.max_media_items}",
                          param="messages", code="too_many_media_items")


class ChatPromptBuilder:
    def __init__(self, processor: PromptProcessor, fetcher: MediaFetcher, limits: ServerLimits) -> None:
        self.processor = processor
        self.fetcher = fetcher
        self.limits = limits

    async def build(self, messages: list[ChatMessage]) -> ProcessedPrompt:
        check_text_length(messages, self.limits)
        check_media_count(messages, self.limits)
        collected = _Collected()
        for i, msg in enumerate(messages):
            collected.messages.append(await self._message(msg, f"messages[{i}]", collected))
        try:
            return await anyio.to_thread.run_sync(self._process, collected)
        except ValueError as exc:
            raise bad_request(f"could not build the prompt: {exc}", param="messages") from exc

    def _process(self, collected: _Collected) -> ProcessedPrompt:
        ids = self.processor.apply_chat_template(collected.messages)
        return self.processor.process(ids, audios=collected.audios, images=collected.images, videos=collected.videos)

    async def _message(self, msg: ChatMessage, param: str, out: _Collected) -> TemplateMessage:
        role = _TEXT_ROLE.get(msg.role, msg.role)
        if msg.content is None or isinstance(msg.content, str):
            return {"role": role, "content": msg.content or ""}
        parts: list[TemplatePart] = []
        for j, part in enumerate(msg.content):
            parts.extend(await self._part(part, f"{param}.content[{j}]", out))
        return {"role": role, "content": parts}

    async def _part(self, part: ContentPart, param: str, out: _Collected) -> list[TemplatePart]:
        if isinstance(part, TextPart):
            return [{"type": "text", "text": part.text}]
        if isinstance(part, InputAudioPart):
            audio = await self._input_audio(part, param)
            out.audios.append(audio)
            return [{"type": "audio"}]
        if isinstance(part, AudioURLPart):
            out.audios.append(await self._audio_url(part.audio_url.url, f"{param}.audio_url.url"))
            return [{"type": "audio"}]
        if isinstance(part, ImageURLPart):
            data = await self._fetch(part.image_url.url, f"{param}.image_url.url")
            out.images.append(await self._decode(decode_image, data, param=f"{param}.image_url.url"))
            return [{"type": "image"}]
        assert isinstance(part, VideoURLPart)
        data = await self._fetch(part.video_url.url, f"{param}.video_url.url")
        out.videos.append(await self._decode(decode_video, data, param=f"{param}.video_url.url"))
        return [{"type": "video"}]

    async def _input_audio(self, part: InputAudioPart, param: str) -> np.ndarray:
        try:
            data = decode_base64(part.input_audio.data, self.limits)
        except MediaError as exc:
            raise _media_error(exc, f"{param}.input_audio.data") from exc
        return await self._decode(decode_audio_item, data, part.input_audio.format, param=f"{param}.input_audio.data")

    async def _audio_url(self, url: str, param: str) -> np.ndarray:
        try:
            fetched = await self.fetcher.fetch(url)
        except MediaError as exc:
            raise _media_error(exc, param) from exc
        return await self._decode(decode_audio_item, fetched.data, fetched.audio_hint, param=param)

    async def _fetch(self, url: str, param: str) -> bytes:
        try:
            return (await self.fetcher.fetch(url)).data
        except MediaError as exc:
            raise _media_error(exc, param) from exc

    async def _decode(self, fn: Callable[..., T], *args: object, param: str) -> T:
        try:
            return await anyio.to_thread.run_sync(fn, *args, self.limits)
        except MediaError as exc:
            raise _media_error(exc, param) from exc
