"""Event shapes of ``WS /v1/realtime``, after OpenAI's Realtime API (GA names; the beta spellings too).

Client events are JSON objects with a ``type``; a malformed one raises
:class:`EventError`, which the session answers with an ``error`` event (its
``code`` says what was wrong, ``param`` where) and then keeps reading. Server
events are built by :func:`server_event` so every one carries an ``event_id``.
The audio formats are in ``audio_formats.py``, ``EventError`` in ``event_error.py``.
``session.update`` applies each field on its own: a bad field is reported in an
``error`` naming it while the others take effect.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field, replace
from typing import Any

from omnistage.audio.g711 import G711_RATE
from omnistage.core import Usage
from omnistage.entrypoints.openai.common.errors import quoted, scrub_reprs
from omnistage.entrypoints.openai.common.json_text import LONE_SURROGATE, lone_surrogate
from omnistage.entrypoints.openai.common.metadata import metadata_fault
from omnistage.entrypoints.openai.realtime.audio_formats import (
    DEFAULT_INPUT_RATE,
    OUTPUT_RATE,
    PCM_RATES,
    InputFormat,
    OutputFormat,
    format_kind,
)
from omnistage.entrypoints.openai.realtime.event_error import EventError, event_id
from omnistage.entrypoints.openai.realtime.event_types import COMMON, EVENTS, SESSION, mistyped, without
from omnistage.entrypoints.openai.realtime.truncation import Truncation, parse_truncation
from omnistage.entrypoints.openai.realtime.turn_detection import TurnDetection, parse_turn_detection

CLIENT_EVENTS = ("session.update", "input_audio_buffer.append", "input_audio_buffer.commit",
                 "input_audio_buffer.clear", "conversation.item.create", "conversation.item.retrieve",
                 "conversation.item.truncate", "conversation.item.delete", "response.create", "response.cancel",
                 "output_audio_buffer.clear")
# What a transcription session has no use for: it keeps no conversation and never answers.
CONVERSATION_EVENTS = frozenset({"conversation.item.create", "conversation.item.retrieve", "conversation.item.truncate",
                                 "conversation.item.delete", "response.create", "response.cancel",
                                 "output_audio_buffer.clear"})


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:20]}"


def server_event(type_: str, **fields: Any) -> dict[str, Any]:
    return {"type": type_, "event_id": new_id("event"), **fields}


def error_event(exc: EventError) -> dict[str, Any]:
    return server_event("error", error={"type": exc.error_type, "code": exc.code, "message": scrub_reprs(str(exc)),
                                        "param": exc.param, "event_id": exc.event_id})


def transcript_usage(usage: Usage) -> dict[str, Any]:
    """``conversation.item.input_audio_transcription.completed``'s ``usage`` (required by OpenAI's SDKs): the
    thinker's tokens, as OpenAI bills its token-based transcription models."""
    return {"type": "tokens", "input_tokens": usage.prompt_tokens, "output_tokens": usage.completion_tokens,
            "total_tokens": usage.total_tokens}


def json_event(raw: str | bytes) -> dict[str, Any]:
    """One client event's JSON object with a string ``type`` (also GPT-Live's: ``live/events.py``)."""
    try:
        event = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise EventError("invalid_json", f"the event is not valid JSON: {exc}") from exc
    except RecursionError:
        raise EventError("invalid_json", "the event is nested too deep to read") from None
    if lone_surrogate(raw):
        raise EventError("invalid_json", LONE_SURROGATE)
    if not isinstance(event, dict):
        raise EventError("invalid_event", "an event must be a JSON object")
    if not isinstance(event.get("type"), str):
        raise EventError("invalid_event", "the event has no string 'type'", param="type", event_id=event_id(event))
    return event


def parse_event(raw: str | bytes) -> dict[str, Any]:
    event = json_event(raw)
    kind = event["type"]
    if kind not in CLIENT_EVENTS:
        raise EventError("unknown_event_type", f"unknown event type {quoted(kind)} (known: {', '.join(CLIENT_EVENTS)})",
                         param="type", event_id=event_id(event))
    faults = mistyped(event, {**COMMON, **EVENTS.get(kind, {})})
    if faults:
        raise EventError("invalid_type", faults[0].message, faults[0].param, event_id(event))
    return event


