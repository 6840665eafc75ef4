"""OpenAI's GPT-Live client events (openai 3.57's ``openai.types.live``), read into typed commands.

A client event is a JSON object with a ``type``; :func:`parse_command` checks its fields' JSON kinds (the
realtime API's ``mistyped``, with the Live shapes below) and returns one command. A malformed event raises
:class:`~omnistage.entrypoints.openai.realtime.event_error.EventError`, which the session answers with an
``error`` event and reads on. Events of the protocol this server does not serve (Decisions, Responses
delegation, audio fixtures) parse to :class:`Unsupported`, answered with an error that says why.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from omnistage.entrypoints.openai.common.errors import quoted
from omnistage.entrypoints.openai.realtime.event_error import EventError, event_id
from omnistage.entrypoints.openai.realtime.event_types import Spec, mistyped
from omnistage.entrypoints.openai.realtime.protocol import json_event

DelegationKind = Literal["client", "responses", "decisions"]
ContextKind = Literal["instructions", "thinking", "commentary"]
MAX_INPUT_ITEMS = 128  # OpenAI's cap on session.input
DEFAULT_VOICE = "marin"  # OpenAI's, mapped to a checkpoint speaker by the realtime voice table

_FORMAT: Spec = {"type": "str", "rate": "int"}
_VOICE: Spec = ("str", {"id": "str"})
_ITEM: Spec = {"id": "str", "type": "str", "role": "str", "status": "str",
               "content": [{"type": "str", "text": "str"}]}
_DELEGATION: Spec = {"type": "str", "acknowledgement_delay_ms": "int", "responses": "obj", "decisions": "obj"}
SESSION: Spec = {"model": "str", "instructions": "str", "safety_identifier": "str", "store": "bool",
                 "audio": {"format": _FORMAT, "output": {"voice": _VOICE}}, "input": [_ITEM],
                 "delegation": _DELEGATION, "triggers": "arr", "client": "obj", "idle_timeout_s": "int"}
_COMMON: dict[str, Spec] = {"type": "str", "event_id": "str"}
_APPEND: dict[str, Spec] = {"content": "str", "delegation_id": "str"}
EVENTS: dict[str, dict[str, Spec]] = {
    "session.start": {"session": SESSION},
    "session.update": {"session": {"delegation": _DELEGATION, "triggers": "arr"}},
    "session.input_audio.append": {"audio": "str"},
    "session.input_audio.mute": {},
    "session.input_audio.unmute": {},
    "session.instructions.append": _APPEND,
    "session.thinking.append": _APPEND,
    "session.commentary.append": _APPEND,
    "session.close": {},
}
UNSUPPORTED = {
    "decision.create": "Decisions delegation", "decision.item.create": "Decisions delegation",
    "decision.item.delete": "Decisions delegation", "response.create": "Responses delegation",
    "response.item.create": "Responses delegation", "session.output_audio.fixture.play": "audio fixtures",
}


@dataclass(frozen=True)
class LiveAudioFormat:
    """The WebSocket's audio both ways: ``pcm16`` at 16 or 24 kHz, or G.711 ``pcmu``/``pcma`` at 8 kHz."""

    kind: str = "pcm16"
    rate: int = 24000

    def describe(self) -> dict[str, Any]:
        return {"type": {"pcm16": "audio/pcm"}.get(self.kind, f"audio/{self.kind}"), "rate": self.rate}

    def ga(self) -> dict[str, Any]:
        """The realtime API's spelling (its G.711 formats carry no rate)."""
        return {"type": "audio/pcm", "rate": self.rate} if self.kind == "pcm16" else {"type": f"audio/{self.kind}"}


@dataclass(frozen=True)
class InitialMessage:
    role: Literal["developer", "user", "assistant"]
    text: str


