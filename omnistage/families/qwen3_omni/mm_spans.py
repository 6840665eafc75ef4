"""A thinker prompt's multimodal items as the engine's prefix-cache keys (:class:`MultimodalSpan`).

The items are placed and hashed by :mod:`omnistage.models.qwen3_omni.mm_spans`; a
prompt whose placeholders and items do not pair up exactly gets None: it is never shared.
"""

from __future__ import annotations

from collections.abc import Sequence

from omnistage.engine.request import MultimodalSpan
from omnistage.models.media_items import item_digest
from omnistage.models.qwen3_omni.inputs import MultimodalInputs
from omnistage.models.qwen3_omni.mm_spans import placed_items
from omnistage.models.qwen3_omni.mrope import MRopeTokens


def multimodal_spans(token_ids: Sequence[int], mm: MultimodalInputs,
                     tokens: MRopeTokens) -> tuple[MultimodalSpan, ...] | None:
    """The prompt's items in position order, or None when they do not exactly fill its placeholders."""
    placed = placed_items(token_ids, mm, tokens)
    if placed is None:
        return None
    spans = [MultimodalSpan(rows[0], rows[-1] + 1, item_digest(tag, content)) for tag, rows, content in placed]
    return tuple(sorted(spans, key=lambda s: s.start))