@dataclass(frozen=True)
class SessionConfig:
    """What ``session.update`` sets. ``voice``/``output_modalities`` are checked against the engine by the caller."""

    voice: str = "Ethan"
    output_modalities: tuple[str, ...] = ("text", "audio")
    instructions: str = ""
    turn_detection: TurnDetection | None = field(default_factory=TurnDetection)  # OpenAI's default: server VAD
    input_format: InputFormat = field(default_factory=InputFormat)
    output_format: OutputFormat = field(default_factory=OutputFormat)
    max_output_tokens: int | None = None  # None: what the context leaves ("inf")
    temperature: float | None = None
    tools: tuple[dict[str, Any], ...] = ()
    tool_choice: str | dict[str, Any] = "auto"
    transcription: dict[str, Any] | None = None  # None: no input transcription events (in a realtime session)
    kind: str = "realtime"  # "transcription": committed audio is written down, never answered
    truncation: Truncation = field(default_factory=Truncation)  # past the context: drop the oldest items
    streaming_input: bool | None = None  # omnistage's: prefill the turn while it is spoken (None: the server's)
    speculative_reply_ms: int | None = None  # omnistage's: a pause that starts the reply early (speculation.py)

    @property
    def input_rate(self) -> int:
        return self.input_format.rate

    @property
    def transcribes(self) -> bool:
        return self.transcription is not None or self.kind == "transcription"

    def describe(self, session_id: str, model: str, beta: bool = False) -> dict[str, Any]:
        detection = None if self.turn_detection is None else self.turn_detection.describe()
        if self.kind == "transcription":  # the shape of OpenAI's RealtimeTranscriptionSessionCreateRequest
            return {"id": session_id, "object": "realtime.transcription_session", "type": "transcription",
                    "audio": {"input": {"format": self.input_format.describe(False), "turn_detection": detection,
                                        "transcription": self.transcription or {"model": model},
                                        "noise_reduction": None}}, "include": None}
        common = {"id": session_id, "instructions": self.instructions, "tools": list(self.tools),
                  "tool_choice": self.tool_choice}
        tokens = "inf" if self.max_output_tokens is None else self.max_output_tokens
        if beta:  # beta's session.model is a closed list of OpenAI's models: a served name would fail its check
            return {**common, "object": "realtime.session", "modalities": list(self.output_modalities),
                    "voice": self.voice, "input_audio_format": self.input_format.describe(True),
                    "output_audio_format": self.output_format.describe(True), "turn_detection": detection,
                    "input_audio_transcription": self.transcription, "max_response_output_tokens": tokens,
                    "temperature": 0.8 if self.temperature is None else self.temperature}
        return {**common, "model": model, "object": "realtime.session", "type": "realtime",
                "output_modalities": list(self.output_modalities), "max_output_tokens": tokens,
                "truncation": self.truncation.describe(),
                "audio": {"input": {"format": self.input_format.describe(False), "turn_detection": detection,
                                    "transcription": self.transcription},
                          "output": {"format": self.output_format.describe(False), "voice": self.voice}}}


def _get(obj: Any, *path: str) -> Any:  # noqa: ANN401 - client JSON
    for key in path:
        if not isinstance(obj, dict) or key not in obj:
            return None
        obj = obj[key]
    return obj


def _modalities(value: Any, param: str) -> tuple[str, ...]:  # noqa: ANN401
    if not isinstance(value, list) or not value or any(m not in ("text", "audio") for m in value):
        raise EventError("invalid_value", f"{param} must be a non-empty list of 'text' and/or 'audio'", param)
    return tuple(dict.fromkeys(value))


def _max_tokens(value: Any, param: str) -> int | None:  # noqa: ANN401
    if value == "inf" or value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise EventError("invalid_value", f"{param} must be a positive integer or 'inf'", param)
    return value


def _tools(value: Any, param: str) -> tuple[dict[str, Any], ...]:  # noqa: ANN401
    if not isinstance(value, list) or not all(isinstance(t, dict) and t.get("type", "function") == "function"
                                              and isinstance(t.get("name"), str) and t["name"] for t in value):
        raise EventError("invalid_value", f"{param} must be a list of {{'type': 'function', 'name': ...}}", param)
    return tuple(value)


