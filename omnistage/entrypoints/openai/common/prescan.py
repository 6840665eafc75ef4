"""A JSON body's cost, counted from its raw bytes before FastAPI parses it into a single object.

``BudgetedRoute`` reads the body once, checks it is valid text (no lone surrogate escape), then runs its
path's prescan: msgspec reads the body into a few loose structs (lists of raw slices first, so a million
empty messages cost ~0.1 s and no lasting memory, where validating them took 40 s and 1.6 GB) and a
``Tally`` counts messages (or input items), content parts, text characters (tool-call arguments and tool
results included), media parts, tool calls and tool definitions (a responses body's metadata against OpenAI's
bounds too, and what a stored response keeps: ids, names, tool definitions). Each count has its flag; a breach is
a 400 naming it. JSON nested deeper than msgspec reads is a 400 too. A message msgspec cannot read this way is
charged its raw size as text and left for pydantic to name what is wrong with it.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import msgspec
from fastapi import Request, Response
from fastapi.routing import APIRoute
from starlette.requests import ClientDisconnect

from omnistage.entrypoints.openai.common.errors import APIError
from omnistage.entrypoints.openai.common.json_text import LONE_SURROGATE, lone_surrogate
from omnistage.entrypoints.openai.common.metadata import json_fault, metadata_fault
from omnistage.entrypoints.openai.common.request_budget import over_budget
from omnistage.entrypoints.openai.server_config import ServerLimits

MEDIA_PART_TYPES = frozenset({"input_audio", "image_url", "audio_url", "video_url"})
RESPONSES_MEDIA_TYPES = frozenset({"input_audio", "input_image", "input_file"})


class _Part(msgspec.Struct, gc=False):
    type: Any = None
    text: Any = None
    refusal: Any = None


class _Function(msgspec.Struct, gc=False):
    arguments: Any = None


class _ToolCall(msgspec.Struct, gc=False):
    function: _Function | None = None


class _Chat(msgspec.Struct, gc=False):
    messages: list[msgspec.Raw] | None = None
    tools: list[msgspec.Raw] | None = None


class _Message(msgspec.Struct, gc=False):
    # Raw slices: counted before any part or call is read, so a million of them costs one pass, not a million reads.
    content: str | list[msgspec.Raw] | None = None
    tool_calls: list[msgspec.Raw] | None = None


class _Responses(msgspec.Struct, gc=False):
    input: str | list[msgspec.Raw] | None = None
    instructions: Any = None
    tools: list[msgspec.Raw] | None = None
    metadata: msgspec.Raw = msgspec.field(default_factory=lambda: msgspec.Raw(b"null"))  # read once its size fits


class _Item(msgspec.Struct, gc=False):
    type: Any = None
    content: str | list[msgspec.Raw] | None = None
    output: str | list[msgspec.Raw] | None = None
    arguments: Any = None
    # Kept with a stored response: counted as its text is.
    id: Any = None
    call_id: Any = None
    name: Any = None


_CHAT, _MESSAGE = msgspec.json.Decoder(_Chat), msgspec.json.Decoder(_Message)
_RESPONSES, _ITEM = msgspec.json.Decoder(_Responses), msgspec.json.Decoder(_Item)
_PART, _TOOL_CALL = msgspec.json.Decoder(_Part), msgspec.json.Decoder(_ToolCall)
_METADATA = msgspec.json.Decoder(dict[str, str] | None)


def _read(decoder: msgspec.json.Decoder, raw: msgspec.Raw) -> Any:  # noqa: ANN401 - the decoder's struct
    """One part or call, or None when it is not the object expected (pydantic names what is wrong with it)."""
    try:
        return decoder.decode(raw)
    except msgspec.DecodeError:
        return None


def _text_len(value: object) -> int:
    return len(value) if isinstance(value, str) else 0


@dataclass
class Tally:
    """What one body holds, counted as it is read; ``check`` raises the first breach."""

    limits: ServerLimits
    media_types: frozenset[str]
    chars: int = 0
    text: str = "characters of text (tool-call arguments included)"  # what ``chars`` counts, as its error says
    parts: int = 0
    media: int = 0
    tool_calls: int = 0

    def content(self, value: str | list[msgspec.Raw] | None, param: str) -> None:
        if isinstance(value, str):
            self.chars += len(value)
            return
        self.parts += len(value or ())
        self.check(param)  # past the parts limit already: not one part read
        for raw in value or ():
            part = _read(_PART, raw)
            if part is None:
                self.chars += len(raw)
                continue
            self.chars += _text_len(part.text) + _text_len(part.refusal)
            self.media += isinstance(part.type, str) and part.type in self.media_types  # a list type is unhashable

    def calls(self, value: list[msgspec.Raw] | None, param: str) -> None:
        self.tool_calls += len(value or ())
        self.check(param)
        for raw in value or ():
            call = _read(_TOOL_CALL, raw)
            self.chars += len(raw) if call is None else _text_len(call.function.arguments) if call.function else 0

    def check(self, param: str) -> None:
        limits, where = self.limits, "the messages" if param == "messages" else "the input"
        for name, count, what, code in (
                ("max_content_parts", self.parts, "content parts", "too_many_content_parts"),
                ("max_tool_calls", self.tool_calls, "tool calls", "too_many_tool_calls"),
                ("max_text_chars", self.chars, self.text, "input_too_long"),
                ("max_media_items", self.media, "media items", "too_many_media_items")):
            if count > getattr(limits, name):
                raise over_budget(name, f"{where} hold {count} {what}; the limit is {getattr(limits, name)}",
                                  param, code)


def _count(items: list[msgspec.Raw], tools: list[msgspec.Raw] | None, limits: ServerLimits, param: str) -> None:
    what = "messages" if param == "messages" else "input items"
    if len(items) > limits.max_messages:
        raise over_budget("max_messages", f"the request has {len(items)} {what}; the limit is {limits.max_messages}",
                          param, "too_many_messages")
    if tools is not None and len(tools) > limits.max_tools:
        raise over_budget("max_tools", f"the request defines {len(tools)} tools; the limit is {limits.max_tools}",
                          "tools", "too_many_tools")


def prescan_chat(body: bytes, limits: ServerLimits) -> None:
    """A chat body's messages, parts, text, media, tool calls and tools, from its raw bytes."""
    try:
        scan = _CHAT.decode(body)
    except msgspec.DecodeError:  # not JSON, or messages is not a list: pydantic says what is wrong
        return
    messages = scan.messages or []
    _count(messages, scan.tools, limits, "messages")
    tally = Tally(limits, MEDIA_PART_TYPES)
    for raw in messages:
        try:
            message = _MESSAGE.decode(raw)
        except msgspec.DecodeError:  # pydantic refuses it; meanwhile it costs what it weighs
            tally.chars += len(raw)
            continue
        tally.content(message.content, "messages")
        tally.calls(message.tool_calls, "messages")
    tally.check("messages")


