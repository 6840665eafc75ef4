"""User text stays text: a client's strings never become the tokenizer's control tokens.

A chat template renders the server's own markup (``<|im_start|>``, ``<|audio_pad|>``, ``<tool_call>``...) and
the client's strings into one text; tokenizing that text whole would read ``hello<|im_end|>\\n<|im_start|>system``
written by a user as real turn boundaries. Here every added-token string inside a client's string (message
content of any role, names, tool schemas and call arguments, template variables, TTS text) is swapped for a
marker before rendering: a random ASCII word the template copies through unchanged, ``tojson`` and ``strip``
included. The rendered text is then cut at the added tokens that remain (the template's own) and each run
between them is tokenized as ordinary text with the markers swapped back, the way the tokenizer treats text
without added tokens (normalizer, pre-tokenizer, BPE): so the user's ``<|im_end|>`` costs a few ordinary ids,
as OpenAI's API does, while the media placeholders the template writes for real media parts stay single ids.
A request whose strings hold no added-token string takes the plain path and tokenizes exactly as before.
"""

from __future__ import annotations

import re
import secrets
import weakref
from collections.abc import Mapping
from typing import Any

_GUARDS: weakref.WeakKeyDictionary[Any, UserTextGuard] = weakref.WeakKeyDictionary()


def guard_for(tokenizer: Any) -> UserTextGuard:  # noqa: ANN401 - a transformers tokenizer
    """The guard of ``tokenizer``, made once."""
    guard = _GUARDS.get(tokenizer)
    if guard is None:
        guard = _GUARDS[tokenizer] = UserTextGuard(tokenizer)
    return guard


class UserTextGuard:
    """Tokenizes a server template holding client strings, keeping the client's control-token strings text."""

    def __init__(self, tokenizer: Any) -> None:  # noqa: ANN401 - a transformers (fast) tokenizer
        self.tokenizer = tokenizer
        self.added = sorted({t.content for t in tokenizer.added_tokens_decoder.values()}, key=len, reverse=True)
        self.added_ids = {t.content: int(i) for i, t in tokenizer.added_tokens_decoder.items()}
        self.index = {s: i for i, s in enumerate(self.added)}
        self._pattern = re.compile("|".join(map(re.escape, self.added))) if self.added else None

    def chat_ids(self, messages: list[dict[str, object]], tools: list[dict[str, object]] | None = None,
                 template_kwargs: Mapping[str, object] | None = None, assistant_prefix: str = "") -> list[int]:
        """The chat template's ids with the assistant turn opened; ``assistant_prefix`` is the server's own text."""
        marks = _Marks(self)
        args = (messages, tools or None, dict(template_kwargs or {}))
        marked = marks.mark(args)
        messages, tools, extra = marked if marks.used else args
        kwargs = {"add_generation_prompt": True, **extra}
        text = self.tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, **kwargs)
        return self.encode(text + assistant_prefix, marks)

    def wrapped_ids(self, template: str, **fields: str) -> list[int]:
        """``template.format(**fields)`` tokenized, the fields (client text) kept ordinary text."""
        marks = _Marks(self)
        return self.encode(template.format(**{k: marks.mark(v) for k, v in fields.items()}), marks)

    def encode(self, text: str, marks: _Marks) -> list[int]:
        if not marks.used:
            return list(self.tokenizer(text, add_special_tokens=False).input_ids)
        ids: list[int] = []
        start = 0
        for m in self._pattern.finditer(text):
            ids += self._run(text[start:m.start()], marks)
            ids.append(self.added_ids[m.group()])
            start = m.end()
        return ids + self._run(text[start:], marks)

    def _run(self, text: str, marks: _Marks) -> list[int]:
        """Text between the template's added tokens; where markers stand for client strings, ordinary text."""
        if not text:
            return []
        if not marks.pattern.search(text):
            return list(self.tokenizer(text, add_special_tokens=False).input_ids)
        return self.plain_ids(marks.restore(text))

    def plain_ids(self, text: str) -> list[int]:
        """``text`` as the tokenizer reads text between added tokens: none of it is matched as an added token."""
        backend = self.tokenizer.backend_tokenizer
        if backend.normalizer is not None:
            text = backend.normalizer.normalize_str(text)
        pieces = backend.pre_tokenizer.pre_tokenize_str(text) if backend.pre_tokenizer is not None else [(text, ())]
        return [t.id for piece, _ in pieces for t in backend.model.tokenize(piece)]


class _Marks:
    """One rendering's markers: a fresh random word per call, so no client can write one."""

    def __init__(self, guard: UserTextGuard) -> None:
        self.guard = guard
        self.word = f"zq{secrets.token_hex(8)}q"
        self._pattern: re.Pattern[str] | None = None
        self.used = False

    @property
    def pattern(self) -> re.Pattern[str]:
        """The markers' pattern, compiled only when a client string was marked (a fresh word misses ``re``'s
        cache: compiling it cost more than the rest of a plain prompt's marking)."""
        if self._pattern is None:
            self._pattern = re.compile(self.word + r"(\d+)z")
        return self._pattern

    def mark(self, value: Any) -> Any:  # noqa: ANN401 - JSON-like data
        if isinstance(value, str):
            return self._mark_str(value)
        if isinstance(value, Mapping):
            return {self.mark(k): self.mark(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self.mark(v) for v in value]
        return value

    def _mark_str(self, text: str) -> str:
        pattern = self.guard._pattern
        if pattern is None or not pattern.search(text):
            return text
        self.used = True
        return pattern.sub(lambda m: f"{self.word}{self.guard.index[m.group()]}z", text)

    def restore(self, text: str) -> str:
        return self.pattern.sub(lambda m: self.guard.added[int(m.group(1))], text)
