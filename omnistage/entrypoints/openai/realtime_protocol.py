"""Event shapes of ``WS /v1/realtime``, after OpenAI's Realtime API (GA names, beta spellings accepted).

Client events are JSON objects with a ``type``; a malformed one raises
:class:`EventError`, which the session answers with an ``error`` event (its
``code`` says what was wrong) and then keeps reading. Server events are built by
the small functions below so every one carries an ``event_id``.
"""

from __future__ import annotations

import base64
import binascii
import json
import uuid
from dataclasses import dataclass, replace
from typing import Any

from omnistage.audio.vad import VadConfig

INPUT_RATES = (16000, 24000)  # PCM16 mono rates accepted by input_audio_buffer.append
DEFAULT_INPUT_RATE = 24000  # OpenAI's pcm16 rate
CLIENT_EVENTS = ("session.update", "input_audio_buffer.append", "input_audio_buffer.commit",
                 "input_audio_buffer.clear", "conversation.item.create", "response.create", "response.cancel")


class EventError(ValueError):
    """A client event the session cannot act on; becomes an ``error`` server event. ``error_type`` is
    ``server_error`` when the event was fine but the server cannot take it now (overloaded)."""

    def __init__(self, code: str, message: str, param: str | None = None, event_id: str | None = None,
                 error_type: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.code, self.param, self.event_id, self.error_type = code, param, event_id, error_type


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:20]}"


def server_event(type_: str, **fields: Any) -> dict[str, Any]:
    return {"type": type_, "event_id": new_id("event"), **fields}


def error_event(exc: EventError) -> dict[str, Any]:
    return server_event("error", error={"type": exc.error_type, "code": exc.code, "message": str(exc),
                                        "param": exc.param, "event_id": exc.event_id})


def parse_event(raw: str | bytes) -> dict[str, Any]:
    try:
        event = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise EventError("invalid_json", f"the event is not valid JSON: {exc}") from exc
    if not isinstance(event, dict):
        raise EventError("invalid_event", "an event must be a JSON object")
    kind = event.get("type")
    if not isinstance(kind, str):
        raise EventError("invalid_event", "the event has no string 'type'", param="type",
                         event_id=_event_id(event))
    if kind not in CLIENT_EVENTS:
        raise EventError("unknown_event_type", f"unknown event type {kind!r} (known: {', '.join(CLIENT_EVENTS)})",
                         param="type", event_id=_event_id(event))
    return event


def _event_id(event: dict[str, Any]) -> str | None:
    value = event.get("event_id")
    return value if isinstance(value, str) else None


def decode_pcm16(event: dict[str, Any]) -> bytes:
    data = event.get("audio")
    if not isinstance(data, str):
        raise EventError("invalid_event", "input_audio_buffer.append needs 'audio' (base64 PCM16)", "audio",
                         _event_id(event))
    try:
        pcm = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise EventError("invalid_audio", f"'audio' is not valid base64: {exc}", "audio", _event_id(event)) from exc
    if len(pcm) % 2:
        raise EventError("invalid_audio", "'audio' must be 16-bit PCM (an even number of bytes)", "audio",
                         _event_id(event))
    return pcm


@dataclass(frozen=True)
class SessionConfig:
    """What ``session.update`` sets. ``voice``/``output_modalities`` are checked against the engine by the caller."""

    voice: str = "Ethan"
    output_modalities: tuple[str, ...] = ("text", "audio")
    instructions: str = ""
    turn_detection: VadConfig | None = None  # None: the client commits turns itself
    input_rate: int = DEFAULT_INPUT_RATE
    max_output_tokens: int | None = None  # None: what the context leaves ("inf")
    temperature: float | None = None
    create_response: bool = True  # server_vad starts a response at end of speech

    def describe(self, session_id: str, model: str) -> dict[str, Any]:
        vad = self.turn_detection
        detection = None if vad is None else {
            "type": "server_vad", "threshold": vad.threshold, "silence_duration_ms": vad.silence_duration_ms,
            "prefix_padding_ms": vad.prefix_padding_ms, "create_response": self.create_response}
        return {
            "id": session_id, "object": "realtime.session", "type": "realtime", "model": model,
            "output_modalities": list(self.output_modalities), "instructions": self.instructions,
            "max_output_tokens": "inf" if self.max_output_tokens is None else self.max_output_tokens,
            "audio": {
                "input": {"format": {"type": "audio/pcm", "rate": self.input_rate}, "turn_detection": detection},
                "output": {"format": {"type": "audio/pcm", "rate": 24000}, "voice": self.voice},
            },
        }


def _get(obj: dict[str, Any], *path: str) -> Any:
    for key in path:
        if not isinstance(obj, dict) or key not in obj:
            return None
        obj = obj[key]
    return obj


