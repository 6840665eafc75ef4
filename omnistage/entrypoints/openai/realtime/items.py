"""Conversation items of a realtime session: what a client may create and what the server reports.

An item is a message (system, user or assistant: text and/or audio; a user's may
hold images too, ``input_image`` parts with base64 ``data:`` URLs, for models with
vision), a
``function_call`` (the model's call: name and JSON arguments) or a
``function_call_output`` (the client's result for a ``call_id``). Client item
ids are kept; a missing one is made. Audio is held at 16 kHz (what the audio
encoder takes); an assistant's audio is not kept, only its transcript and its
length (for ``conversation.item.truncate``).
"""

from __future__ import annotations

import base64
import binascii
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from omnistage.entrypoints.openai.common.decode_pool import CancelToken, DecodePool
from omnistage.entrypoints.openai.common.errors import MediaError, quoted
from omnistage.entrypoints.openai.realtime.audio_formats import InputFormat
from omnistage.entrypoints.openai.realtime.event_error import EventError
from omnistage.entrypoints.openai.realtime.protocol import new_id
from omnistage.processing.listened_audio import ListenedAudio

if TYPE_CHECKING:
    from PIL import Image

    from omnistage.entrypoints.openai.realtime.budget import SessionMeter
    from omnistage.entrypoints.openai.server_config import ServerLimits

ROLES = ("system", "user", "assistant")
MAX_ID_CHARS = 64
ITEM_BYTES = 512  # an item's objects, beyond its audio and strings


@dataclass
class Item:
    id: str
    type: str  # "message", "function_call", "function_call_output"
    role: str = ""  # messages only
    text: str = ""  # message text (an assistant's: its transcript)
    audio: np.ndarray | None = None  # a user's audio at 16 kHz
    audio_ms: int = 0  # an assistant's spoken audio (what truncate may cut)
    spoken: bool = False  # an assistant message that carried audio (its content is output_audio)
    call_id: str = ""
    name: str = ""
    arguments: str = ""
    output: str = ""
    status: str = "completed"
    transcript: str | None = None  # a user audio turn's transcript, once made
    listened: ListenedAudio | None = None  # its audio with the features frozen while it was spoken (listening.py)
    images: tuple[Image.Image, ...] = ()  # a user's images (RGB), before its audio and text in the prompt

    @property
    def nbytes(self) -> int:
        """What the item holds: its audio, the features frozen while it was spoken, its strings (as Python stores
        them), and its objects."""
        audio = 0 if self.audio is None else self.audio.nbytes
        audio += sum(3 * image.width * image.height for image in self.images)
        if self.listened is not None:
            audio += self.listened.head.element_size() * self.listened.head.nelement()
        strings = (self.id, self.text, self.call_id, self.name, self.arguments, self.output)
        return ITEM_BYTES + audio + sum(sys.getsizeof(s) for s in strings)

    def describe(self) -> dict[str, Any]:
        """The item as GA server events carry it (``beta.to_beta`` renames its content types for beta clients)."""
        base: dict[str, Any] = {"id": self.id, "object": "realtime.item", "type": self.type, "status": self.status}
        if self.type == "function_call":
            return {**base, "call_id": self.call_id, "name": self.name, "arguments": self.arguments}
        if self.type == "function_call_output":
            return {**base, "call_id": self.call_id, "output": self.output}
        return {**base, "role": self.role, "content": self._content()}

    def _content(self) -> list[dict[str, Any]]:
        if self.role == "assistant":
            if self.spoken:
                return [{"type": "output_audio", "transcript": self.text}]
            return [{"type": "output_text", "text": self.text}]
        parts: list[dict[str, Any]] = [{"type": "input_image", "detail": "auto"} for _ in self.images]
        if self.audio is not None:
            parts.append({"type": "input_audio", "transcript": self.transcript})
        if self.text or (self.audio is None and not self.images):
            parts.append({"type": "input_text", "text": self.text})
        return parts


def _id(item: dict[str, Any], prefix: str) -> str:
    given = item.get("id")
    if given is None:
        return new_id(prefix)
    if not isinstance(given, str) or not given or len(given) > MAX_ID_CHARS:
        raise EventError("invalid_value", f"item.id must be a string of 1 to {MAX_ID_CHARS} characters", "item.id")
    return given


def _string(item: dict[str, Any], key: str, required: bool = True) -> str:
    value = item.get(key, None if required else "")
    if not isinstance(value, str):
        raise EventError("invalid_value", f"item.{key} must be a string", f"item.{key}")
    return value


def _audio_part(part: dict[str, Any]) -> str:
    data = part.get("audio")
    if not isinstance(data, str):
        raise EventError("invalid_value", "an input_audio part needs 'audio' (base64, the session's input format)",
                         "item.content")
    return data


