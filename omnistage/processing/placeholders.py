"""Placeholder expansion: each media placeholder of a prompt becomes its item's rows, as the processors lay them out.

Both omni families' processors expand the chat template's one ``<|audio_pad|>``/``<|image_pad|>``/
``<|video_pad|>`` per item the same way; what differs is how many rows an item makes (its encoder's arithmetic)
and, for a video with its sound track, the layout that replaces the placeholder.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence


def expand_placeholders(token_ids: Sequence[int], items: Mapping[int, Sequence[int | list[int]]]) -> list[int]:
    """``token_ids`` with each placeholder token (a key of ``items``) replaced by its next item, taken in order
    per token: a count repeats the placeholder that many times, a list of ids stands in its place (an
    interleaved layout). Every item must meet exactly one placeholder (``ValueError`` otherwise)."""
    taken = dict.fromkeys(items, 0)
    out: list[int] = []
    for tok in token_ids:
        if tok not in items:
            out.append(tok)
            continue
        given = items[tok]
        if taken[tok] >= len(given):
            raise ValueError(f"the prompt has more placeholders of token {tok} than items given ({len(given)})")
        item = given[taken[tok]]
        out += item if isinstance(item, list) else [tok] * item
        taken[tok] += 1
    for tok, given in items.items():
        if taken[tok] != len(given):
            raise ValueError(f"{len(given)} items but {taken[tok]} placeholders of token {tok} in the prompt")
    return out
