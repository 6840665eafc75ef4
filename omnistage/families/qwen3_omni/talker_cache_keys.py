"""The talker's prefix-cache keys: every talker prompt row keyed by the thinker prompt prefix it was made from.

A talker prompt row is a function of the thinker's prompt up to one position: a user-turn text row of the
token there (its projected embedding); a multimodal row of the thinker's hidden state there, which depends on
the whole thinker prefix before it (assistant turns and earlier items included); the assistant head of the
whole prompt, the first reply token and the voice. So the rows are covered with spans
(:class:`MultimodalSpan`, the engine's "extra keys") whose digests identify the thinker prompt's ids and items
up to the span's end, and the talker request carries no ids of its own (its repetition penalty must not count
thinker ids). Two talker prompts then share a block exactly when the thinker prompts behind every row up to it
agree: turn N's talker prompt hits the blocks of turn N-1's user rows, and a realtime turn's prompt the blocks a
streaming-input prefill of the same turn cut at an encoder window computed.

The ids and the items are hashed apart and joined per span end, so a digest does not depend on how the prompt
was walked. A thinker prompt with a multimodal row outside every item (items that did not pair up with their
placeholders: the thinker never shares those either) gets no keys.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence

from omnistage.engine.request import MultimodalSpan


class _ThinkerPrefix:
    """Digests of the thinker prompt's prefixes, asked for at increasing ends."""

    def __init__(self, prompt_ids: Sequence[int], items: Sequence[MultimodalSpan]) -> None:
        self._ids, self._items = prompt_ids, items
        self._id_hash, self._item_hash = hashlib.sha256(), hashlib.sha256()
        self._at, self._next_item = 0, 0

    def digest(self, end: int) -> bytes:
        """The digest of positions ``[0, end)``: their ids and every item starting before ``end``."""
        if end < self._at:
            raise ValueError(f"prefix digests are asked for at increasing ends ({end} < {self._at})")
        self._id_hash.update(array("q", self._ids[self._at:end]).tobytes())
        self._at = end
        while self._next_item < len(self._items) and self._items[self._next_item].start < end:
            item = self._items[self._next_item]
            self._item_hash.update(item.start.to_bytes(8, "little") + item.end.to_bytes(8, "little"))
            self._item_hash.update(item.content_hash)
            self._next_item += 1
        joined = hashlib.sha256(end.to_bytes(8, "little"))
        joined.update(self._id_hash.copy().digest() + self._item_hash.copy().digest())
        return joined.digest()


def talker_row_keys(
    prompt_ids: Sequence[int], user_rows: Sequence[int], num_rows: int, items: Sequence[MultimodalSpan],
    multimodal: frozenset[int], head: Sequence[int],
) -> tuple[MultimodalSpan, ...] | None:
    """Spans over all ``num_rows`` talker rows: rows ``i < len(user_rows)`` come from thinker position
    ``user_rows[i]``, the rest (the assistant head) from the whole prompt and ``head`` (the first reply token, the
    speaker: whatever else they are made of). None when a multimodal position lies in no item."""
    items = sorted(items, key=lambda s: s.start)
    item_of = {p: i for i, item in enumerate(items) for p in range(item.start, item.end)}  # the last one wins
    if any(tok in multimodal and p not in item_of for p, tok in enumerate(prompt_ids)):
        return None
    prefix, spans, reach = _ThinkerPrefix(prompt_ids, items), [], 0
    for start, end, thinker_end in _groups(user_rows, items, item_of):
        reach = max(reach, thinker_end)  # interleaved items (audio in video) overlap: a longer prefix still keys
        spans.append(MultimodalSpan(start, end, prefix.digest(reach)))
    if num_rows > len(user_rows):
        tail = hashlib.sha256(b"head" + prefix.digest(len(prompt_ids)))
        tail.update(array("q", head).tobytes())
        spans.append(MultimodalSpan(len(user_rows), num_rows, tail.digest()))
    return tuple(spans)


def _groups(user_rows: Sequence[int], items: Sequence[MultimodalSpan],
            item_of: dict[int, int]) -> list[tuple[int, int, int]]:
    """Talker rows cut where their thinker positions stop being consecutive or cross an item's edge: ``(start,
    end, thinker end)``, the thinker end being the enclosing item's end for item rows (its digest is the whole
    item's) and one past the last position otherwise; ``item_of``: the item of each position inside one."""
    groups: list[tuple[int, int, int]] = []
    start = 0
    for row in range(1, len(user_rows) + 1):
        last = user_rows[row - 1]
        if row < len(user_rows) and user_rows[row] == last + 1 and item_of.get(user_rows[row]) == item_of.get(last):
            continue
        item = item_of.get(last)
        groups.append((start, row, items[item].end if item is not None else last + 1))
        start = row
    return groups
