"""A realtime session's settings and items as client events change them (no sockets, no engine).

``session.update`` applies each field alone and reports each bad one (its voice
checked against the model's voices and OpenAI's names, its modalities against
what the model can say); the conversation events (create, retrieve, truncate,
delete) act on the session's items. The socket loop (``session_loop.py``) sends what
these return.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from omnistage.audio.smart_turn import EXTRA_HINT
from omnistage.entrypoints.openai.common.errors import quoted
from omnistage.entrypoints.openai.common.voice_names import UnknownVoice, VoiceBook
from omnistage.entrypoints.openai.engine_protocol import OmniEngine
from omnistage.entrypoints.openai.realtime.beta import beta_shaped
from omnistage.entrypoints.openai.realtime.budget import SessionMeter
from omnistage.entrypoints.openai.realtime.items import Conversation, Item, ParsedItem, parse_item
from omnistage.entrypoints.openai.realtime.protocol import (
    EventError,
    SessionConfig,
    event_id,
    server_event,
    update_session,
)
from omnistage.entrypoints.openai.server_config import ServerLimits
from omnistage.processing.prompt import AUDIO_SAMPLE_RATE


def check_output(engine: OmniEngine, voices: VoiceBook, modalities: tuple[str, ...], voice: str, where: str,
                 event: str | None) -> str:
    """The speaker ``voice`` names; an error when the output cannot be made."""
    if "audio" in modalities and not engine.supports_audio:
        raise EventError("audio_not_supported", "this model is served text-only (its checkpoint has no "
                         "talker/code2wav); set output_modalities to ['text']", f"{where}.output_modalities", event)
    try:
        return voices.resolve(voice)
    except UnknownVoice as exc:
        if "audio" not in modalities:
            return voice
        raise EventError("invalid_voice", str(exc), f"{where}.audio.output.voice", event) from exc


# A speech recogniser (Qwen3-ASR) writes down what it hears and answers nothing.
RECOGNISER_ONLY = ("this model is a speech recogniser: its sessions only transcribe (session.type 'transcription', "
                   "or ?intent=transcription)")


class SessionState:
    def __init__(self, engine: OmniEngine, voices: VoiceBook, limits: ServerLimits, beta: bool,
                 kind: str = "realtime", meter: SessionMeter | None = None, semantic_vad: bool = True) -> None:
        """``meter``: where the conversation's items are charged (the server's realtime budget); ``semantic_vad``:
        the server has its classifier (else asking for it is an error and the turn detection stays)."""
        self.engine, self.voices, self.limits, self.beta = engine, voices, limits, beta
        self.semantic_vad = semantic_vad
        modalities = ("text", "audio") if engine.supports_audio else ("text",)
        # A family whose talker was trained under one system prompt (Qwen2.5-Omni) gets it until the client says.
        self.config = SessionConfig(voice=voices.default, output_modalities=modalities, kind=kind,
                                    instructions=engine.front_end.spoken_system_prompt)
        self.conversation = Conversation(max_audio_samples=int(limits.max_session_audio_seconds * AUDIO_SAMPLE_RATE),
                                         meter=meter)
        self.updates = 0

    def update(self, event: dict[str, Any], buffered: bool) -> list[EventError]:
        """Applies ``session.update``; the errors of the fields left as they were. ``buffered``: the input buffer
        holds audio (its format cannot change then)."""
        session = event.get("session")
        if self.updates == 0 and beta_shaped(session):
            self.beta = True
        self.updates += 1
        old = self.config
        config, errors = update_session(old, event)
        eid = event_id(event)

        def keep(name: str, error: EventError) -> None:
            nonlocal config
            config = replace(config, **{name: getattr(old, name)})
            errors.append(error)

        if len(config.instructions) > self.limits.max_instructions_chars:
            keep("instructions", EventError("input_too_long", f"instructions are {len(config.instructions)} characters;"
                                            f" the limit is {self.limits.max_instructions_chars} "
                                            "(--max-instructions-chars)", "session.instructions", eid))
        if config.kind != "transcription" and self.engine.front_end.processor is None:
            keep("kind", EventError("invalid_value", RECOGNISER_ONLY, "session.type", eid))
        if config.input_format != old.input_format and buffered:
            keep("input_format", EventError("invalid_value", "the input format cannot change while the buffer holds "
                                            "audio; commit or clear it first", "session.audio.input.format", eid))
        if config.turn_detection is not None and config.turn_detection.semantic and not self.semantic_vad:
            keep("turn_detection", EventError("semantic_vad_unavailable", "semantic_vad needs the Smart Turn "
                                              f"classifier, which this server lacks: {EXTRA_HINT}; the turn detection "
                                              "is unchanged", "session.audio.input.turn_detection", eid))
        try:
            check_output(self.engine, self.voices, config.output_modalities, config.voice, "session", eid)
        except EventError as exc:
            keep("output_modalities" if exc.code == "audio_not_supported" else "voice", exc)
        voice = self.voices.resolve(config.voice) if config.voice.lower() in map(str.lower, self.voices.names) \
            else config.voice
        self.config = replace(config, voice=voice)
        return errors

    # -- items -----------------------------------------------------------------------------------
    def parse_item(self, event: dict[str, Any]) -> ParsedItem:
        """``conversation.item.create``'s item, checked; its audio left for the caller to decode off the loop."""
        parsed = parse_item(event.get("item"), self.config.input_format, self.limits.max_audio_seconds)
        item = parsed.item
        if len(item.text) + len(item.output) + len(item.arguments) > self.limits.max_text_chars:
            raise EventError("input_too_long", f"the item holds more than {self.limits.max_text_chars} characters "
                             "(--max-text-chars)", "item.content")
        previous = event.get("previous_item_id")
        if previous is not None and not isinstance(previous, str):
            raise EventError("invalid_value", "previous_item_id must be a string", "previous_item_id")
        return parsed

    def add_item(self, item: Item, event: dict[str, Any]) -> str | None:
        """Places a created item where ``event`` says; the id before it."""
        return self.conversation.add(item, event.get("previous_item_id"))

    def item_events(self, item: Item, previous: str | None) -> list[dict[str, Any]]:
        """What the server says when an item joins the conversation: first the older audio items it pushed out of
        the session's bound (``--max-session-audio-seconds``), as ``conversation.item.deleted``."""
        evicted, self.conversation.evicted = self.conversation.evicted, []
        return [*(server_event("conversation.item.deleted", item_id=gone) for gone in evicted),
                server_event("conversation.item.added", previous_item_id=previous, item=item.describe()),
                server_event("conversation.item.done", previous_item_id=previous, item=item.describe())]

    def retrieve(self, event: dict[str, Any]) -> dict[str, Any]:
        item = self.conversation.find(str(event.get("item_id")))
        if item is None:
            raise EventError("item_not_found", f"no item {quoted(event.get('item_id'))}", "item_id")
        return server_event("conversation.item.retrieved", item=item.describe())

    def truncate(self, event: dict[str, Any]) -> dict[str, Any]:
        item_id, end = str(event.get("item_id")), event.get("audio_end_ms")
        content_index = event.get("content_index", 0)
        if content_index != 0:
            raise EventError("invalid_value", "an assistant message has one content part: content_index 0",
                             "content_index")
        self.conversation.truncate(item_id, end)  # type: ignore[arg-type] - checked there
        return server_event("conversation.item.truncated", item_id=item_id, content_index=0, audio_end_ms=end)

    def delete(self, event: dict[str, Any]) -> dict[str, Any]:
        item_id = str(event.get("item_id"))
        self.conversation.delete(item_id)
        return server_event("conversation.item.deleted", item_id=item_id)
