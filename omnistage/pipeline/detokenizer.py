"""Incremental detokenisation of the thinker's tokens, with stop strings.

Decoding token by token breaks multi-byte characters and merges, so each
delta decodes a short window of recent tokens with and without the new ones
and emits the difference, holding back text that ends in an incomplete
character (vLLM's prefix/read offsets). The window's start stays put for
``WINDOW`` tokens before it slides, so the decode without the new tokens is
most often the last delta's decode with them, kept: one decode per delta. A transformers fast tokenizer
is decoded through its Rust backend directly (what its ``decode`` calls, without
its per-call Python conversions, per token of every stream). Text that
could still become the start of a stop string is held back too, so a stop string
never reaches the caller; the text is cut where the first stop string begins.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

REPLACEMENT = "\ufffd"
WINDOW = 6  # tokens of left context re-decoded with each delta (enough for any merge)


class Tokenizer(Protocol):
    def decode(self, token_ids: list[int], skip_special_tokens: bool = ...) -> str: ...


@dataclass(frozen=True)
class TextDelta:
    text: str
    stopped: bool  # a stop string was found: the request's text ends here


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Tokenizer | None, stop: tuple[str, ...] = ()) -> None:
        self.tokenizer = tokenizer
        self.stop = tuple(s for s in stop if s)
        self.hold = max((len(s) for s in self.stop), default=1) - 1
        self.token_ids: list[int] = []
        self.text = ""  # everything decoded so far (stop strings not yet cut)
        self.emitted = 0  # characters of ``text`` already given to the caller
        self._prefix = 0
        self._read = 0
        self._read_text: str | None = None  # the decode of ids[_prefix:_read] when known
        self._decode = _decoder(tokenizer)

    def add(self, token_ids: list[int], final: bool = False) -> TextDelta:
        """Adds new tokens; returns the text that may be shown now (all of it when ``final``)."""
        self.token_ids.extend(token_ids)
        if self._decode is not None:
            self.text += self._decode_new(self._decode, final)
        stop_at = self._find_stop()
        if stop_at is not None:
            self.text = self.text[:stop_at]
            return TextDelta(self._emit(len(self.text)), stopped=True)
        safe = len(self.text) if final else len(self.text) - self.hold
        return TextDelta(self._emit(max(safe, self.emitted)), stopped=False)

    def _decode_new(self, decode: Callable[[list[int]], str], final: bool) -> str:
        ids = self.token_ids
        prefix_text = self._read_text if self._read_text is not None else decode(ids[self._prefix:self._read])
        full_text = decode(ids[self._prefix:])
        if len(full_text) <= len(prefix_text) or (full_text.endswith(REPLACEMENT) and not final):
            # An incomplete character (or nothing visible): wait for more tokens. Not after the last: whatever
            # text came before an incomplete end, and the end itself, would be lost.
            self._read_text = prefix_text  # the window is unchanged: so is its decode
            return ""
        if len(ids) - self._prefix > 2 * WINDOW:  # the window slides on: its next prefix is decoded anew
            self._prefix, self._read_text = max(len(ids) - WINDOW, self._read), None
        else:  # the window keeps its start: this decode is the next one's prefix (one decode per delta, not two)
            self._read_text = full_text
        self._read = len(ids)
        return full_text[len(prefix_text):]

    def _find_stop(self) -> int | None:
        if not self.stop:
            return None
        # A stop string may straddle the already-emitted boundary by at most ``hold`` characters.
        start = max(self.emitted - self.hold, 0)
        hits = [i for i in (self.text.find(s, start) for s in self.stop) if i >= 0]
        return min(hits) if hits else None

    def _emit(self, upto: int) -> str:
        delta = self.text[self.emitted:upto]
        self.emitted = upto
        return delta



def _decoder(tokenizer: Tokenizer | None) -> Callable[[list[int]], str] | None:
    """``tokenizer.decode`` without special tokens; through a fast tokenizer's Rust backend when that decodes the
    same (no clean-up of tokenization spaces)."""
    if tokenizer is None:
        return None
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and not getattr(tokenizer, "clean_up_tokenization_spaces", False):
        return functools.partial(backend.decode, skip_special_tokens=True)
    return functools.partial(tokenizer.decode, skip_special_tokens=True)
