"""The beta Realtime protocol's spellings of the server events (openai 1.x ``beta.realtime`` clients).

A session speaks beta when its WebSocket was opened with ``OpenAI-Beta: realtime=v1``
(what the 1.x SDK sends) or when its first ``session.update`` uses the beta shape
(``modalities``/``input_audio_format``/``turn_detection`` at the top level). The
session builds GA events and, for a beta session, each passes through here:
renamed, content part types in their beta names, and the events beta has no
counterpart for (``conversation.item.done``) dropped.
"""

from __future__ import annotations

from typing import Any

RENAMED = {
    "response.output_text.delta": "response.text.delta", "response.output_text.done": "response.text.done",
    "response.output_audio.delta": "response.audio.delta", "response.output_audio.done": "response.audio.done",
    "response.output_audio_transcript.delta": "response.audio_transcript.delta",
    "response.output_audio_transcript.done": "response.audio_transcript.done",
    "conversation.item.added": "conversation.item.created",
}
DROPPED = frozenset({"conversation.item.done"})
PART_TYPES = {"output_text": "text", "output_audio": "audio"}
BETA_SESSION_KEYS = frozenset({"modalities", "voice", "input_audio_format", "output_audio_format", "turn_detection",
                               "input_audio_transcription", "max_response_output_tokens"})


def wants_beta(headers: dict[str, str]) -> bool:
    return "realtime=v1" in headers.get("openai-beta", "").replace(" ", "").lower()


def beta_shaped(session: Any) -> bool:  # noqa: ANN401 - client JSON
    """A ``session.update`` written for the beta protocol (and none of the GA-only keys)."""
    return isinstance(session, dict) and bool(BETA_SESSION_KEYS & session.keys()) and "audio" not in session \
        and "output_modalities" not in session and session.get("type") != "realtime"


def to_beta(event: dict[str, Any]) -> dict[str, Any] | None:
    kind = event["type"]
    if kind in DROPPED:
        return None
    event = {**event, "type": RENAMED.get(kind, kind)}
    part = event.get("part")
    if isinstance(part, dict) and part.get("type") in PART_TYPES:
        event["part"] = {**part, "type": PART_TYPES[part["type"]]}
    response = event.get("response")
    if isinstance(response, dict) and "output_modalities" in response:
        event["response"] = {**response, "modalities": response["output_modalities"]}
    return event