def _tool_choice(value: Any, param: str) -> str | dict[str, Any]:  # noqa: ANN401
    if value in ("auto", "none", "required"):
        return value
    if isinstance(value, dict) and value.get("type") == "function" and isinstance(value.get("name"), str):
        return value
    raise EventError("invalid_value", f"{param} must be auto, none, required or {{'type': 'function', 'name'}}",
                     param)


def _string(value: Any, param: str) -> str:  # noqa: ANN401
    if not isinstance(value, str):
        raise EventError("invalid_value", f"{param} must be a string", param)
    return value


def _temperature(value: Any, param: str) -> float:  # noqa: ANN401
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 2.0:
        raise EventError("invalid_value", f"{param} must be in [0, 2]", param)
    return float(value)


def _speculative_ms(value: Any, param: str) -> int:  # noqa: ANN401
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise EventError("invalid_value", f"{param} must be a non-negative integer (0: no speculative reply)", param)
    return value


def _input_format(value: Any, param: str) -> InputFormat:  # noqa: ANN401
    kind, rate = format_kind(value, param)
    if kind != "pcm16":
        return InputFormat(kind, G711_RATE)
    rate = DEFAULT_INPUT_RATE if rate is None else rate
    if rate not in PCM_RATES:
        raise EventError("invalid_value", f"input rate must be one of {PCM_RATES} Hz, got {quoted(rate)}",
                         f"{param}.rate")
    return InputFormat("pcm16", int(rate))


def _output_format(value: Any, param: str) -> OutputFormat:  # noqa: ANN401
    kind, rate = format_kind(value, param)
    if kind == "pcm16" and rate not in (None, OUTPUT_RATE):
        raise EventError("invalid_value", f"output audio/pcm is {OUTPUT_RATE} Hz", f"{param}.rate")
    return OutputFormat(kind)


def _truncation(value: Any, param: str) -> Truncation:  # noqa: ANN401
    try:
        return parse_truncation(value)
    except ValueError as exc:
        raise EventError("invalid_value", f"{param}: {exc}", param) from exc


def _kind(value: Any, param: str) -> str:  # noqa: ANN401
    if value not in ("realtime", "transcription"):
        raise EventError("invalid_value", f"{param} must be 'realtime' or 'transcription'", param)
    return value


def _transcription(value: Any, param: str) -> dict[str, Any] | None:  # noqa: ANN401
    if value is not None and not isinstance(value, dict):
        raise EventError("invalid_value", f"{param} must be null or an object", param)
    return value


def session_fields(session: dict[str, Any]) -> list[tuple[str, str, Any]]:  # noqa: ANN401
    """``(config field, param, raw value)`` for each field the update sets, GA or beta spelling."""
    audio_in, audio_out = _get(session, "audio", "input") or {}, _get(session, "audio", "output") or {}
    found: list[tuple[str, str, Any]] = []

    def pick(name: str, *where: tuple[dict[str, Any], str, str]) -> None:
        for holder, key, param in where:
            if isinstance(holder, dict) and key in holder:
                found.append((name, param, holder[key]))
                return

    pick("kind", (session, "type", "session.type"))
    pick("voice", (audio_out, "voice", "session.audio.output.voice"), (session, "voice", "session.voice"))
    pick("output_modalities", (session, "output_modalities", "session.output_modalities"),
         (session, "modalities", "session.modalities"))
    pick("instructions", (session, "instructions", "session.instructions"))
    pick("turn_detection", (audio_in, "turn_detection", "session.audio.input.turn_detection"),
         (session, "turn_detection", "session.turn_detection"))
    pick("input_format", (audio_in, "format", "session.audio.input.format"),
         (session, "input_audio_format", "session.input_audio_format"))
    pick("output_format", (audio_out, "format", "session.audio.output.format"),
         (session, "output_audio_format", "session.output_audio_format"))
    pick("transcription", (audio_in, "transcription", "session.audio.input.transcription"),
         (session, "input_audio_transcription", "session.input_audio_transcription"))
    pick("max_output_tokens", (session, "max_output_tokens", "session.max_output_tokens"),
         (session, "max_response_output_tokens", "session.max_response_output_tokens"))
    pick("temperature", (session, "temperature", "session.temperature"))
    pick("tools", (session, "tools", "session.tools"))
    pick("tool_choice", (session, "tool_choice", "session.tool_choice"))
    pick("truncation", (session, "truncation", "session.truncation"))
    pick("streaming_input", (session, "streaming_input", "session.streaming_input"))
    pick("speculative_reply_ms", (session, "speculative_reply_ms", "session.speculative_reply_ms"))
    return found


