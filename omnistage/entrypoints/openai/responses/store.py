"""The server's memory of earlier responses, for ``previous_response_id`` and ``GET``/``DELETE``.

Bounded both ways: at most ``--max-stored-responses`` entries (the least recently used goes first) and each for
``--stored-response-ttl`` seconds after it was last used. It lives in the server's process: a restart forgets it,
and replicas behind a load balancer do not share it. A request with ``store: false`` is never kept. Entries hold
their conversation's input items as sent (inline audio and images included), which is why the bound is a count
the operator sets.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from omnistage.entrypoints.openai.common.errors import APIError
from omnistage.entrypoints.openai.responses.protocol import (
    FunctionCallItem,
    FunctionCallOut,
    InputItem,
    MessageItem,
    OutputTextIn,
    ResponseObject,
)


@dataclass(frozen=True)
class StoredResponse:
    """A finished response and the conversation it answered (earlier turns and its own input; not its
    instructions, which a later response does not inherit)."""

    response: ResponseObject
    conversation: tuple[InputItem, ...]

    def history(self) -> list[InputItem]:
        """What a response continuing this one starts from: the conversation, then this answer as input items."""
        return [*self.conversation, *(_as_input(item) for item in self.response.output)]


def _as_input(item: object) -> InputItem:
    if isinstance(item, FunctionCallOut):
        return FunctionCallItem(type="function_call", call_id=item.call_id, name=item.name, arguments=item.arguments,
                                id=item.id)
    text = "".join(part.text for part in item.content)  # type: ignore[attr-defined]
    return MessageItem(type="message", role="assistant", content=[OutputTextIn(type="output_text", text=text)])


def not_found(response_id: str, param: str | None = None) -> APIError:
    return APIError(404, f"Response with id '{response_id}' not found.", param=param, code="response_not_found")


class ResponseStore:
    def __init__(self, max_entries: int, ttl_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_entries = max_entries
        self.ttl_s = ttl_s
        self.clock = clock
        self._entries: OrderedDict[str, tuple[float, StoredResponse]] = OrderedDict()

    def put(self, entry: StoredResponse) -> None:
        self._entries[entry.response.id] = (self.clock(), entry)
        self._entries.move_to_end(entry.response.id)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    def get(self, response_id: str, param: str | None = None) -> StoredResponse:
        """The entry, refreshed as recently used; a 404 naming ``param`` when unknown, expired or deleted."""
        self._expire()
        found = self._entries.get(response_id)
        if found is None:
            raise not_found(response_id, param)
        self._entries[response_id] = (self.clock(), found[1])
        self._entries.move_to_end(response_id)
        return found[1]

    def delete(self, response_id: str) -> None:
        self._expire()
        if self._entries.pop(response_id, None) is None:
            raise not_found(response_id)

    def __len__(self) -> int:
        return len(self._entries)

    def _expire(self) -> None:
        """Oldest-used first, so the scan stops at the first entry still alive."""
        cutoff = self.clock() - self.ttl_s
        while self._entries:
            used, _ = next(iter(self._entries.values()))
            if used >= cutoff:
                return
            self._entries.popitem(last=False)
