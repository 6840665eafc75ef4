"""The error a realtime client event can raise: the session answers it with an ``error`` event and reads on."""

from __future__ import annotations

from typing import Any


class EventError(ValueError):
    """A client event the session cannot act on; becomes an ``error`` server event. ``error_type`` is
    ``server_error`` when the event was fine but the server cannot take it now (overloaded)."""

    def __init__(self, code: str, message: str, param: str | None = None, event_id: str | None = None,
                 error_type: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.code, self.param, self.event_id, self.error_type = code, param, event_id, error_type


def event_id(event: dict[str, Any]) -> str | None:
    value = event.get("event_id")
    return value if isinstance(value, str) else None