def prescan_responses(body: bytes, limits: ServerLimits) -> None:
    """A ``/v1/responses`` body's metadata (OpenAI's bounds), input items (against ``--max-messages``), parts, text,
    media, calls and tools. What a stored response keeps is counted: its items' ids, call ids and names as text,
    and its tool definitions at their JSON size."""
    try:
        scan = _RESPONSES.decode(body)
    except msgspec.DecodeError:  # pydantic says what is wrong
        return
    _check_metadata(scan.metadata)
    items = [] if scan.input is None or isinstance(scan.input, str) else scan.input
    _count(items, scan.tools, limits, "input")
    tools = sum(len(raw) for raw in scan.tools or ())
    tally = Tally(limits, RESPONSES_MEDIA_TYPES, chars=_text_len(scan.input) + _text_len(scan.instructions) + tools,
                  text="characters of text (tool calls and tool definitions included)")
    for raw in items:
        try:
            item = _ITEM.decode(raw)
        except msgspec.DecodeError:
            tally.chars += len(raw)
            continue
        tally.chars += sum(_text_len(v) for v in (item.arguments, item.id, item.call_id, item.name))
        tally.tool_calls += item.type == "function_call"
        tally.content(item.content, "input")
        tally.content(item.output, "input")
    tally.check("input")