def update_session(config: SessionConfig, event: dict[str, Any]) -> tuple[SessionConfig, list[EventError]]:
    """``session.update``: each field applied alone; the errors of those that could not be, each naming its field."""
    session = event.get("session")
    if not isinstance(session, dict):
        raise EventError("invalid_event", "session.update needs a 'session' object", "session", event_id(event))
    parsers = {"kind": _kind, "voice": _string, "output_modalities": _modalities, "instructions": _string,
               "turn_detection": lambda v, p: parse_turn_detection(v, config.turn_detection, p),
               "input_format": _input_format, "output_format": _output_format, "transcription": _transcription,
               "max_output_tokens": _max_tokens, "temperature": _temperature, "tools": _tools,
               "tool_choice": _tool_choice, "truncation": _truncation, "streaming_input": lambda v, p: v,
               "speculative_reply_ms": _speculative_ms}
    faults = mistyped({"session": session}, {"session": SESSION})  # each mistyped field fails alone, too
    session = without({"session": session}, faults).get("session", {})
    changes: dict[str, Any] = {}
    errors = [EventError("invalid_type", f.message, f.param, event_id(event)) for f in faults]
    for name, param, raw in session_fields(session):
        try:
            changes[name] = parsers[name](raw, param)
        except EventError as exc:
            exc.event_id = event_id(event)
            errors.append(exc)
    return replace(config, **changes), errors


@dataclass(frozen=True)
class ResponseOptions:
    """One response: its output, instructions, tools; ``in_conversation`` False for an out-of-band response
    (``conversation: "none"``), ``input`` the items it answers instead of the conversation (None: the
    conversation)."""

    output_modalities: tuple[str, ...]
    instructions: str
    max_output_tokens: int | None
    tools: tuple[dict[str, Any], ...] = ()
    tool_choice: str | dict[str, Any] = "auto"
    in_conversation: bool = True
    input: list[Any] | None = None
    metadata: dict[str, Any] | None = None


def response_options(config: SessionConfig, event: dict[str, Any]) -> ResponseOptions:
    """``response.create``'s per-response overrides of the session."""
    response = event.get("response") or {}
    if not isinstance(response, dict):
        raise EventError("invalid_event", "'response' must be an object", "response", event_id(event))
    try:
        modalities = response.get("output_modalities", response.get("modalities"))
        max_tokens = response.get("max_output_tokens", response.get("max_response_output_tokens"))
        instructions = response.get("instructions")
        conversation = response.get("conversation", "auto")
        items = response.get("input")
        if conversation not in ("auto", "none"):
            raise EventError("invalid_value", "response.conversation must be 'auto' or 'none'", "response.conversation")
        if items is not None and not isinstance(items, list):
            raise EventError("invalid_value", "response.input must be a list of items", "response.input")
        fault = metadata_fault(response.get("metadata"))  # echoed in response.done: bounded as OpenAI bounds it
        if fault is not None:
            raise EventError("invalid_value", fault, "response.metadata")
        return ResponseOptions(
            output_modalities=config.output_modalities if modalities is None
            else _modalities(modalities, "response.output_modalities"),
            instructions=config.instructions if instructions is None
            else _string(instructions, "response.instructions"),
            max_output_tokens=config.max_output_tokens if max_tokens is None
            else _max_tokens(max_tokens, "response.max_output_tokens"),
            tools=config.tools if "tools" not in response else _tools(response["tools"], "response.tools"),
            tool_choice=config.tool_choice if "tool_choice" not in response
            else _tool_choice(response["tool_choice"], "response.tool_choice"),
            in_conversation=conversation == "auto", input=items,
            metadata=response.get("metadata"),
        )
    except EventError as exc:
        exc.event_id = event_id(event)
        raise