def _image_part(part: dict[str, Any]) -> str:
    url = part.get("image_url")
    header, sep, payload = url.partition(",") if isinstance(url, str) else ("", "", "")
    if not sep or not header.startswith("data:image/") or not header.endswith(";base64"):
        raise EventError("invalid_value", "an input_image part needs 'image_url' as a data:image/...;base64,... URL",
                         "item.content")
    return payload


def _message(item: dict[str, Any], fmt: InputFormat, max_seconds: float) -> ParsedItem:
    role = item.get("role")
    if role not in ROLES:
        raise EventError("invalid_value", f"a message item's role must be one of {', '.join(ROLES)}", "item.role")
    content = item.get("content")
    if not isinstance(content, list):
        raise EventError("invalid_value", "a message item needs a list of content parts", "item.content")
    texts: list[str] = []
    audios: list[str] = []
    images: list[str] = []
    spoken = False
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("input_text", "text", "output_text"):
            texts.append(_string(part, "text"))
        elif kind in ("output_audio", "audio") and role == "assistant":
            texts.append(_string(part, "transcript", required=False) or "")
            spoken = True
        elif kind == "input_audio" and role == "user":
            audios.append(_audio_part(part))
        elif kind == "input_image" and role == "user":
            images.append(_image_part(part))
        else:
            raise EventError("invalid_value", f"a {role} message cannot hold a {quoted(kind)} part", "item.content")
    # Bounded from the base64's length, before a byte is decoded.
    if fmt.seconds(sum(len(a) for a in audios) * 3 // 4) > max_seconds + 1e-3:
        raise EventError("input_audio_buffer_too_long", f"the item's audio is longer than {max_seconds:g} s",
                         "item.content")
    return ParsedItem(Item(_id(item, "item"), "message", role=role, text="".join(texts), spoken=spoken),
                      tuple(audios), tuple(images))


@dataclass(frozen=True)
class ParsedItem:
    """A client's item, checked; its audio (base64 parts in the session's input format) not yet decoded."""

    item: Item
    audio: tuple[str, ...] = ()
    images: tuple[str, ...] = ()  # base64 (each a data: URL's payload)

    @property
    def audio_chars(self) -> int:
        return sum(len(a) for a in self.audio) + sum(len(i) for i in self.images)

    def decode(self, fmt: InputFormat, limits: ServerLimits, token: CancelToken) -> Item:
        """The item with its audio decoded and resampled to 16 kHz, its images decoded (``limits``: their bytes and
        pixels); a ``DecodePool`` job: 600 s of G.711 took 0.4 s, which on the event loop stalled every session and
        request."""
        from omnistage.entrypoints.openai.media.loaders import decode_base64, decode_image

        try:
            self.item.images = tuple(decode_image(decode_base64(data, limits), limits) for data in self.images)
        except MediaError as exc:
            raise EventError(exc.code, str(exc), "item.content") from exc
        pieces = []
        for data in self.audio:
            token.check()
            try:
                raw = base64.b64decode(data, validate=True)
            except (binascii.Error, ValueError) as exc:
                raise EventError("invalid_audio", "'audio' is not valid base64", "item.content") from exc
            pieces.append(fmt.decode(raw))
        if pieces:
            self.item.audio = fmt.to_16k(np.concatenate(pieces))
        return self.item


async def decoded(parsed: list[ParsedItem], fmt: InputFormat, pool: DecodePool,
                  limits: ServerLimits) -> tuple[Item, ...]:
    """The items, their audio and images decoded in ``pool`` (those without either as they are)."""
    if any(len(p.images) > limits.max_media_items for p in parsed):
        raise EventError("too_many_media_items", f"an item holds more than {limits.max_media_items} images "
                         "(--max-media-items)", "item.content")
    chars = sum(p.audio_chars for p in parsed)
    if not chars:
        return tuple(p.item for p in parsed)
    return await pool.run_sized(chars, _decode_all, parsed, fmt, limits)


def _decode_all(parsed: list[ParsedItem], fmt: InputFormat, limits: ServerLimits,
                token: CancelToken) -> tuple[Item, ...]:
    return tuple(p.decode(fmt, limits, token) for p in parsed)


def parse_item(item: object, fmt: InputFormat, max_seconds: float) -> ParsedItem:
    """``conversation.item.create``'s ``item``, checked (its audio's length from its base64, ``max_seconds`` at
    most) but not decoded (``decoded``); ``EventError`` names what is wrong."""
    if not isinstance(item, dict):
        raise EventError("invalid_event", "conversation.item.create needs an 'item' object", "item")
    kind = item.get("type", "message")
    if kind == "message":
        return _message(item, fmt, max_seconds)
    if kind == "function_call":
        return ParsedItem(Item(_id(item, "item"), kind, call_id=_string(item, "call_id"), name=_string(item, "name"),
                               arguments=_string(item, "arguments", required=False) or "{}"))
    if kind == "function_call_output":
        return ParsedItem(Item(_id(item, "item"), kind, call_id=_string(item, "call_id"),
                               output=_string(item, "output")))
    raise EventError("invalid_value", f"unknown item type {quoted(kind)} (message, function_call, "
                     "function_call_output)", "item.type")


@dataclass
class Conversation:
    """The session's items in order; ids are unique. With a ``meter`` each item is charged to the server's
    realtime budget (``budget.py``) while it is kept."""

    items: list[Item] = field(default_factory=list)
    max_audio_samples: int | None = None  # user audio kept across turns, at 16 kHz (None: unbounded)
    evicted: list[str] = field(default_factory=list)  # ids dropped by that bound, until reported
    meter: SessionMeter | None = None
    charged: dict[str, int] = field(default_factory=dict)  # what each kept item was charged

    def find(self, item_id: str) -> Item | None:
        return next((i for i in self.items if i.id == item_id), None)

    def add(self, item: Item, previous_item_id: str | None = None, own: bool = False) -> str | None:
        """Inserts ``item`` after ``previous_item_id`` (None: at the end; "root": first); returns the id before it.
        ``own``: the server's reply, charged but never refused."""
        if self.find(item.id) is not None:
            raise EventError("item_already_exists", f"an item with id {item.id!r} already exists", "item.id")
        if previous_item_id is None:
            at = len(self.items)
        elif previous_item_id == "root":
            at = 0
        else:
            before = self.find(previous_item_id)
            if before is None:
                raise EventError("item_not_found", f"no item {quoted(previous_item_id)} to insert after",
                                 "previous_item_id")
            at = self.items.index(before) + 1
        self.items.insert(at, item)
        previous = self.items[at - 1].id if at else None
        try:
            self._bound_audio(item, own)
        except EventError:
            self.items.remove(item)
            raise
        return previous

    def with_item(self, item: Item) -> Conversation:
        """A copy with ``item`` added at the end, as ``add`` would leave it (older audio evicted past the bound): the
        conversation a speculative reply answers before its item is committed."""
        copy = Conversation(list(self.items), self.max_audio_samples)
        copy.add(item)
        return copy

    def _bound_audio(self, newest: Item, own: bool = False) -> None:
        """Drops the oldest audio items (never ``newest``) until the kept audio fits ``max_audio_samples`` and
        ``newest`` fits the server's budget (a session that commits without ever responding would otherwise grow
        without end), then charges ``newest``: an error naming the bound if it still does not fit."""
        limit = self.max_audio_samples if self.max_audio_samples is not None else float("inf")
        cost = newest.nbytes if self.meter is not None else 0
        kept = sum(len(i.audio) for i in self.items if i.audio is not None)
        for old in [i for i in self.items if i.audio is not None and i is not newest]:
            if kept <= limit and (self.meter is None or own or self.meter.fits(cost, 1)):
                break
            kept -= len(old.audio) if old.audio is not None else 0
            self._remove(old)
            self.evicted.append(old.id)
        if self.meter is not None:
            self.meter.charge(cost, 1, "item", force=own)
            self.charged[newest.id] = cost

    def delete(self, item_id: str) -> None:
        item = self.find(item_id)
        if item is None:
            raise EventError("item_not_found", f"no item {quoted(item_id)}", "item_id")
        self._remove(item)

    def drop(self, items: tuple[Item, ...]) -> None:
        """Removes ``items`` (the oldest, which the session's truncation dropped to fit the context)."""
        gone = {item.id for item in items}
        for item in [item for item in self.items if item.id in gone]:
            self._remove(item)

    def _remove(self, item: Item) -> None:
        self.items.remove(item)
        cost = self.charged.pop(item.id, None)
        if cost is not None and self.meter is not None:
            self.meter.refund(cost, 1)

    def truncate(self, item_id: str, audio_end_ms: int) -> Item:
        """Cuts an assistant message at what was played: its transcript kept in proportion to the audio heard, at a
        word boundary (the text is not aligned to the audio word by word)."""
        item = self.find(item_id)
        if item is None or item.type != "message" or item.role != "assistant":
            raise EventError("item_not_found", f"no assistant message {quoted(item_id)}", "item_id")
        if not isinstance(audio_end_ms, int) or isinstance(audio_end_ms, bool) or audio_end_ms < 0:
            raise EventError("invalid_value", "audio_end_ms must be a non-negative integer", "audio_end_ms")
        if audio_end_ms > item.audio_ms:
            raise EventError("invalid_value", f"audio_end_ms={audio_end_ms} is past the item's {item.audio_ms} ms "
                             "of audio", "audio_end_ms")
        if item.audio_ms:
            keep = int(len(item.text) * audio_end_ms / item.audio_ms)
            cut = item.text[:keep]
            if keep < len(item.text) and " " in cut:
                cut = cut[:cut.rindex(" ")]
            item.text, item.audio_ms, item.status = cut, audio_end_ms, "incomplete"
        return item
