"""What OpenAI's clients accept from a realtime server, as their own code decides it.

Three readers: the ``openai`` SDK's GA server-event union and its beta union (each a
pydantic ``TypeAdapter`` discriminated on ``type``, as the SDK's own parser and
openai-agents build it), and openai-agents' ``OpenAIRealtimeWebSocketModel``, fed each
event through its real handler (``_handle_ws_event``: its rewrites of message items,
its ``previous_item_id`` and voice normalisation, then the strict union), with a
listener catching the ``error``/``exception`` events it emits for an event it cannot read.
"""

from __future__ import annotations

from typing import Annotated, Any

import pydantic
from agents.realtime.model_events import RealtimeModelErrorEvent, RealtimeModelEvent, RealtimeModelExceptionEvent
from agents.realtime.openai_realtime import OpenAIRealtimeWebSocketModel, get_server_event_type_adapter
from openai.types.beta.realtime import RealtimeServerEvent as BetaServerEvent
from openai.types.realtime import RealtimeServerEvent as GAServerEvent

GA = pydantic.TypeAdapter(Annotated[GAServerEvent, pydantic.Field(discriminator="type")])
BETA = pydantic.TypeAdapter(Annotated[BetaServerEvent, pydantic.Field(discriminator="type")])


def sdk_problems(events: list[dict[str, Any]], beta: bool = False) -> list[str]:
    """Each event the SDK's union refuses, with pydantic's reason."""
    return refused(events, BETA if beta else GA)


def refused(events: list[dict[str, Any]], adapter: pydantic.TypeAdapter[Any]) -> list[str]:
    """Each event ``adapter`` (a union of server events) refuses, with pydantic's reason."""
    problems = []
    for event in events:
        try:
            adapter.validate_python(event)
        except pydantic.ValidationError as exc:
            problems.append(f"{event['type']}: {exc.errors()[:3]}")
    return problems


class _Sink:
    """The model's socket: what it would send back (a truncate on barge-in) goes nowhere."""

    async def send(self, payload: str) -> None:
        pass


class _Errors:
    def __init__(self) -> None:
        self.seen: list[str] = []

    async def on_event(self, event: RealtimeModelEvent) -> None:
        if isinstance(event, RealtimeModelErrorEvent):
            self.seen.append(f"error: {event.error}")
        elif isinstance(event, RealtimeModelExceptionEvent):
            self.seen.append(f"{event.context}: {event.exception!r}")


async def agents_problems(events: list[dict[str, Any]]) -> list[str]:
    """What openai-agents' realtime model reports while it reads ``events`` in order (a GA session's)."""
    model = OpenAIRealtimeWebSocketModel()
    listener = _Errors()
    model.add_listener(listener)
    model._websocket = _Sink()  # type: ignore[assignment]  # noqa: SLF001
    for event in events:
        if event["type"] == "error":  # the model forwards a server's error as its own error event, by design
            try:
                get_server_event_type_adapter().validate_python(event)
            except pydantic.ValidationError as exc:
                listener.seen.append(f"error: {exc.errors()[:3]}")
            continue
        before = len(listener.seen)
        await model._handle_ws_event(event)  # noqa: SLF001 - the parser the agents SDK runs on every event
        listener.seen[before:] = [f"{event['type']}: {p}" for p in listener.seen[before:]]
    return listener.seen
