"""A realtime session's engine requests: a response's (its items rendered with the chat template, fitted to
the context, its sampling) and the one-token prefill streaming input sends while the user speaks.

Both render the conversation the same way, so a prefill's prompt is the response's prompt cut where the
user's audio so far ends: the thinker's prefix cache serves the response what the prefill computed.
"""

from __future__ import annotations

from dataclasses import dataclass

from omnistage.core import Modality, OmniRequest, UnspokenSpan
from omnistage.entrypoints.openai.common.decode_pool import DecodePool
from omnistage.entrypoints.openai.common.errors import APIError
from omnistage.entrypoints.openai.common.request_budget import turns_over_budget
from omnistage.entrypoints.openai.common.request_checks import completion_budget, make_sampling
from omnistage.entrypoints.openai.common.tool_calls import ToolSetup, tool_setup
from omnistage.entrypoints.openai.engine_protocol import OmniEngine
from omnistage.entrypoints.openai.realtime.conversation import PromptSpec, chat_tools, render_prompt_job
from omnistage.entrypoints.openai.realtime.items import Conversation, Item, decoded, parse_item
from omnistage.entrypoints.openai.realtime.protocol import EventError, ResponseOptions, new_id, response_options
from omnistage.entrypoints.openai.realtime.session import SessionState
from omnistage.entrypoints.openai.realtime.truncation import Truncation, fit_prompt
from omnistage.entrypoints.openai.server_config import ServerLimits
from omnistage.processing.listened_audio import ListenedAudio
from omnistage.processing.prompt import AUDIO_SAMPLE_RATE, ProcessedPrompt

DEFAULT_MAX_OUTPUT_TOKENS = 4096  # a response's cap when the session says "inf" (the context may allow more)


