"""Text that arrives in pieces (an LLM's deltas), tokenized as the whole text would be.

A byte-level BPE tokenizer (Qwen's) reads text as normalizer → pre-tokenizer pieces → BPE within each piece, and
no merge crosses a piece boundary. Text written later can change only the pieces at the end (a word grows, a run
of spaces splits before the next word, ``.`` takes the newlines after it, a combining mark recomposes the letter
before it), so :class:`StableTokens` releases the ids of every piece but the last (:data:`HELD_PIECES`) and keeps
it as text: the ids released over a stream, joined, are the whole text's ids. Each piece of text is read
about twice, so a stream costs about what tokenizing its text once does. Ordinary text only: no added token is
matched in it (``processing/user_text.py``: a client's ``<|im_end|>`` is text).
"""

from __future__ import annotations

from typing import Any

# Pieces held back. What follows can redraw only the last piece (grow it, or split a run of spaces before a word):
# the piece before it was matched from the same start and its match looked at most one character past its end,
# which is the last piece's first, already there.
HELD_PIECES = 1


class StableTokens:
    """One text stream's ids; ``add`` returns those no later text can change, ``finish`` the rest."""

    def __init__(self, tokenizer: Any, lead: str = "", lead_ids: int = 0) -> None:  # noqa: ANN401 - a fast tokenizer
        """``lead``: text in front of the stream in its run (a wrapper's), whose first ``lead_ids`` ids are not
        released (the stream's first piece may merge with it, as in the whole run)."""
        self._backend = tokenizer.backend_tokenizer
        self._pending = lead  # normalized text whose ids are not released yet
        self._drop = lead_ids

    def add(self, text: str) -> list[int]:
        pieces = self._pieces(self._pending + text)
        if len(pieces) <= HELD_PIECES:
            self._pending = self._normalized
            return []
        cut = pieces[-HELD_PIECES][1][0]
        self._pending = self._normalized[cut:]
        return self._release(pieces[:-HELD_PIECES])

    def finish(self) -> list[int]:
        ids = self._release(self._pieces(self._pending))
        self._pending = ""
        return ids

    def _release(self, pieces: list[tuple[str, tuple[int, int]]]) -> list[int]:
        ids = self._ids(pieces)
        drop = min(self._drop, len(ids))
        self._drop -= drop
        return ids[drop:]

    def _pieces(self, text: str) -> list[tuple[str, tuple[int, int]]]:
        normalizer, pre = self._backend.normalizer, self._backend.pre_tokenizer
        self._normalized = normalizer.normalize_str(text) if normalizer is not None else text
        if pre is None:
            return [(self._normalized, (0, len(self._normalized)))] if self._normalized else []
        return pre.pre_tokenize_str(self._normalized)

    def _ids(self, pieces: list[tuple[str, tuple[int, int]]]) -> list[int]:
        model = self._backend.model
        return [t.id for piece, _ in pieces for t in model.tokenize(piece)]
