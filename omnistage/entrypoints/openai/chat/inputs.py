"""Chat messages → a ``PromptPlan`` for the shared ``PromptBuilder`` (``media/prompt_builder.py``).

``plan`` turns each message into template messages and fetches each media
item's bytes, then checks what its header declares against the request's
budget: no sample or pixel is decoded. ``build`` (the shared builder's) then
decodes the items and runs the chat template and the processor in the bounded
``DecodePool``. Both run once the request is admitted; the client leaving
cancels them.
"""

from __future__ import annotations

import json
from typing import Literal

from omnistage.entrypoints.openai.chat.protocol import (
    AudioURLPart,
    ChatMessage,
    ContentPart,
    ImageURLPart,
    InputAudioPart,
    TextPart,
    ToolCall,
    VideoURLPart,
)
from omnistage.entrypoints.openai.media.prompt_builder import (
    MediaItem,
    PromptBuilder,
    PromptPlan,
    TemplateMessage,
    TemplateOptions,
    TemplatePart,
)

__all__ = ["ChatPromptBuilder", "MediaItem", "PromptPlan", "TemplateOptions"]
_TEXT_ROLE = {"developer": "system"}  # Qwen's template knows system/user/assistant


def _template_call(call: ToolCall) -> dict[str, object]:
    """An earlier turn's call as the template writes it back: arguments as an object when they parse."""
    try:
        arguments: object = json.loads(call.function.arguments)
    except json.JSONDecodeError:
        arguments = call.function.arguments
    return {"id": call.id, "type": "function", "function": {"name": call.function.name, "arguments": arguments}}


class ChatPromptBuilder(PromptBuilder):
    async def plan(self, messages: list[ChatMessage], options: TemplateOptions | None = None) -> PromptPlan:
        """Fetches the media and checks their headers against the budget; decodes nothing."""
        plan = PromptPlan([], options=options or TemplateOptions())
        for i, msg in enumerate(messages):
            plan.messages.append(await self._message(msg, f"messages[{i}]", plan.items))
        return await self.check(plan)

    # -- planning ---------------------------------------------------------------------
    async def _message(self, msg: ChatMessage, param: str, items: list[MediaItem]) -> TemplateMessage:
        role = _TEXT_ROLE.get(msg.role, msg.role)
        message: TemplateMessage = {"role": role}
        if msg.tool_calls:
            message["tool_calls"] = [_template_call(call) for call in msg.tool_calls]
        if msg.tool_call_id is not None:
            message["tool_call_id"] = msg.tool_call_id
        if msg.content is None or isinstance(msg.content, str):
            return {**message, "content": msg.content or ""}
        parts: list[TemplatePart] = []
        for j, part in enumerate(msg.content):
            parts.append(await self._part(part, f"{param}.content[{j}]", items))
        return {**message, "content": parts}

    async def _part(self, part: ContentPart, param: str, items: list[MediaItem]) -> TemplatePart:
        if isinstance(part, TextPart):
            return {"type": "text", "text": part.text}
        if isinstance(part, InputAudioPart):
            param += ".input_audio.data"
            data = await self.inline(part.input_audio.data, param)
            items.append(MediaItem("audio", data, param, part.input_audio.format))
            return {"type": "audio"}
        if isinstance(part, AudioURLPart):
            param += ".audio_url.url"
            fetched = await self.fetch(part.audio_url.url, param)
            items.append(MediaItem("audio", fetched.data, param, fetched.audio_hint))
            return {"type": "audio"}
        kind: Literal["image", "video"] = "image" if isinstance(part, ImageURLPart) else "video"
        assert isinstance(part, (ImageURLPart, VideoURLPart))
        url = part.image_url.url if isinstance(part, ImageURLPart) else part.video_url.url
        param += f".{kind}_url.url"
        items.append(MediaItem(kind, (await self.fetch(url, param)).data, param))
        return {"type": kind}