@dataclass(frozen=True)
class TurnRequests:
    engine: OmniEngine
    limits: ServerLimits
    pool: DecodePool
    state: SessionState  # the session's settings and conversation (read when a request is built)
    first_chunk_frames: int | None = None  # codec frames in a reply's first code2wav chunk (None: the stage's)

    async def items(self, options: ResponseOptions, conversation: Conversation | None = None) -> tuple[Item, ...]:
        """The response's items: its own ``input`` (its audio decoded in the pool), else the conversation's (the
        session's, or ``conversation``) within the server's budget."""
        if options.input is not None:
            fmt, seconds = self.state.config.input_format, self.limits.max_audio_seconds
            return await decoded([parse_item(i, fmt, seconds) for i in options.input], fmt, self.pool, self.limits)
        items = (self.state.conversation if conversation is None else conversation).items
        sizes = [(len(i.text) + len(i.output) + len(i.arguments),
                  0.0 if i.audio is None else len(i.audio) / AUDIO_SAMPLE_RATE) for i in items]
        # Past --max-text-chars or --max-audio-seconds the oldest items are dropped, as OpenAI truncates a
        # conversation past its context: neither a response's work nor the session's memory grows without bound.
        del items[:turns_over_budget(sizes, self.limits)]
        return tuple(items)

    @staticmethod
    def tools(options: ResponseOptions) -> ToolSetup:
        """The response's tools in chat completions' shape, and how their calls are parsed."""
        choice = options.tool_choice
        if isinstance(choice, dict):
            choice = {"type": "function", "function": {"name": choice["name"]}}
        try:
            return tool_setup(chat_tools(options.tools) or None, choice, True)
        except ValueError as exc:
            raise EventError("invalid_value", str(exc), "tool_choice") from exc

    async def response(self, options: ResponseOptions, items: tuple[Item, ...], tools: ToolSetup,
                       event_id: str | None) -> OmniRequest:
        """The response's engine request: the items rendered (the oldest dropped past the context, as the
        session's truncation says, from the session too) and its sampling."""
        request, dropped = await self.build(options, items, tools, event_id)
        self.drop(options, dropped)
        return request

    def drop(self, options: ResponseOptions, dropped: tuple[Item, ...]) -> None:
        """The items a response's prompt left out to fit the context leave the session (its memory stays bounded),
        once the response is sure to run: a refused one drops nothing."""
        if dropped and options.in_conversation:
            self.state.conversation.drop(dropped)

    async def build(self, options: ResponseOptions, items: tuple[Item, ...], tools: ToolSetup,
                    event_id: str | None) -> tuple[OmniRequest, tuple[Item, ...]]:
        """``response``'s request and the items its prompt dropped, the session left as it is."""
        requested = options.max_output_tokens
        try:
            prompt, dropped = await self.fit(options, items, tools)
        except ValueError as exc:
            raise EventError("invalid_prompt", f"could not build the prompt: {exc}", event_id=event_id) from exc
        try:
            budget = completion_budget(requested, len(prompt.token_ids), self.engine.max_model_len,
                                       "max_output_tokens")
            sampling = make_sampling(max_tokens=budget if requested else min(budget, DEFAULT_MAX_OUTPUT_TOKENS),
                                     defaults=self.engine.default_sampling, temperature=self.state.config.temperature)
        except APIError as exc:
            raise EventError(exc.detail.code or "invalid_request", exc.detail.message, exc.detail.param,
                             event_id) from exc
        modalities, unspoken = self.output(options, tools)
        return OmniRequest(request_id=new_id("resp"), prompt=prompt, modalities=modalities, sampling=sampling,
                           voice=self.state.config.voice, unspoken=unspoken,
                           initial_codec_chunk_frames=self.first_chunk_frames), items[:dropped]

    async def fit(self, options: ResponseOptions, items: tuple[Item, ...],
                  tools: ToolSetup) -> tuple[ProcessedPrompt, int]:
        """The items' prompt, fitted to the context as the session's truncation says (a response with its own
        ``input`` is never truncated), and how many of the oldest items it left out."""
        async def render(kept: tuple[Item, ...]) -> ProcessedPrompt:
            spec = PromptSpec(options.instructions, kept, tools.tools, tools.prefix)
            return await self.pool.run(render_prompt_job, self.engine.front_end.processor, spec)

        truncation = self.state.config.truncation if options.input is None else Truncation("disabled")
        return await fit_prompt(items, render, truncation, self.engine.max_model_len - self.reserve(options))

    def reserve(self, options: ResponseOptions) -> int:
        """The answer's room, kept free when the conversation is truncated: its own cap, else a share of the
        context."""
        return options.max_output_tokens or min(DEFAULT_MAX_OUTPUT_TOKENS, self.engine.max_model_len // 4)

    def output(self, options: ResponseOptions, tools: ToolSetup) -> tuple[frozenset[Modality], UnspokenSpan | None]:
        """A response's modalities and the text its talker must not speak (tool calls), when it speaks."""
        if "audio" not in options.output_modalities:
            return frozenset({Modality.TEXT}), None
        unspoken = tools.unspoken(getattr(self.engine.front_end.processor, "tokenizer", None))
        return frozenset({Modality.TEXT, Modality.AUDIO}), unspoken

    async def prefill(self, audio: ListenedAudio | None) -> OmniRequest | None:
        """The prompt the VAD's response would get if the user stopped at ``audio``'s end, as a one-token
        request: what streaming input prefills while the user speaks (``listening.py``). ``audio`` None: the
        conversation so far and the live turn's header (its message text-only and empty: the template renders
        the earlier items as it will once the audio is there); None when nothing comes before the live turn.
        When the response will speak, the request asks for audio too, prefill-only: the talker prefills its
        prompt (the turn's user rows) into its cache as well, and no audio is made."""
        options = response_options(self.state.config, {})
        earlier = await self.items(options)
        if audio is None and not earlier and not options.instructions:
            return None
        live = (Item(new_id("item"), "message", role="user") if audio is None else
                Item(new_id("item"), "message", role="user", audio=audio.samples, listened=audio))
        tools = self.tools(options)
        # Fitted as the response will be (the oldest items dropped past the context, with the same room kept for
        # the answer), so its cache serves the response; a prompt past the context ("disabled") is not sent.
        prompt, _ = await self.fit(options, (*earlier, live), tools)
        if len(prompt.token_ids) >= self.engine.max_model_len:
            return None
        sampling = make_sampling(max_tokens=1, defaults=self.engine.default_sampling, temperature=0.0)
        # A prefill is never worth an error: on an engine without audio stages it warms the thinker alone.
        speaks = self.engine.supports_audio
        modalities, unspoken = self.output(options, tools) if speaks else (frozenset({Modality.TEXT}), None)
        return OmniRequest(request_id=new_id("prefill"), prompt=prompt, modalities=modalities, sampling=sampling,
                           voice=self.state.config.voice, unspoken=unspoken,
                           prefill_only=Modality.AUDIO in modalities)
