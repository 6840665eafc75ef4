"""The beta Realtime protocol's spellings of the server events (openai 1.x ``beta.realtime`` clients).

A session speaks beta when its WebSocket was opened with ``OpenAI-Beta: realtime=v1``
(what the 1.x SDK sends) or when its first ``session.update`` uses the beta shape
(``modalities``/``input_audio_format``/``turn_detection`` at the top level). The
session builds GA events and, for a beta session, each passes through here:
renamed, an item's content types in their beta names (``audio``/``text`` for an
assistant's ``output_audio``/``output_text``) wherever an item is carried, and the
events beta has no counterpart for (``conversation.item.done``) dropped.
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


def _beta_item(item: Any) -> Any:  # noqa: ANN401 - an item as events carry it
    """An assistant message's ``output_audio``/``output_text`` parts are ``audio``/``text`` in beta."""
    if not isinstance(item, dict) or not isinstance(item.get("content"), list):
        return item
    return {**item, "content": [{**p, "type": PART_TYPES[p["type"]]} if p.get("type") in PART_TYPES else p
                                for p in item["content"]]}


def to_beta(event: dict[str, Any]) -> dict[str, Any] | None:
    kind = event["type"]
    if kind in DROPPED:
        return None
    event = {**event, "type": RENAMED.get(kind, kind)}
    if "item" in event:
        event["item"] = _beta_item(event["item"])
    response = event.get("response")
    if isinstance(response, dict):
        response = {**response, "output": [_beta_item(i) for i in response.get("output") or []]}
        if "output_modalities" in response:
            response["modalities"] = response["output_modalities"]
        event["response"] = response
    return event