@dataclass(frozen=True)
class StartConfig:
    """``session.start``'s session (or the WebRTC creation's): what is immutable once the session runs."""

    model: str
    instructions: str | None = None  # None: not set (the server's default)
    voice: str | None = None  # None: not set (OpenAI's default, marin)
    audio: LiveAudioFormat = field(default_factory=LiveAudioFormat)
    input: tuple[InitialMessage, ...] = ()
    delegation: DelegationKind | None = None
    delegation_raw: dict[str, Any] | None = None  # echoed back in the session snapshot
    store: bool = False
    safety_identifier: str | None = None

    @property
    def voice_name(self) -> str:
        return self.voice or DEFAULT_VOICE

    def describe(self, session_id: str, expires_at: int) -> dict[str, Any]:
        """The ``SessionResource`` snapshot of ``session.started``/``session.closed``."""
        snapshot: dict[str, Any] = {
            "id": session_id, "expires_at": expires_at, "model": self.model, "status": "active",
            "instructions": self.instructions, "store": self.store,
            "audio": {"format": self.audio.describe(), "output": {"voice": self.voice_name}},
            "delegation": self.delegation_raw,
            "input": [{"type": "message", "role": m.role, "content": [_part(m)]} for m in self.input] or None,
        }
        if self.safety_identifier is not None:
            snapshot["safety_identifier"] = self.safety_identifier
        return snapshot


def _part(message: InitialMessage) -> dict[str, str]:
    return {"type": "output_text" if message.role == "assistant" else "input_text", "text": message.text}


@dataclass(frozen=True)
class Start:
    config: StartConfig
    event_id: str | None = None


@dataclass(frozen=True)
class AppendAudio:
    audio: str  # base64, in the session's format
    event_id: str | None = None


@dataclass(frozen=True)
class Mute:
    muted: bool
    event_id: str | None = None


@dataclass(frozen=True)
class AppendContext:
    kind: ContextKind
    content: str
    delegation_id: str | None = None
    event_id: str | None = None


@dataclass(frozen=True)
class Update:
    delegation: dict[str, Any] | None
    has_triggers: bool
    event_id: str | None = None


@dataclass(frozen=True)
class Close:
    event_id: str | None = None


@dataclass(frozen=True)
class Unsupported:
    kind: str
    feature: str
    event_id: str | None = None


Command = Start | AppendAudio | Mute | AppendContext | Update | Close | Unsupported
KNOWN = (*EVENTS, *UNSUPPORTED)


def parse_command(raw: str | bytes) -> Command:
    event = json_event(raw)
    kind, eid = event["type"], event_id(event)
    if kind in UNSUPPORTED:
        return Unsupported(kind, UNSUPPORTED[kind], eid)
    if kind not in EVENTS:
        raise EventError("unknown_event_type", f"unknown event type {quoted(kind)} (known: {', '.join(KNOWN)})",
                         "type", eid)
    faults = mistyped(event, {**_COMMON, **EVENTS[kind]})
    if faults:
        raise EventError("invalid_type", faults[0].message, faults[0].param, eid)
    return _command(kind, event, eid)


def _command(kind: str, event: dict[str, Any], eid: str | None) -> Command:
    if kind == "session.start":
        session = event.get("session")
        if not isinstance(session, dict):
            raise EventError("missing_required_parameter", "session.start needs 'session' (an object)", "session",
                             eid)
        return Start(start_config(session, "session"), eid)
    if kind == "session.input_audio.append":
        audio = event.get("audio")
        if not isinstance(audio, str):
            raise EventError("missing_required_parameter", f"{kind} needs 'audio' (base64)", "audio", eid)
        return AppendAudio(audio, eid)
    if kind in ("session.input_audio.mute", "session.input_audio.unmute"):
        return Mute(kind.endswith(".mute"), eid)
    if kind == "session.update":
        session = event.get("session")
        if not isinstance(session, dict):
            raise EventError("missing_required_parameter", "session.update needs 'session' (an object)", "session",
                             eid)
        return Update(session.get("delegation"), "triggers" in session, eid)
    if kind == "session.close":
        return Close(eid)
    return _context(kind, event, eid)