def _modalities(value: Any, param: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not value or any(m not in ("text", "audio") for m in value):
        raise EventError("invalid_value", f"{param} must be a non-empty list of 'text' and/or 'audio'", param)
    return tuple(dict.fromkeys(value))


def _max_tokens(value: Any, param: str) -> int | None:
    if value == "inf":
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise EventError("invalid_value", f"{param} must be a positive integer or 'inf'", param)
    return value


def _vad(value: Any, current: VadConfig | None, param: str) -> VadConfig | None:
    if value is None:
        return None
    if not isinstance(value, dict) or value.get("type", "server_vad") != "server_vad":
        raise EventError("invalid_value", f"{param} must be null or {{'type': 'server_vad', ...}}", param)
    base = current or VadConfig()
    known = {k: value[k] for k in ("threshold", "silence_duration_ms", "prefix_padding_ms") if k in value}
    try:
        return replace(base, **known)
    except (TypeError, ValueError) as exc:
        raise EventError("invalid_value", f"{param}: {exc}", param) from exc


def update_session(config: SessionConfig, event: dict[str, Any]) -> SessionConfig:
    """``session.update``: GA fields (``audio.input.*``, ``audio.output.voice``) or their beta spellings."""
    session = event.get("session")
    if not isinstance(session, dict):
        raise EventError("invalid_event", "session.update needs a 'session' object", "session", _event_id(event))
    changes: dict[str, Any] = {}
    try:
        voice = _get(session, "audio", "output", "voice") or session.get("voice")
        if voice is not None:
            if not isinstance(voice, str):
                raise EventError("invalid_value", "voice must be a string", "session.audio.output.voice")
            changes["voice"] = voice
        modalities = session.get("output_modalities", session.get("modalities"))
        if modalities is not None:
            changes["output_modalities"] = _modalities(modalities, "session.output_modalities")
        if "instructions" in session:
            if not isinstance(session["instructions"], str):
                raise EventError("invalid_value", "instructions must be a string", "session.instructions")
            changes["instructions"] = session["instructions"]
        audio_input = _get(session, "audio", "input") or {}
        if "turn_detection" in audio_input or "turn_detection" in session:
            raw = audio_input["turn_detection"] if "turn_detection" in audio_input else session["turn_detection"]
            changes["turn_detection"] = _vad(raw, config.turn_detection, "session.audio.input.turn_detection")
            if isinstance(raw, dict) and "create_response" in raw:
                changes["create_response"] = bool(raw["create_response"])
        rate = _get(audio_input, "format", "rate")
        if rate is not None:
            if rate not in INPUT_RATES:
                raise EventError("invalid_value", f"input rate must be one of {INPUT_RATES} Hz, got {rate!r}",
                                 "session.audio.input.format.rate")
            changes["input_rate"] = int(rate)
        for key in ("max_output_tokens", "max_response_output_tokens"):
            if key in session:
                changes["max_output_tokens"] = _max_tokens(session[key], f"session.{key}")
        if "temperature" in session:
            temperature = session["temperature"]
            if not isinstance(temperature, (int, float)) or not 0.0 <= temperature <= 2.0:
                raise EventError("invalid_value", "temperature must be in [0, 2]", "session.temperature")
            changes["temperature"] = float(temperature)
    except EventError as exc:
        exc.event_id = _event_id(event)
        raise
    return replace(config, **changes)


@dataclass(frozen=True)
class ResponseOptions:
    output_modalities: tuple[str, ...]
    instructions: str
    max_output_tokens: int | None


def response_options(config: SessionConfig, event: dict[str, Any]) -> ResponseOptions:
    """``response.create``'s per-response overrides of the session."""
    response = event.get("response") or {}
    if not isinstance(response, dict):
        raise EventError("invalid_event", "'response' must be an object", "response", _event_id(event))
    try:
        modalities = response.get("output_modalities", response.get("modalities"))
        max_tokens = response.get("max_output_tokens", response.get("max_response_output_tokens"))
        instructions = response.get("instructions", config.instructions)
        if not isinstance(instructions, str):
            raise EventError("invalid_value", "instructions must be a string", "response.instructions")
        return ResponseOptions(
            output_modalities=config.output_modalities if modalities is None
            else _modalities(modalities, "response.output_modalities"),
            instructions=instructions,
            max_output_tokens=config.max_output_tokens if max_tokens is None
            else _max_tokens(max_tokens, "response.max_output_tokens"),
        )
    except EventError as exc:
        exc.event_id = _event_id(event)
        raise


def user_text(event: dict[str, Any]) -> str:
    """``conversation.item.create`` with a user message of ``input_text`` parts (text turns)."""
    item = event.get("item")
    content = _get(item, "content") if isinstance(item, dict) else None
    if not isinstance(item, dict) or item.get("type", "message") != "message" or item.get("role") != "user" \
            or not isinstance(content, list):
        raise EventError("invalid_event", "conversation.item.create takes a user message item with content parts",
                         "item", _event_id(event))
    texts = [p.get("text") for p in content if isinstance(p, dict) and p.get("type") == "input_text"]
    if not texts or not all(isinstance(t, str) for t in texts) or len(texts) != len(content):
        raise EventError("invalid_value", "only 'input_text' content parts are accepted here", "item.content",
                         _event_id(event))
    return "".join(texts)