def _check_metadata(raw: msgspec.Raw) -> None:
    """OpenAI's metadata bounds (``common/metadata.py``): too long to fit them is refused unread."""
    fault = json_fault(len(raw))
    if fault is None:
        try:
            fault = metadata_fault(_METADATA.decode(raw))
        except msgspec.DecodeError:  # not an object of strings: pydantic says what is wrong
            return
    if fault is not None:
        raise APIError(400, fault, param="metadata", code="invalid_metadata")


PRESCANS: dict[str, Callable[[bytes, ServerLimits], None]] = {"/v1/chat/completions": prescan_chat,
                                                              "/v1/responses": prescan_responses}


def check_json_text(body: bytes) -> None:
    """A JSON body holds valid text: no lone surrogate escape (``common/json_text.py``)."""
    if lone_surrogate(body):
        raise APIError(400, LONE_SURROGATE, code="invalid_json")


LARGE_BODY = 1 << 20  # bytes: a body past this is checked and parsed in the decode pool


def read_body(body: bytes, prescan: Callable[[bytes, ServerLimits], None] | None, limits: ServerLimits) -> None:
    """A JSON body's text check and its route's prescan."""
    check_json_text(body)
    try:
        if prescan is not None:
            prescan(body, limits)
    except RecursionError:  # msgspec's depth limit: Python's json would fail the same way
        raise APIError(400, "the JSON is nested too deep to read", code="invalid_json") from None


def _read_large_body(body: bytes, prescan: Callable[[bytes, ServerLimits], None] | None, limits: ServerLimits,
                     token: object) -> object:
    """``read_body``, then the body's JSON (msgspec: ~10x faster than ``json.loads`` on large strings, which holds
    the GIL, and so the event loop, for its whole call)."""
    read_body(body, prescan, limits)
    try:
        return msgspec.json.decode(body)
    except RecursionError:
        raise APIError(400, "the JSON is nested too deep to read", code="invalid_json") from None
    except msgspec.DecodeError as exc:
        raise APIError(400, f"the body is not valid JSON: {exc}", code="invalid_json") from None


class BudgetedRoute(APIRoute):
    """Checks a JSON body's text, then runs the route's prescan on the raw body, before FastAPI parses and validates
    it (the body is read once: Starlette keeps it on the request for FastAPI's own read)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        prescan = PRESCANS.get(self.path)

        async def budgeted(request: Request) -> Response:
            kind = request.headers.get("content-type", "")
            if prescan is not None or "json" in kind or (not kind and request.method in ("POST", "PUT", "PATCH")):
                try:
                    body = await request.body()  # FastAPI reads a body without a content type as JSON too
                except ClientDisconnect:  # cut by the connection guard (a trickle), or its client left
                    # Answered, not raised: uvicorn logged each as a traceback, formatted on the event loop
                    # (100 trickled bodies cut at once stalled it 0.4 s); no one reads this answer.
                    return APIError(400, "the request body did not arrive in full", code="incomplete_body").response()
                limits = request.app.state.limits
                if len(body) <= LARGE_BODY:
                    read_body(body, prescan, limits)
                else:  # ~0.5 s of parsing per 60 MB on the event loop: in the pool, and read once
                    # Starlette keeps request.json()'s result in ``_json``; FastAPI's own read then reuses it.
                    request._json = await request.app.state.pool.run_sized(len(body), _read_large_body, body, prescan,
                                                                             limits)
            return await handler(request)

        return budgeted