def _context(kind: str, event: dict[str, Any], eid: str | None) -> AppendContext:
    content = event.get("content")
    if not isinstance(content, str) or not content.strip():
        raise EventError("missing_required_parameter", f"{kind} needs 'content' (a non-empty string)", "content",
                         eid)
    which: ContextKind = kind.split(".")[1]  # type: ignore[assignment] - one of EVENTS' three appends
    return AppendContext(which, content, event.get("delegation_id"), eid)


def start_config(session: dict[str, Any], param: str) -> StartConfig:
    """A ``session.start`` (or WebRTC creation) session object, checked; each fault an EventError naming it."""
    faults = mistyped(session, SESSION, (param,))
    if faults:
        raise EventError("invalid_type", faults[0].message, faults[0].param)
    model = session.get("model")
    if not isinstance(model, str) or not model:
        raise EventError("missing_required_parameter", "the session needs 'model'", f"{param}.model")
    audio = session.get("audio") or {}
    voice = (audio.get("output") or {}).get("voice")
    if isinstance(voice, dict):  # a custom voice: its id names it
        voice = voice.get("id")
        if not isinstance(voice, str) or not voice:
            raise EventError("invalid_value", "a custom voice needs its 'id'", f"{param}.audio.output.voice.id")
    delegation = session.get("delegation")
    return StartConfig(
        model=model, instructions=session.get("instructions") or None,
        voice=voice,
        audio=_format(audio.get("format"), f"{param}.audio.format"),
        input=_messages(session.get("input") or [], f"{param}.input"),
        delegation=_delegation_kind(delegation, f"{param}.delegation"),
        delegation_raw=delegation, store=bool(session.get("store") or False),
        safety_identifier=session.get("safety_identifier"))


def _format(value: dict[str, Any] | None, param: str) -> LiveAudioFormat:
    if value is None:
        return LiveAudioFormat()
    kind = {"audio/pcm": "pcm16", "audio/pcmu": "pcmu", "audio/pcma": "pcma"}.get(value.get("type", "audio/pcm"))
    if kind is None:
        raise EventError("invalid_value", f"{param}.type must be audio/pcm, audio/pcmu or audio/pcma",
                         f"{param}.type")
    rate = value.get("rate", 24000 if kind == "pcm16" else 8000)
    allowed = (16000, 24000) if kind == "pcm16" else (8000,)
    if rate not in allowed:
        raise EventError("invalid_value", f"{param}.rate must be one of {', '.join(map(str, allowed))} for "
                         f"{value.get('type', 'audio/pcm')}", f"{param}.rate")
    return LiveAudioFormat(kind, rate)


def _messages(items: list[dict[str, Any]], param: str) -> tuple[InitialMessage, ...]:
    if len(items) > MAX_INPUT_ITEMS:
        raise EventError("invalid_value", f"at most {MAX_INPUT_ITEMS} startup messages; got {len(items)}", param)
    messages = []
    for i, item in enumerate(items):
        role, content = (item or {}).get("role"), (item or {}).get("content") or []
        if role not in ("developer", "user", "assistant"):
            raise EventError("invalid_value", "a startup message's role is developer, user or assistant",
                             f"{param}[{i}].role")
        if len(content) != 1 or not isinstance((content[0] or {}).get("text"), str):
            raise EventError("invalid_value", "a startup message has exactly one text part", f"{param}[{i}].content")
        messages.append(InitialMessage(role, content[0]["text"]))
    return tuple(messages)


def _delegation_kind(value: dict[str, Any] | None, param: str) -> DelegationKind | None:
    if value is None:
        return None
    kind = value.get("type")
    if kind not in ("client", "responses", "decisions"):
        raise EventError("invalid_value", "delegation.type is client, responses or decisions", f"{param}.type")
    return kind
