"""The JSON type of every field a realtime client event may carry, checked before the event is acted on.

OpenAI answers a field of the wrong type (``"temperature": "hot"``, ``"audio": {"input": 5}``) with an
``invalid_type`` error naming it; without this check the session's lenient readers would skip such a field
silently (a ``session.audio`` that is not an object), or coerce it (``true`` read as the number 1). A spec is a
leaf (``"str"``, ``"int|str"``: the JSON kinds allowed), an object (``dict``: the spec of each known key, ``"*"``
for every key), an array (``[spec]``: each element's) or alternatives (``tuple``: whichever has the value's kind).
``null`` is always allowed: the session reads it as "unset". Keys not listed are left to the readers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Union

Spec = Union[str, dict[str, "Spec"], list["Spec"], tuple["Spec", ...]]  # noqa: UP007 - a recursive alias

_NAMES = {"str": "a string", "int": "an integer", "num": "a number", "bool": "a boolean", "arr": "an array",
          "obj": "an object"}
VOICE: Spec = ("str", {"id": "str"})
FORMAT: Spec = ("str", {"type": "str", "rate": "num"})
TOOL: Spec = {"type": "str", "name": "str", "description": "str", "parameters": "obj"}
TOOL_CHOICE: Spec = ("str", {"type": "str", "name": "str", "function": {"name": "str"}})
TURN_DETECTION: Spec = {"type": "str", "threshold": "num", "prefix_padding_ms": "num", "silence_duration_ms": "num",
                        "create_response": "bool", "interrupt_response": "bool", "eagerness": "str",
                        "idle_timeout_ms": "num"}
TRANSCRIPTION: Spec = {"model": "str", "language": "str", "prompt": "str"}
PART: Spec = {"type": "str", "text": "str", "audio": "str", "transcript": "str", "image_url": "str"}
ITEM: Spec = {"id": "str", "type": "str", "object": "str", "role": "str", "status": "str", "call_id": "str",
              "name": "str", "arguments": "str", "output": "str", "content": [PART]}
SESSION: Spec = {
    "type": "str", "model": "str", "instructions": "str", "voice": VOICE, "output_modalities": ["str"],
    "modalities": ["str"], "max_output_tokens": "int|str", "max_response_output_tokens": "int|str",
    "temperature": "num", "tools": [TOOL], "tool_choice": TOOL_CHOICE, "include": ["str"],
    "truncation": ("str", {"type": "str", "retention_ratio": "num", "token_limits": {"post_instructions": "num"}}),
    "input_audio_format": FORMAT, "output_audio_format": FORMAT, "input_audio_transcription": TRANSCRIPTION,
    "turn_detection": TURN_DETECTION, "streaming_input": "bool", "speculative_reply_ms": "int",
    "audio": {"input": {"format": FORMAT, "transcription": TRANSCRIPTION, "turn_detection": TURN_DETECTION,
                        "noise_reduction": "obj"},
              "output": {"format": FORMAT, "voice": VOICE, "speed": "num"}},
}
RESPONSE: Spec = {
    "output_modalities": ["str"], "modalities": ["str"], "instructions": "str", "voice": VOICE,
    "max_output_tokens": "int|str", "max_response_output_tokens": "int|str", "temperature": "num",
    "conversation": "str", "metadata": {"*": "str"}, "tools": [TOOL], "tool_choice": TOOL_CHOICE, "input": [ITEM],
    "output_audio_format": FORMAT, "audio": {"output": {"format": FORMAT, "voice": VOICE}},
}
# session.update's ``session`` is checked field by field where it is applied (``SESSION``): a bad field fails
# alone there, while the others take effect.
EVENTS: dict[str, dict[str, Spec]] = {
    "session.update": {"session": "obj", "model": "str"},
    "input_audio_buffer.append": {"audio": "str"},
    "input_audio_buffer.commit": {"final": "bool"},
    "conversation.item.create": {"previous_item_id": "str", "item": ITEM},
    "conversation.item.retrieve": {"item_id": "str"},
    "conversation.item.truncate": {"item_id": "str", "content_index": "int", "audio_end_ms": "num"},
    "conversation.item.delete": {"item_id": "str"},
    "response.create": {"response": RESPONSE},
    "response.cancel": {"response_id": "str"},
}
COMMON: dict[str, Spec] = {"type": "str", "event_id": "str"}


@dataclass(frozen=True)
class Mistyped:
    """One field of the wrong JSON kind: where (keys and indices), what was expected, what came."""

    path: tuple[str | int, ...]
    expected: str
    got: str

    @property
    def param(self) -> str:
        return "".join(f"[{k}]" if isinstance(k, int) else f".{k}" for k in self.path).lstrip(".")

    @property
    def message(self) -> str:
        return f"Invalid type for '{self.param}': expected {self.expected}, but got {_NAMES[self.got]} instead."


def kind(value: Any) -> str:  # noqa: ANN401 - client JSON
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    return {float: "num", str: "str", list: "arr", dict: "obj"}.get(type(value), "null")


def _top(spec: Spec) -> str:
    return "obj" if isinstance(spec, dict) else "arr" if isinstance(spec, list) else str(spec)


def _accepts(kinds: str, got: str) -> bool:
    allowed = kinds.split("|")
    return got in allowed or (got == "int" and "num" in allowed)


def _expected(kinds: str) -> str:
    return " or ".join(_NAMES[k] for k in kinds.split("|"))


def mistyped(value: Any, spec: Spec, path: tuple[str | int, ...] = ()) -> list[Mistyped]:  # noqa: ANN401
    """Each place in ``value`` whose JSON kind ``spec`` does not allow."""
    got = kind(value)
    if got == "null":
        return []
    if isinstance(spec, tuple):
        match = next((s for s in spec if _accepts(_top(s), got)), None)
        if match is None:
            return [Mistyped(path, " or ".join(_expected(_top(s)) for s in spec), got)]
        spec = match
    if isinstance(spec, str):
        return [] if _accepts(spec, got) else [Mistyped(path, _expected(spec), got)]
    if isinstance(spec, list):
        if got != "arr":
            return [Mistyped(path, "an array", got)]
        return [bad for i, element in enumerate(value) for bad in mistyped(element, spec[0], (*path, i))]
    if got != "obj":
        return [Mistyped(path, "an object", got)]
    found = []
    for key, child in value.items():
        child_spec = spec.get(key, spec.get("*"))
        if child_spec is not None:
            found += mistyped(child, child_spec, (*path, key))
    return found


def without(value: dict[str, Any], faults: list[Mistyped], depth: int = 0) -> dict[str, Any]:
    """``value`` (the object at ``depth`` of each fault's path) less its mistyped fields; a fault inside an array
    drops the whole array (the rest of it would mean something else)."""
    out = dict(value)
    for key in {f.path[depth] for f in faults}:
        inner = [f for f in faults if f.path[depth] == key]
        deeper = [f for f in inner if len(f.path) > depth + 1 and isinstance(f.path[depth + 1], str)]
        if len(deeper) == len(inner) and isinstance(out.get(key), dict):
            out[key] = without(out[key], deeper, depth + 1)
        else:
            out.pop(key, None)
    return out
