"""The server's memory of earlier responses, for ``previous_response_id`` and ``GET``/``DELETE``.

Bounded three ways: at most ``--max-stored-responses`` entries and ``--max-stored-response-bytes`` in all (the
least recently used go first), each for ``--stored-response-ttl`` seconds after it was last used. Entries hold their
conversation's input items as sent (inline audio and images included; unknown fields dropped as read), so each is
charged its request body's size, a little per item, and its output's text: what it keeps, counted. It lives in the
server's process: a restart forgets it, and replicas behind a load balancer do not share it. A request with
``store: false`` is never kept.

A response belongs to the API key that made it (as OpenAI's belong to a project): read, continued or deleted with
another key it is the same 404 as an id never stored, so a key learns nothing of another's responses.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

from omnistage.entrypoints.openai.common.errors import APIError, quoted
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
    owner: str = ""  # the digest of the API key that made it ("" on a server without keys)
    request_bytes: int = 0  # what its request brought in (see ``stored_size``)

    @cached_property
    def size(self) -> int:
        """Bytes charged against the store's bound: the request's, then each output item and its text."""
        output = sum(ITEM_BYTES + len(getattr(item, "arguments", "")) + sum(len(part.text) for part in
                     getattr(item, "content", ())) for item in self.response.output)
        return self.request_bytes + output

    def history(self) -> list[InputItem]:
        """What a response continuing this one starts from: the conversation, then this answer as input items."""
        return [*self.conversation, *(_as_input(item) for item in self.response.output)]


ITEM_BYTES = 1024  # an item's objects, beyond its strings


def stored_size(body_bytes: int, items: int) -> int:
    """What a request's body and its ``items`` new input items will hold once stored (their strings are no larger
    in memory than in the JSON they came in)."""
    return body_bytes + ITEM_BYTES * items


def _as_input(item: object) -> InputItem:
    if isinstance(item, FunctionCallOut):
        return FunctionCallItem(type="function_call", call_id=item.call_id, name=item.name, arguments=item.arguments,
                                id=item.id)
    text = "".join(part.text for part in item.content)  # type: ignore[attr-defined]
    return MessageItem(type="message", role="assistant", content=[OutputTextIn(type="output_text", text=text)])


def not_found(response_id: str, param: str | None = None) -> APIError:
    return APIError(404, f"Response with id {quoted(response_id)} not found.", param=param, code="response_not_found")


class ResponseStore:
    def __init__(self, max_entries: int, ttl_s: float, max_bytes: float = float("inf"),
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.ttl_s = ttl_s
        self.clock = clock
        self.bytes = 0  # the entries' sizes together
        self._entries: OrderedDict[str, tuple[float, StoredResponse]] = OrderedDict()

    def put(self, entry: StoredResponse) -> None:
        """Keeps ``entry``, dropping the least recently used until both bounds hold (an entry larger than the byte
        bound alone is kept alone: it was within --max-request-bytes)."""
        self._pop(entry.response.id)
        self._entries[entry.response.id] = (self.clock(), entry)
        self.bytes += entry.size
        while len(self._entries) > self.max_entries or (self.bytes > self.max_bytes and len(self._entries) > 1):
            self._pop(next(iter(self._entries)))

    def get(self, response_id: str, owner: str = "", param: str | None = None) -> StoredResponse:
        """``owner``'s entry, refreshed as recently used; a 404 naming ``param`` when unknown, expired, deleted or
        another key's."""
        self._expire()
        found = self._entries.get(response_id)
        if found is None or found[1].owner != owner:
            raise not_found(response_id, param)
        self._entries[response_id] = (self.clock(), found[1])
        self._entries.move_to_end(response_id)
        return found[1]

    def delete(self, response_id: str, owner: str = "") -> None:
        self.get(response_id, owner)
        self._pop(response_id)

    def __len__(self) -> int:
        return len(self._entries)

    def _pop(self, response_id: str) -> None:
        found = self._entries.pop(response_id, None)
        if found is not None:
            self.bytes -= found[1].size

    def _expire(self) -> None:
        """Oldest-used first, so the scan stops at the first entry still alive."""
        cutoff = self.clock() - self.ttl_s
        while self._entries:
            response_id, (used, _) = next(iter(self._entries.items()))
            if used >= cutoff:
                return
            self._pop(response_id)
